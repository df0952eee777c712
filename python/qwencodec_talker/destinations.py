"""Where the command line's frames go: raw codes to a file or standard output, the media
server's `/codes` WebSocket (its frames in messages, or as RTP to the port it names), or RTP
to a host and port. Each takes `send(frame)`, then `end()` (the utterance is complete) or
`cancel()` (barge-in: what was sent and not yet heard is dropped where the receiver can), then
`close()`.
"""

import json
import struct
import time
from urllib.parse import parse_qs, urlsplit

CODEBOOKS = 16
# Five times the server's RTP jitter-buffer latency (docs/streaming-server.md, codes over RTP).
RTP_SETTLE_S = 0.2


def pack(frame):
    return struct.pack(f"<{CODEBOOKS}h", *frame)


class RawCodes:
    """S16LE codes, frame-major, flushed frame by frame (for fdsrc ! ... ! qwencodecdec)."""

    def __init__(self, file):
        self.file = file

    def send(self, frame):
        self.file.write(pack(frame))
        self.file.flush()

    def end(self):
        pass

    def cancel(self):
        pass

    def close(self):
        self.file.close()


class Rtp:
    """appsrc ! rtpqwencodespay ! udpsink, through GStreamer's Python bindings: the payloader
    marks the utterance's first packet; `end` drains it (the next run's frames start a new
    utterance)."""

    def __init__(self, host, port, frame_rate=(25, 2), plugin_dir=None):
        from .speech import load_plugin

        Gst = self.Gst = load_plugin(plugin_dir)
        num, den = frame_rate
        self.frame_ns = den * Gst.SECOND // num
        self.pipeline = Gst.parse_launch(
            f"appsrc name=codes format=time caps=audio/x-qwen3-tts-codes,codebooks={CODEBOOKS},"
            f"framerate={num}/{den} ! rtpqwencodespay ! udpsink name=net sync=false")
        self.pipeline.get_by_name("net").set_property("host", host)
        self.pipeline.get_by_name("net").set_property("port", int(port))
        self.appsrc = self.pipeline.get_by_name("codes")
        self.bus = self.pipeline.get_bus()
        if self.pipeline.set_state(Gst.State.PLAYING) == Gst.StateChangeReturn.FAILURE:
            raise RuntimeError(self._error() or "the RTP pipeline does not start")
        self.frames = 0

    def _error(self):
        message = self.bus.pop_filtered(self.Gst.MessageType.ERROR)
        if message is None:
            return None
        error, debug = message.parse_error()
        return f"{message.src.get_name()}: {error.message} ({debug})"

    def send(self, frame):
        buffer = self.Gst.Buffer.new_wrapped(pack(frame))
        buffer.pts = self.frames * self.frame_ns
        buffer.duration = self.frame_ns
        self.frames += 1
        if self.appsrc.emit("push-buffer", buffer) != self.Gst.FlowReturn.OK:
            raise RuntimeError(self._error() or "the RTP pipeline took no more frames")

    def end(self):
        # EOS sends what the payloader holds and waits until the last packet is out.
        self.appsrc.emit("end-of-stream")
        self.bus.timed_pop_filtered(5 * self.Gst.SECOND,
                                    self.Gst.MessageType.EOS | self.Gst.MessageType.ERROR)

    def cancel(self):
        pass

    def close(self):
        self.pipeline.set_state(self.Gst.State.NULL)


class Server:
    """The media server's `/codes?session=ID` (qwencodec-server, docs/streaming-server.md): the
    frames as binary messages, or with `transport=rtp` in the URL as RTP packets to the port the
    server's first message names; `end` and `cancel` go on the WebSocket either way."""

    def __init__(self, url, token, plugin_dir=None):
        from websockets.sync.client import connect

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.ws = connect(url, additional_headers=headers, open_timeout=10)
        self.rtp = None
        if parse_qs(urlsplit(url).query).get("transport") == ["rtp"]:
            offer = json.loads(self.ws.recv(timeout=10))
            if offer.get("type") != "rtp":
                raise RuntimeError(f"the server's first message is not an RTP port: {offer}")
            host = self.ws.remote_address[0]
            self.rtp = Rtp(host, offer["port"], plugin_dir=plugin_dir)

    def send(self, frame):
        if self.rtp is not None:
            self.rtp.send(frame)
        else:
            self._ws_send(pack(frame))

    def _ws_send(self, message):
        from websockets.exceptions import ConnectionClosed

        try:
            self.ws.send(message)
        except ConnectionClosed as closed:
            why = closed.rcvd
            raise RuntimeError(f"the server closed /codes: {why.code} {why.reason}" if why
                               else "the connection to the server broke") from None

    def end(self):
        if self.rtp is not None:
            self.rtp.end()
            # The server's end goes straight to the session, while the last packets still wait
            # in its jitter buffer (40 ms): an end before them would start them as new speech.
            time.sleep(RTP_SETTLE_S)
        self._ws_send(json.dumps({"type": "end"}))

    def cancel(self):
        self._ws_send(json.dumps({"type": "cancel"}))

    def close(self):
        if self.rtp is not None:
            self.rtp.close()
        self.ws.close()
