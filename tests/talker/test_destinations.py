#!/usr/bin/env python3
"""The talker command line's destinations carry exactly its frames, and SIGINT is a barge-in.

On the tiny CustomVoice talker (seed fixed, so the same frames every run): the frames written
with --out are the reference, and --loop upstream writes the same; --rtp to a udpsrc ! rtpqwencodesdepay pipeline in this process
delivers the same frames, the first packet marked; --server to a stand-in for the media
server's /codes (websockets) gets them as binary messages then {"type":"end"}, and with
transport=rtp as RTP to the port it names with end on the WebSocket (with srtp=1 too, as SRTP of
the key the stand-in gives, which a receiver of that key decrypts); a SIGINT during a long
run sends {"type":"cancel"} after the frames it counts, and none after: the first frames of the
same run uninterrupted, fewer than it makes.

    python tests/talker/test_destinations.py FIXTURE_ROOT   (holds custom_voice/)

with the python of the venv that tools/setup-packages.sh pip-installs the package into, whose
qwencodec-talker command it runs (tools/check-talker.sh).
"""

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import qwencodec_talker
from qwencodec_talker.pipeline import load_plugin
from websockets.sync.server import serve
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from installed import installed  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TEXT = "Hello there, a test of where the frames go."
FRAME_BYTES = 32
LONG = 400  # --max-new-tokens of the run that SIGINT interrupts


installed(qwencodec_talker, script="tools/check-talker.sh")


def talker(model, *args, max_frames=40, **popen):
    command = [str(Path(sys.executable).parent / "qwencodec-talker"), "--model", str(model), "--text", TEXT,
               "--speaker", "vivian", "--seed", "1", "--max-new-tokens", str(max_frames), *args]
    return subprocess.Popen(command, stderr=subprocess.PIPE, **popen)


def finished(process, what):
    _, stderr = process.communicate(timeout=120)
    stderr = stderr.decode()
    if process.returncode != 0:
        raise AssertionError(f"{what}: exit {process.returncode}\n{stderr}")
    return stderr


class RtpReceiver:
    """udpsrc ! rtpqwencodesdepay ! appsink on a free port: the frames, and which were marked;
    with `srtp_key`, udpsrc ! srtpdec ! ... of that key (AES_CM_128_HMAC_SHA1_80)."""

    def __init__(self, srtp_key=None):
        Gst = self.Gst = load_plugin()
        kind, srtpdec = ("srtp", "srtpdec name=srtp ! ") if srtp_key is not None else ("rtp", "")
        self.pipeline = Gst.parse_launch(
            f"udpsrc name=net address=127.0.0.1 port=0 caps=\"application/x-{kind},media=audio,"
            "clock-rate=24000,encoding-name=X-QWEN3-TTS-CODES,payload=96,version=(string)1,"
            "codebooks=(string)16,codebook-size=(string)2048,samples-per-frame=(string)1920\" "
            f"! {srtpdec}rtpqwencodesdepay ! appsink name=out sync=false")
        if srtp_key is not None:
            keys = Gst.Caps.from_string(
                f"application/x-srtp,srtp-key=(buffer){srtp_key.hex()},srtp-cipher=aes-128-icm,"
                "srtp-auth=hmac-sha1-80,srtcp-cipher=aes-128-icm,srtcp-auth=hmac-sha1-80")
            self.pipeline.get_by_name("srtp").connect("request-key", lambda _element, _ssrc: keys)
        self.pipeline.set_state(Gst.State.PLAYING)
        self.pipeline.get_state(5 * Gst.SECOND)
        self.port = self.pipeline.get_by_name("net").get_property("port")
        if self.port == 0:
            self.port = self.pipeline.get_by_name("net").get_property("used-socket").get_local_address().get_port()
        self.sink = self.pipeline.get_by_name("out")

    def frames(self, expected, within_s=10):
        """(bytes of the frames, indices of the frames whose buffer was marked)."""
        data, marked = b"", []
        deadline = time.monotonic() + within_s
        while len(data) < expected * FRAME_BYTES and time.monotonic() < deadline:
            sample = self.sink.try_pull_sample(100 * self.Gst.MSECOND)
            if sample is None:
                continue
            buffer = sample.get_buffer()
            if buffer.has_flags(self.Gst.BufferFlags.RESYNC):
                marked.append(len(data) // FRAME_BYTES)
            data += buffer.extract_dup(0, buffer.get_size())
        return data, marked

    def close(self):
        self.pipeline.set_state(self.Gst.State.NULL)


class CodesServer:
    """A stand-in for qwencodec-server's /codes: records what a sender sends, and with
    transport=rtp first names `rtp_port`."""

    def __init__(self, rtp_port=None, srtp_key=None):
        self.messages = []
        self.headers = None
        self.rtp_port = rtp_port
        self.srtp_key = srtp_key
        self.closed = threading.Event()
        self.server = serve(self.handle, "127.0.0.1", 0)
        self.port = self.server.socket.getsockname()[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def handle(self, connection):
        self.headers = connection.request.headers
        self.path = connection.request.path
        if "transport=rtp" in self.path:
            offer = {"type": "rtp", "port": self.rtp_port, "sdp": ""}
            if "srtp=1" in self.path:
                offer["srtp"] = {"suite": "AES_CM_128_HMAC_SHA1_80", "key": base64.b64encode(self.srtp_key).decode()}
            connection.send(json.dumps(offer))
        try:
            for message in connection:
                self.messages.append(message)
        finally:
            self.closed.set()

    def binary(self):
        return b"".join(m for m in self.messages if isinstance(m, bytes))

    def texts(self):
        return [json.loads(m)["type"] for m in self.messages if isinstance(m, str)]

    def close(self):
        self.server.shutdown()


def main():
    model = Path(sys.argv[1]) / "custom_voice"
    failures = []

    def check(what, ok, detail=""):
        print(f"{'ok' if ok else 'FAILED'}: {what}{' ' + detail if detail else ''}")
        if not ok:
            failures.append(what)

    # The reference: the run's frames as raw codes.
    reference = talker(model, "--out", "-", stdout=subprocess.PIPE)
    codes, _ = reference.communicate(timeout=120)
    check("--out - exits 0", reference.returncode == 0)
    frames = len(codes) // FRAME_BYTES
    check("--out - wrote whole frames", len(codes) == frames * FRAME_BYTES and frames >= 5, f"({len(codes)} bytes)")

    # Upstream's generate, the same seed: the same frames.
    upstream = talker(model, "--out", "-", "--loop", "upstream", stdout=subprocess.PIPE)
    data, _ = upstream.communicate(timeout=120)
    check("--loop upstream writes the frames of the default loop", data == codes,
          f"({len(data) // FRAME_BYTES} of {frames} frames)")

    # RTP to a host and port.
    receiver = RtpReceiver()
    stderr = finished(talker(model, "--rtp", f"127.0.0.1:{receiver.port}"), "--rtp")
    data, marked = receiver.frames(frames)
    check("--rtp delivers the frames of --out", data == codes, f"({len(data) // FRAME_BYTES} of {frames} frames)")
    check("--rtp marks the utterance's first packet alone", marked == [0], f"(marked {marked})")
    check("--rtp reports its frames", f"sent {frames} frames" in stderr, stderr.strip().splitlines()[-1])

    # The media server's /codes: binary messages, the token, then end.
    server = CodesServer()
    url = f"ws://127.0.0.1:{server.port}/codes?session=s1"
    finished(talker(model, "--server", url, "--token", "secret"), "--server")
    server.closed.wait(10)
    check("--server sends the frames of --out, a message each",
          server.binary() == codes and len([m for m in server.messages if isinstance(m, bytes)]) == frames)
    check("--server ends with end", server.texts() == ["end"], f"({server.texts()})")
    check("--server sends the bearer token", server.headers.get("Authorization") == "Bearer secret")
    server.close()

    # transport=rtp: the frames as RTP to the port the server names, end on the WebSocket.
    receiver2 = RtpReceiver()
    server = CodesServer(rtp_port=receiver2.port)
    url = f"ws://127.0.0.1:{server.port}/codes?session=s1&transport=rtp"
    finished(talker(model, "--server", url, "--token", "secret"), "--server transport=rtp")
    data, marked = receiver2.frames(frames)
    server.closed.wait(10)
    check("transport=rtp delivers the frames of --out over RTP", data == codes and marked == [0])
    check("transport=rtp sends no frames in messages, and end", server.binary() == b"" and server.texts() == ["end"],
          f"({server.texts()})")
    server.close()

    # srtp=1: SRTP of the key the server gives; a receiver of that key gets the frames.
    key = os.urandom(30)
    receiver3 = RtpReceiver(srtp_key=key)
    server = CodesServer(rtp_port=receiver3.port, srtp_key=key)
    url = f"ws://127.0.0.1:{server.port}/codes?session=s1&transport=rtp&srtp=1"
    finished(talker(model, "--server", url, "--token", "secret"), "--server transport=rtp&srtp=1")
    data, marked = receiver3.frames(frames)
    server.closed.wait(10)
    check("srtp=1 delivers the frames of --out as SRTP of the server's key", data == codes and marked == [0],
          f"({len(data) // FRAME_BYTES} of {frames} frames)")
    server.close()
    receiver.close()
    receiver2.close()
    receiver3.close()

    # SIGINT during a long run: cancel after the frames counted, nothing after it. The same run
    # uninterrupted is the reference: the interrupted one sends a part of it, and stops short.
    uninterrupted = talker(model, "--out", "-", max_frames=LONG, stdout=subprocess.PIPE)
    whole, _ = uninterrupted.communicate(timeout=300)
    whole = [whole[i:i + FRAME_BYTES] for i in range(0, len(whole), FRAME_BYTES)]
    check("the long run, uninterrupted, makes enough frames to interrupt", len(whole) >= 30,
          f"({len(whole)} frames)")
    server = CodesServer()
    url = f"ws://127.0.0.1:{server.port}/codes?session=s1"
    long = talker(model, "--server", url, "--token", "secret", max_frames=LONG)
    deadline = time.monotonic() + 60
    while len(server.messages) < 8 and time.monotonic() < deadline:
        time.sleep(0.02)
    sent_at_signal = len(server.messages)
    long.send_signal(signal.SIGINT)
    stderr = finished(long, "--server after SIGINT")
    server.closed.wait(10)
    binary = [m for m in server.messages if isinstance(m, bytes)]
    check("SIGINT: the run says how many frames it sent", f"cancelled after {len(binary)} frames" in stderr,
          stderr.strip().splitlines()[-1])
    check("SIGINT: cancel is the last message, after the frames", server.texts() == ["cancel"]
          and isinstance(server.messages[-1], str), f"({server.texts()})")
    check("SIGINT: at most 2 frames after the signal", len(binary) - sent_at_signal <= 2,
          f"({sent_at_signal} before it, {len(binary)} in all)")
    check("SIGINT: the frames sent are the uninterrupted run's first ones, and fewer",
          binary == whole[:len(binary)] and len(binary) < len(whole),
          f"({len(binary)} of {len(whole)})")
    server.close()

    print(f"talker destinations: {frames} frames; {'FAILED ' + ', '.join(failures) if failures else 'all ok'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
