#!/usr/bin/env python3
"""Load test of the server (qwencodec-server) with real WebRTC peers (aiortc), all in one asyncio process.

Each session joins over /signal, answers the server's offer with an aiortc peer that receives the
audio track, and gets its speech from a sender on /codes that pushes a codes file's frames one per
message at the talker's pace (12.5 frames a second), then {"type":"end"}. Per session it measures
the time to first audio, the audio received against the audio sent, and underruns (see
docs/load-test.md for the exact definitions); meanwhile it samples the server process's CPU time,
resident memory, threads and open file descriptors.

    python tools/webrtc_load.py --sessions N [--stagger-ms MS]
    python tools/webrtc_load.py --churn TOTAL --batch B
    python tools/webrtc_load.py --find-capacity [--capacity-max N]
    python tools/webrtc_load.py --janus-listeners 1,10,50

--janus-listeners starts Janus here (Debian's janus) and the server with --janus, and per step one
broadcast (/broadcast) heard by N aiortc listeners through Janus's Streaming plugin: per listener
the same measures, and the CPU of the server and of Janus over the speech.

The server is started here (--server-binary, --model, --dtype, --chunk-frames, --max-sessions,
--device, --admission are passed on to it), or an already running one is used (--server ADDR --token T).
A markdown summary goes to stdout (and --markdown FILE), everything to --json FILE. A capacity
or broadcast run with --out measurements/results is a result to keep: both go to
<cpu>/server-capacity-<dtype>.{md,json} or <cpu>/janus-broadcast-<dtype>.{md,json} there
(benches/tools/results.py names the CPU). With
--expect-clean the exit status is 1 when a session failed to connect, underran, received less
than 90 % of the audio sent, or heard its first audio later than --max-first-audio-ms.

Needs aiortc and websockets (tools/setup-load.sh installs them into the project's venv).
"""

import argparse
import asyncio
import datetime
import json
import math
import os
import re
import resource
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import aioice.ice
import numpy
import websockets
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from aiortc.rtcrtpreceiver import RTCRtpReceiver
from aiortc.sdp import candidate_from_sdp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benches" / "tools"))
from results import result_path, this_machine  # noqa: E402
DEFAULT_MODEL = REPO / "tests/fixtures/release-tiny"
DEFAULT_BINARY = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "release/qwencodec-server"

OPUS_RATE = 48000  # RTP clock rate of Opus, whatever the audio's rate
UNDERRUN_LATENESS_S = 0.200  # a listener's buffer of this much runs dry when a packet is later
MIN_RECEIVED_FRACTION = 0.90
# The test checkpoints' decoded speech has an RMS of 0.15-0.35 of full scale in every 20 ms from
# its very first frame; Opus's silence decodes to ~0. A third of the quietest window is "clearly
# above silence".
DEFAULT_LEVEL_THRESHOLD = 0.05

# The server gathers ICE candidates on 127.0.0.1 only, and aioice leaves loopback addresses out
# of its host candidates: without this the two peers have no candidate pair in common.
aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]


# --- RTP packets as they arrive -------------------------------------------------------------------
#
# aiortc's audio jitter buffer hands a frame to the track only once 4 more packets have come after it
# (prefetch=4), and keeps an utterance's last 4 packets until the next utterance's arrive. Timing the
# track would add ~80 ms to every first audio and lose every utterance's tail, so packets are timed
# where they enter the receiver, and the decoded frames (track.recv) only give their level.

PACKET_LOGS: dict[int, "PacketLog"] = {}  # id(RTCRtpReceiver) -> its session's log
_handle_rtp_packet = RTCRtpReceiver._handle_rtp_packet


async def _logging_handle_rtp_packet(receiver, packet, arrival_time_ms):
    log = PACKET_LOGS.get(id(receiver))
    if log is not None and packet.payload:
        log.add(packet)
    await _handle_rtp_packet(receiver, packet, arrival_time_ms)


RTCRtpReceiver._handle_rtp_packet = _logging_handle_rtp_packet


def opus_packet_samples(payload: bytes) -> int:
    """Samples (at 48 kHz) in an Opus packet, from its TOC byte (RFC 6716 3.1)."""
    toc = payload[0]
    config = toc >> 3
    if config < 12:  # SILK
        frame_ms = (10, 20, 40, 60)[config % 4]
    elif config < 16:  # hybrid
        frame_ms = (10, 20)[config % 2]
    else:  # CELT
        frame_ms = (2.5, 5, 10, 20)[config % 4]
    code = toc & 3
    frames = 1 if code == 0 else 2 if code in (1, 2) else (payload[1] & 0x3F if len(payload) > 1 else 0)
    return int(frame_ms * OPUS_RATE / 1000) * frames


class PacketLog:
    """Arrival time, sequence number, RTP timestamp and duration of every packet of a session."""

    def __init__(self):
        self.arrivals: list[float] = []
        self.sequence: list[int] = []
        self.timestamps: list[int] = []
        self.samples: list[int] = []

    def add(self, packet):
        self.arrivals.append(time.monotonic())
        self.sequence.append(packet.sequence_number)
        self.timestamps.append(packet.timestamp)
        self.samples.append(opus_packet_samples(packet.payload))


def unwrap(values: list[int], bits: int) -> list[int]:
    """Sequence numbers or RTP timestamps made monotonic across their wrap-around."""
    out, offset, half, full = [], 0, 1 << (bits - 1), 1 << bits
    for i, value in enumerate(values):
        if i:
            step = value - values[i - 1]
            if step < -half:
                offset += full
            elif step > half:
                offset -= full
        out.append(value + offset)
    return out


# --- one session ---------------------------------------------------------------------------------


@dataclass
class Utterance:
    frames: int
    first_send: float | None = None  # monotonic time just before its first frame was sent
    sent: int = 0  # frames sent so far
    end_sent: float | None = None


@dataclass
class Session:
    index: int
    utterances: list[Utterance]
    id: str | None = None
    error: str | None = None  # why it did not run to the end (refusal, timeout, ...)
    join_sent: float | None = None
    connected_at: float | None = None
    closed_at: float | None = None
    packets: PacketLog = field(default_factory=PacketLog)
    levels: list[tuple[int, float, int]] = field(default_factory=list)  # decoded frames: pts, RMS, samples
    rtp_origin: int | None = None  # RTP timestamp that aiortc maps to pts 0
    signal_close: str | None = None
    codes_close: str | None = None


class SessionFailed(Exception):
    """A session that cannot go on, and why."""


@dataclass
class Target:
    address: str  # host:port
    token: str
    codes: bytes  # the codes file
    frame_bytes: int
    frame_rate: float


def close_reason(err: websockets.ConnectionClosed) -> str:
    frame = err.rcvd
    return f"{frame.code} {frame.reason}" if frame else "closed without a close frame"


def frame_level(frame) -> float:
    """RMS of a decoded audio frame, as a fraction of full scale."""
    samples = frame.to_ndarray().astype(numpy.float32) / 32768.0
    return float(numpy.sqrt(numpy.mean(samples * samples))) if samples.size else 0.0


async def record_levels(track, session: Session):
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        session.levels.append((frame.pts, frame_level(frame), frame.samples))


async def follow_signalling(signal, pc: RTCPeerConnection, session: Session):
    """Handles what the server says on /signal for the whole session: id, offer, ICE candidates."""
    try:
        async for text in signal:
            message = json.loads(text)
            kind = message.get("type")
            if kind == "session":
                session.id = message["id"]
            elif kind == "offer":
                await pc.setRemoteDescription(RTCSessionDescription(message["sdp"], "offer"))
                for transceiver in pc.getTransceivers():
                    PACKET_LOGS[id(transceiver.receiver)] = session.packets
                await pc.setLocalDescription(await pc.createAnswer())
                await signal.send(json.dumps({"type": "answer", "sdp": pc.localDescription.sdp}))
            elif kind == "ice" and message.get("candidate"):
                candidate = candidate_from_sdp(message["candidate"].split(":", 1)[1])
                candidate.sdpMLineIndex = message.get("sdpMLineIndex", 0)
                await pc.addIceCandidate(candidate)
    except websockets.ConnectionClosed as err:
        if session.closed_at is None:  # the server closed it, not this session's end
            session.signal_close = close_reason(err)
    if session.closed_at is None:
        session.signal_close = session.signal_close or "closed by the server"


async def wait_until_connected(pc: RTCPeerConnection, timeout: float):
    connected = asyncio.Event()

    @pc.on("connectionstatechange")
    def on_state():
        if pc.connectionState in ("connected", "failed", "closed"):
            connected.set()

    await asyncio.wait_for(connected.wait(), timeout)
    if pc.connectionState != "connected":
        transports = {t.receiver.transport for t in pc.getTransceivers()}
        dtls = ", ".join(t.state for t in transports)
        raise SessionFailed(
            f"WebRTC connection {pc.connectionState} (ICE {pc.iceConnectionState}, DTLS {dtls or '–'})"
        )


async def send_utterances(target: Target, session: Session, pause_s: float):
    """The TTS side: one /codes connection for all utterances, each frame at its time."""
    url = f"ws://{target.address}/codes?session={session.id}"
    headers = {"Authorization": f"Bearer {target.token}"}
    frames_in_file = len(target.codes) // target.frame_bytes
    async with websockets.connect(
        url, additional_headers=headers, compression=None, ping_interval=None
    ) as codes:
        for number, utterance in enumerate(session.utterances):
            if number:
                await asyncio.sleep(pause_s)
            start = time.monotonic()
            utterance.first_send = start
            for k in range(utterance.frames):
                # A frame is handed over once its time has come, as a talker emits it.
                await asyncio.sleep(max(0.0, start + k / target.frame_rate - time.monotonic()))
                at = (k % frames_in_file) * target.frame_bytes  # longer speech than the file: loop it
                await codes.send(target.codes[at : at + target.frame_bytes])
                utterance.sent += 1
            await codes.send(json.dumps({"type": "end"}))
            utterance.end_sent = time.monotonic()


async def wait_for_audio_tail(session: Session, last_end: float, quiet_s: float = 0.5, limit_s: float = 10.0):
    """Until the speech has played out: no packet for quiet_s once the last frame was sent."""
    while time.monotonic() < last_end + limit_s:
        arrivals = session.packets.arrivals
        last_packet = arrivals[-1] if arrivals else 0.0
        now = time.monotonic()
        if now > last_end + quiet_s and now - last_packet > quiet_s:
            return
        await asyncio.sleep(0.1)


async def close_quietly(closable):
    """Closes a peer connection or a socket; a session that failed may have left them half open."""
    try:
        await asyncio.wait_for(closable.close(), 10)
    except Exception:  # noqa: BLE001 - the session's result is recorded already
        pass


async def run_session(target: Target, session: Session, options) -> Session:
    """One browser session from join to close; failures end up in session.error."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # no STUN: loopback only, nothing leaves
    tasks = []

    @pc.on("track")
    def on_track(track):
        tasks.append(asyncio.ensure_future(record_levels(track, session)))

    signal = None
    try:
        signal = await websockets.connect(
            f"ws://{target.address}/signal",
            compression=None,
            ping_interval=None,
            open_timeout=options.connect_timeout,
        )
        session.join_sent = time.monotonic()
        await signal.send(json.dumps({"type": "join"}))
        follower = asyncio.ensure_future(follow_signalling(signal, pc, session))
        tasks.append(follower)
        connecting = asyncio.ensure_future(wait_until_connected(pc, options.connect_timeout))
        await asyncio.wait([connecting, follower], return_when=asyncio.FIRST_COMPLETED)
        if not connecting.done():
            connecting.cancel()
            if follower.exception():  # a bad offer or candidate, not a refusal
                raise follower.exception()
            raise SessionFailed(f"refused on /signal before connecting: {session.signal_close}")
        connecting.result()
        session.connected_at = time.monotonic()
        await send_utterances(target, session, options.pause_s)
        await wait_for_audio_tail(session, session.utterances[-1].end_sent)
        if follower.done():
            raise SessionFailed(f"/signal ended by the server: {session.signal_close}")
    except websockets.ConnectionClosed as err:
        session.error = f"refused on /codes: {close_reason(err)}"
        if session.signal_close:  # the session ended first: that is the cause
            session.error = f"/signal ended by the server: {session.signal_close}; then {session.error}"
    except TimeoutError:
        session.error = f"not connected within {options.connect_timeout} s"
    except SessionFailed as err:
        session.error = str(err)
    except Exception as err:  # noqa: BLE001 - any failure of one session is a result, not a crash
        session.error = f"{type(err).__name__}: {err}"
    finally:
        session.closed_at = time.monotonic()
        receivers = [t.receiver for t in pc.getTransceivers()]
        if receivers:
            mapper = getattr(receivers[0], "_RTCRtpReceiver__timestamp_mapper", None)
            session.rtp_origin = getattr(mapper, "_origin", None)
        await close_quietly(pc)
        if signal is not None:
            await close_quietly(signal)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for receiver in receivers:
            PACKET_LOGS.pop(id(receiver), None)
    return session


# --- what a session's packets say -----------------------------------------------------------------


def first_audio_ms(session: Session, utterance: Utterance, threshold: float) -> float | None:
    """From the utterance's first frame sent to the arrival of the first packet whose decoded audio
    is above the threshold."""
    if utterance.first_send is None or session.rtp_origin is None:
        return None
    arrival_by_timestamp = {}
    for arrival, timestamp in zip(session.packets.arrivals, session.packets.timestamps, strict=True):
        if arrival >= utterance.first_send:
            arrival_by_timestamp.setdefault(timestamp, arrival)
    loud = [
        arrival_by_timestamp[stamp]
        for pts, level, _ in session.levels
        if level > threshold and (stamp := (pts + session.rtp_origin) % (1 << 32)) in arrival_by_timestamp
    ]
    return (min(loud) - utterance.first_send) * 1000 if loud else None


def lateness_s(packets: PacketLog) -> list[float]:
    """How late each packet arrived against the real-time schedule that the session's first
    packet sets: packet i is due at arrival[0] + (timestamp[i] - timestamp[0]) / 48000."""
    if not packets.arrivals:
        return []
    stamps = unwrap(packets.timestamps, 32)
    start, origin = packets.arrivals[0], stamps[0]
    return [
        arrival - (start + (stamp - origin) / OPUS_RATE)
        for arrival, stamp in zip(packets.arrivals, stamps, strict=True)
    ]


def lateness_per_second_ms(packets: PacketLog, late: list[float]) -> list[float]:
    """The largest of `late` (lateness_s of `packets`) in each second of the schedule."""
    if not late:
        return []
    stamps = unwrap(packets.timestamps, 32)
    seconds = [int((stamp - stamps[0]) / OPUS_RATE) for stamp in stamps]
    worst = [float("-inf")] * (max(seconds) + 1)
    for second, lateness in zip(seconds, late, strict=True):
        worst[second] = max(worst[second], lateness)
    return [round(x * 1000, 1) if x != float("-inf") else None for x in worst]


def lost_packets(packets: PacketLog) -> int:
    """Sequence numbers missing between the first and the last packet received."""
    if not packets.sequence:
        return 0
    numbers = unwrap(packets.sequence, 16)
    return max(0, max(numbers) - min(numbers) + 1 - len(set(numbers)))


def analyse_session(session: Session, options) -> dict:
    sent_s = sum(u.sent for u in session.utterances) / options.frame_rate
    received_s = sum(session.packets.samples) / OPUS_RATE
    late = lateness_s(session.packets)
    late_packets = sum(1 for x in late if x > options.underrun_ms / 1000)
    lost = lost_packets(session.packets)
    first_audio = [first_audio_ms(session, u, options.level_threshold) for u in session.utterances]
    speech_levels = [level for _, level, _ in session.levels if level > options.level_threshold]
    result = {
        "index": session.index,
        "id": session.id,
        "error": session.error,
        "connect_ms": ms_between(session.join_sent, session.connected_at),
        "first_audio_ms": [round(x, 1) if x is not None else None for x in first_audio],
        "sent_s": round(sent_s, 3),
        "received_s": round(received_s, 3),
        "decoded_s": round(sum(n for _, _, n in session.levels) / OPUS_RATE, 3),
        "received_fraction": round(received_s / sent_s, 3) if sent_s else None,
        "packets": len(session.packets.arrivals),
        "max_lateness_ms": round(max(late) * 1000, 1) if late else None,
        # Whether a session fell behind at once or drifted: the largest lateness in each second
        # of its schedule.
        "max_lateness_ms_per_second": lateness_per_second_ms(session.packets, late),
        "late_packets": late_packets,
        "lost_packets": lost,
        "underran": late_packets > 0 or lost > 0,
        "speech_rms": round(float(numpy.median(speech_levels)), 3) if speech_levels else None,
        "signal_close": session.signal_close,
    }
    result["problems"] = session_problems(result, options)
    return result


def ms_between(start: float | None, end: float | None) -> float | None:
    return round((end - start) * 1000, 1) if start is not None and end is not None else None


def session_problems(result: dict, options) -> list[str]:
    """What makes a session not clean (the --expect-clean criteria)."""
    if result["error"]:
        return [f"failed: {result['error']}"]
    problems = []
    if result["underran"]:
        problems.append(
            f"underran: {result['late_packets']} packets over {options.underrun_ms:g} ms late "
            f"(max {result['max_lateness_ms']} ms), {result['lost_packets']} lost"
        )
    if result["received_fraction"] is None or result["received_fraction"] < MIN_RECEIVED_FRACTION:
        problems.append(f"received {result['received_s']} s of {result['sent_s']} s sent")
    for number, ms in enumerate(result["first_audio_ms"]):
        if ms is None:
            problems.append(f"utterance {number + 1}: no audio above the level threshold")
        elif ms > options.max_first_audio_ms:
            problems.append(f"utterance {number + 1}: first audio {ms:.0f} ms")
    return problems


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (p95 of 10 values is the largest)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


# --- the server process ---------------------------------------------------------------------------


class ServerProcess:
    """The server's process: started here, or found by the port it listens on."""

    def __init__(self, pid: int | None):
        self.pid = pid
        self.proc = None
        self.log = deque(maxlen=200)
        self.log_file = None

    @classmethod
    async def start(cls, options) -> tuple["ServerProcess", str, str]:
        token = options.token or secrets.token_hex(16)
        command = [
            str(options.server_binary), "--bind", "127.0.0.1:0", "--model", str(options.model),
            "--dtype", options.dtype, "--chunk-frames", str(options.chunk_frames),
            "--max-sessions", str(options.max_sessions), "--device", options.device,
            "--admission", options.admission, "--ice-address", "127.0.0.1",
            # Every peer here is one client (127.0.0.1): no cap per client on its sessions and joins.
            "--max-sessions-per-address", "0", "--max-joins-per-minute", "0",
        ]  # fmt: skip
        janus_secrets = {}
        if options.janus_api:
            command += ["--janus", options.janus_api]
            janus_secrets = {
                "QWENCODEC_JANUS_API_SECRET": JANUS_API_SECRET,
                "QWENCODEC_JANUS_ADMIN_KEY": JANUS_ADMIN_KEY,
            }
        # The server's threads as it chooses them: the environment passes through (docs/element.md, "Threads").
        # The codes token in the environment: the server takes no secret on its command line.
        proc = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "QWENCODEC_CODES_TOKEN": token, **janus_secrets},
        )
        server = cls(proc.pid)
        server.proc = proc
        if options.server_log:
            server.log_file = open(options.server_log, "w")
        address = await server._read_until_listening(options.start_timeout)
        asyncio.ensure_future(server._keep_reading())  # a full pipe would stall the server
        return server, address, token

    async def _read_line(self) -> str | None:
        raw = await self.proc.stdout.readline()
        if not raw:
            return None
        line = raw.decode(errors="replace").rstrip()
        self.log.append(line)
        if self.log_file:
            self.log_file.write(line + "\n")
            self.log_file.flush()
        return line

    async def _read_until_listening(self, timeout: float) -> str:
        async def listening():
            while (line := await self._read_line()) is not None:
                if match := re.search(r"open http://(\S+)/ in a browser", line):
                    return match.group(1)
            raise RuntimeError("the server exited before listening:\n" + "\n".join(self.log))

        return await asyncio.wait_for(listening(), timeout)

    async def _keep_reading(self):
        while await self._read_line() is not None:
            pass

    async def stop(self):
        if self.proc and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self.log_file:
            self.log_file.close()

    def exited(self) -> int | None:
        return self.proc.returncode if self.proc else None

    def sample(self) -> dict | None:
        """CPU seconds (user + system), resident memory, threads and open fds right now."""
        if self.pid is None:
            return None
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
            cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
            status = dict(
                line.split(":", 1) for line in Path(f"/proc/{self.pid}/status").read_text().splitlines()
            )
            return {
                "t": time.monotonic(),
                "cpu_s": cpu_s,
                "decoder_cpu_s": decoder_cpu_s(self.pid),
                "rss_mb": round(int(status["VmRSS"].split()[0]) / 1024, 1),
                "threads": int(status["Threads"]),
                "fds": len(os.listdir(f"/proc/{self.pid}/fd")),
            }
        except (OSError, KeyError, ValueError):
            return None


def decoder_cpu_s(pid: int) -> float:
    """CPU seconds of the process's decoder threads: its compute thread, named qwencodec-cpu
    (or qwencodec-cudaN), and the OpenMP workers it starts, which take its name. The rest of the
    process's CPU is the sessions' pipelines (Opus, SRTP, webrtcbin, libnice), the signalling
    and the ingress."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
        except OSError:
            continue  # a thread that ended meanwhile
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        if comm.startswith("qwencodec-cpu") or comm.startswith("qwencodec-cuda"):
            fields = stat[stat.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def pid_listening_on(port: int) -> int | None:
    """The process that owns the TCP socket listening on 127.0.0.1:port (for --server)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if int(parts[1].rsplit(":", 1)[1], 16) == port and parts[3] == "0A":  # LISTEN
                inodes.add(parts[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(pid)
        except OSError:
            continue
    return None


class Sampler:
    """Samples the server process every interval, in the background."""

    def __init__(self, server: ServerProcess, interval: float):
        self.server, self.interval, self.samples = server, interval, []
        self.task = None

    def sample_now(self) -> dict | None:
        sample = self.server.sample()
        if sample:
            self.samples.append(sample)
        return sample

    async def _run(self):
        while True:
            self.sample_now()
            await asyncio.sleep(self.interval)

    def start(self):
        self.task = asyncio.ensure_future(self._run())

    async def stop(self):
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    def summary(self, start: float, end: float) -> dict | None:
        """CPU use (percent of one core) and memory between two moments."""
        window = [s for s in self.samples if start <= s["t"] <= end]
        if len(window) < 2:
            return None
        first, last = window[0], window[-1]
        return {
            "cpu_percent": round(100 * (last["cpu_s"] - first["cpu_s"]) / (last["t"] - first["t"]), 1),
            # Of it: the decoder's threads, and the rest (the pipelines' Opus, SRTP, webrtcbin,
            # the server's own threads). A thread that ended within the window leaves its time
            # out of the decoder's, not the process's: "other" is then an upper bound.
            "decoder_cpu_percent": round(
                100 * (last["decoder_cpu_s"] - first["decoder_cpu_s"]) / (last["t"] - first["t"]), 1
            ),
            "other_cpu_percent": round(
                100
                * ((last["cpu_s"] - last["decoder_cpu_s"]) - (first["cpu_s"] - first["decoder_cpu_s"]))
                / (last["t"] - first["t"]),
                1,
            ),
            "rss_mb_start": first["rss_mb"],
            "rss_mb_peak": max(s["rss_mb"] for s in window),
            "rss_mb_end": last["rss_mb"],
            "threads_peak": max(s["threads"] for s in window),
            "fds_peak": max(s["fds"] for s in window),
        }


class LoopLag:
    """How late this process's own event loop wakes up: a loaded client delays every arrival time
    it records, which would be charged to the server."""

    def __init__(self, period: float = 0.05):
        self.period, self.lags, self.task = period, [], None

    async def _run(self):
        while True:
            before = time.monotonic()
            await asyncio.sleep(self.period)
            self.lags.append(time.monotonic() - before - self.period)

    def start(self):
        self.lags.clear()
        self.task = asyncio.ensure_future(self._run())

    async def stop(self) -> dict:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        lags = [x * 1000 for x in self.lags]
        return {"p99_ms": round(percentile(lags, 99) or 0, 1), "max_ms": round(max(lags, default=0), 1)}


async def http_get(address: str, path: str) -> bytes | None:
    """The body of GET path from the server (which closes the connection after it)."""
    try:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {address}\r\n\r\n".encode())
        await writer.drain()
        response = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        return response.split(b"\r\n\r\n", 1)[1]
    except (TimeoutError, OSError, IndexError):
        return None


async def fetch_status(address: str) -> dict | None:
    """GET /status: {"sessions": N, "pipelines": M}."""
    body = await http_get(address, "/status")
    try:
        return json.loads(body) if body is not None else None
    except ValueError:
        return None


DECODER_METRICS = (
    "qwencodec_decode_batch_rows_sum",
    "qwencodec_decode_batch_rows_count",
    "qwencodec_decode_step_seconds_sum",
    "qwencodec_late_audio_total",
)


async def fetch_decoder_totals(address: str) -> dict | None:
    """The decoder's totals from GET /metrics: rows and batches run, seconds computing, and the
    packets that reached the sender late."""
    body = await http_get(address, "/metrics")
    if body is None:
        return None
    totals = {}
    for line in body.decode(errors="replace").splitlines():
        name, _, value = line.partition(" ")
        if name in DECODER_METRICS:
            totals[name] = float(value)
    return totals if len(totals) == len(DECODER_METRICS) else None


def decoder_batches(before: dict | None, after: dict | None, seconds: float) -> dict | None:
    """What the decoder did between two readings of its totals: batches, their mean rows, the
    share of the time it computed (the rows a batch show whether the sessions' frames run
    together, one batch a frame, or apart), and the packets that the server counted late at its
    sender (over 100 ms past their speech's schedule: the server's side of an underrun)."""
    if not before or not after:
        return None
    batches = after["qwencodec_decode_batch_rows_count"] - before["qwencodec_decode_batch_rows_count"]
    rows = after["qwencodec_decode_batch_rows_sum"] - before["qwencodec_decode_batch_rows_sum"]
    busy = after["qwencodec_decode_step_seconds_sum"] - before["qwencodec_decode_step_seconds_sum"]
    return {
        "batches": int(batches),
        "rows_per_batch": round(rows / batches, 2) if batches else None,
        "compute_busy_percent": round(100 * busy / seconds, 1) if seconds > 0 else None,
        "late_at_sender": int(after["qwencodec_late_audio_total"] - before["qwencodec_late_audio_total"]),
    }


async def wait_for_sessions_gone(address: str, timeout: float = 10.0) -> dict | None:
    """/status once the server has freed every session and pipeline (or after timeout)."""
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        status = await fetch_status(address)
        if status and status.get("sessions") == 0 and status.get("pipelines") == 0:
            return status
        await asyncio.sleep(0.2)
    return status


# --- runs ----------------------------------------------------------------------------------------


def client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_sessions_at_once(
    target: Target, sampler: Sampler, count: int, options, first_index: int = 0
) -> dict:
    """count sessions, started stagger-ms apart, each with its utterances; their results and the
    server's CPU and memory meanwhile."""
    frames = round(options.seconds * options.frame_rate)
    loop_lag = LoopLag()
    loop_lag.start()
    decoder_before = await fetch_decoder_totals(target.address)
    cpu_before, start = client_cpu_s(), time.monotonic()
    sampler.sample_now()

    async def staggered(index: int) -> Session:
        await asyncio.sleep(index * options.stagger_ms / 1000)
        session = Session(first_index + index, [Utterance(frames) for _ in range(options.utterances)])
        return await run_session(target, session, options)

    sessions = await asyncio.gather(*(staggered(i) for i in range(count)))
    end = time.monotonic()
    sampler.sample_now()
    decoder = decoder_batches(decoder_before, await fetch_decoder_totals(target.address), end - start)
    client = {
        "cpu_percent": round(100 * (client_cpu_s() - cpu_before) / (end - start), 1),
        "loop_lag": await loop_lag.stop(),
    }
    results = [analyse_session(s, options) for s in sessions]
    return {
        "sessions": count,
        "results": results,
        "summary": summarise(results),
        "server_process": sampler.summary(start, end),
        "decoder": decoder,
        "client": client,
    }


def summarise(results: list[dict]) -> dict:
    first_audio = [ms for r in results if not r["error"] for ms in r["first_audio_ms"] if ms is not None]
    return {
        "sessions": len(results),
        "failed": sum(1 for r in results if r["error"]),
        "underran": sum(1 for r in results if r["underran"] and not r["error"]),
        "short_audio": sum(
            1 for r in results if not r["error"] and (r["received_fraction"] or 0) < MIN_RECEIVED_FRACTION
        ),
        "first_audio_ms": {
            "p50": percentile(first_audio, 50),
            "p95": percentile(first_audio, 95),
            "max": max(first_audio, default=None),
            "count": len(first_audio),
        },
        "max_lateness_ms": max(
            (r["max_lateness_ms"] for r in results if r["max_lateness_ms"] is not None), default=None
        ),
        "clean": all(not r["problems"] for r in results),
    }


def capacity_failure(run: dict, options) -> str | None:
    """Why a step of --find-capacity fails, or None when it passes."""
    summary, reasons = run["summary"], []
    if summary["failed"]:
        errors = sorted({r["error"] for r in run["results"] if r["error"]})
        reasons.append(f"{summary['failed']} sessions failed ({'; '.join(errors)[:200]})")
    if summary["underran"]:
        reasons.append(
            f"{summary['underran']} sessions underran (max lateness {summary['max_lateness_ms']} ms)"
        )
    if summary["short_audio"]:
        reasons.append(
            f"{summary['short_audio']} sessions received under {MIN_RECEIVED_FRACTION:.0%} of the audio"
        )
    p95 = summary["first_audio_ms"]["p95"]
    if p95 is None or p95 > options.max_first_audio_ms:
        reasons.append(f"p95 first audio {fmt(p95)} ms")
    if reasons and run["client"]["loop_lag"]["p99_ms"] > 50:
        reasons.append(
            f"(the load generator itself lagged: loop lag p99 {run['client']['loop_lag']['p99_ms']} ms)"
        )
    return "; ".join(reasons) or None


def only_dtls_failures(run: dict, options) -> bool:
    """Whether a run's only problem is sessions whose DTLS handshake failed: aiortc's known fault
    (docs/load-test.md), not the server's capacity. The others are judged as every run is."""
    errors = [r["error"] for r in run["results"] if r["error"]]
    without_failed = {**run, "summary": {**run["summary"], "failed": 0}}
    return (
        bool(errors)
        and all("DTLS failed" in error for error in errors)
        and capacity_failure(without_failed, options) is None
    )


async def find_capacity(target: Target, sampler: Sampler, options) -> dict:
    """Doubles N while a run of N sessions passes, then bisects between the last N that passed
    and the first that failed. A step that failed only on aiortc's DTLS fault runs once more."""
    steps = {}

    async def run_step(n: int) -> dict:
        run = await run_sessions_at_once(target, sampler, n, options)
        run["failure"] = capacity_failure(run, options)
        await wait_for_sessions_gone(target.address)
        await asyncio.sleep(options.settle_s)
        return run

    async def step(n: int) -> bool:
        run = await run_step(n)
        if run["failure"] and only_dtls_failures(run, options):
            print_progress(f"capacity: {n} sessions: {run['failure']}: aiortc's DTLS fault, once more")
            first = run["failure"]
            run = await run_step(n)
            run["before"] = first
        steps[n] = run
        print_progress(f"capacity: {n} sessions: {run['failure'] or 'pass'}")
        return run["failure"] is None

    passed, failed = 0, None
    n = options.capacity_start
    while n <= options.capacity_max:
        if not await step(n):
            failed = n
            break
        passed = n
        n *= 2
    if failed is None and passed < options.capacity_max:
        # Doubling stepped over the top: the top itself.
        if await step(options.capacity_max):
            passed = options.capacity_max
        else:
            failed = options.capacity_max
    while failed is not None and failed - passed > 1:
        middle = (passed + failed) // 2
        if await step(middle):
            passed = middle
        else:
            failed = middle
    return {
        "largest_passing": passed,
        "first_failing": failed,
        "failed_first": steps[failed]["failure"] if failed else None,
        "steps": [steps[n] for n in sorted(steps)],
    }


async def churn(target: Target, sampler: Sampler, options) -> dict:
    """TOTAL sessions opened and closed B at a time; the server's memory, threads and fds after
    each batch has gone."""
    batches, done = [], 0
    baseline = sampler.sample_now()
    while done < options.churn:
        count = min(options.batch, options.churn - done)
        run = await run_sessions_at_once(target, sampler, count, options, first_index=done)
        done += count
        status = await wait_for_sessions_gone(target.address)
        after = sampler.sample_now() or {}
        batches.append(
            {
                "batch": len(batches) + 1,
                "sessions_so_far": done,
                "summary": run["summary"],
                "problems": [p for r in run["results"] for p in r["problems"]],
                "rss_mb": after.get("rss_mb"),
                "threads": after.get("threads"),
                "fds": after.get("fds"),
                "status": status,
                "client_threads": threading.active_count(),  # a leak in the load generator shows here
            }
        )
        print_progress(
            f"churn: {done}/{options.churn} sessions, RSS {after.get('rss_mb')} MB, "
            f"threads {after.get('threads')}, fds {after.get('fds')}, status {status}, "
            f"problems {len(batches[-1]['problems'])}, load generator threads {threading.active_count()}"
        )
    final_status = await wait_for_sessions_gone(target.address)
    return {"baseline": baseline, "batches": batches, "final_status": final_status}


def print_progress(line: str):
    print(line, file=sys.stderr, flush=True)


# --- broadcasts through Janus ---------------------------------------------------------------------
#
# --janus-listeners N[,N…]: Janus is started here (its Streaming plugin and HTTP transport alone,
# with a config written into a temporary folder), the server with --janus; per step one broadcast
# (/broadcast) and N aiortc listeners that watch its mountpoint through Janus's HTTP API. The
# speech is decoded once by the server and copied to every listener by Janus.

JANUS_PLUGIN = "janus.plugin.streaming"
# Janus secured as docs/streaming-server.md has it, its secrets made for this run: its API secret, which
# every call here and the server's carry, and the Streaming plugin's admin key, the server's.
JANUS_API_SECRET = secrets.token_hex(16)
JANUS_ADMIN_KEY = secrets.token_hex(16)
JANUS_KEEPALIVE_S = 25.0  # Janus ends a session that is silent for 60 s (session_timeout)


async def http_json(url: str, body: dict | None = None, timeout: float = 40.0) -> dict:
    """POST body as JSON to an http:// URL (GET when None); the JSON answer."""
    parts = urllib.parse.urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
    try:
        data = json.dumps(body).encode() if body is not None else b""
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        writer.write(
            # HTTP/1.0: the answer ends with the connection, never chunked.
            f"{'POST' if body is not None else 'GET'} {path} HTTP/1.0\r\nHost: {parts.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        response = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    return json.loads(response.partition(b"\r\n\r\n")[2])


async def janus_call(url: str, message: dict) -> dict:
    """One request to Janus's API; its answer, or SessionFailed with Janus's error."""
    answer = await http_json(url, {**message, "transaction": secrets.token_hex(6), "apisecret": JANUS_API_SECRET})
    if answer.get("janus") not in ("success", "ack"):
        raise SessionFailed(f"Janus at {url}: {answer.get('error', answer)}")
    return answer


async def janus_offer(api: str, janus_session: int) -> dict:
    """Long-polls the Janus session's events until the Streaming plugin's answer to watch: its
    JSEP offer (or SessionFailed with the plugin's error)."""
    while True:
        event = await http_json(
            f"{api}/{janus_session}?maxev=1&rid={secrets.token_hex(4)}&apisecret={JANUS_API_SECRET}"
        )
        events = event if isinstance(event, list) else [event]
        for e in events:
            data = e.get("plugindata", {}).get("data", {})
            if "error" in data:
                raise SessionFailed(f"Janus's Streaming plugin: {data['error']}")
            if e.get("jsep", {}).get("type") == "offer":
                return e["jsep"]


async def janus_keepalive(api: str, janus_session: int):
    while True:
        await asyncio.sleep(JANUS_KEEPALIVE_S)
        await janus_call(f"{api}/{janus_session}", {"janus": "keepalive"})


async def run_listener(api: str, mountpoint: int, session: Session, ready: asyncio.Event,
                       spoken: asyncio.Event, options) -> Session:
    """One listener of a broadcast: a Janus session, watch, answer, then the speech until it has
    played out; failures end up in session.error."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # no STUN: nothing leaves the machine
    tasks, janus_session = [], None

    @pc.on("track")
    def on_track(track):
        tasks.append(asyncio.ensure_future(record_levels(track, session)))

    try:
        session.join_sent = time.monotonic()
        janus_session = (await janus_call(api, {"janus": "create"}))["data"]["id"]
        tasks.append(asyncio.ensure_future(janus_keepalive(api, janus_session)))
        handle = (await janus_call(f"{api}/{janus_session}", {"janus": "attach", "plugin": JANUS_PLUGIN}))[
            "data"
        ]["id"]
        handle_url = f"{api}/{janus_session}/{handle}"
        await janus_call(handle_url, {"janus": "message", "body": {"request": "watch", "id": mountpoint}})
        offer = await asyncio.wait_for(janus_offer(api, janus_session), options.connect_timeout)
        await pc.setRemoteDescription(RTCSessionDescription(offer["sdp"], "offer"))
        for transceiver in pc.getTransceivers():
            PACKET_LOGS[id(transceiver.receiver)] = session.packets
        await pc.setLocalDescription(await pc.createAnswer())
        answer = {"type": "answer", "sdp": pc.localDescription.sdp}  # its candidates in it
        await janus_call(handle_url, {"janus": "message", "body": {"request": "start"}, "jsep": answer})
        await wait_until_connected(pc, options.connect_timeout)
        session.connected_at = time.monotonic()
        ready.set()
        await spoken.wait()
        await wait_for_audio_tail(session, session.utterances[-1].end_sent)
    except TimeoutError:
        session.error = f"not connected within {options.connect_timeout} s"
    except SessionFailed as err:
        session.error = str(err)
    except Exception as err:  # noqa: BLE001 - any failure of one listener is a result, not a crash
        session.error = f"{type(err).__name__}: {err}"
    finally:
        ready.set()
        session.closed_at = time.monotonic()
        receivers = [t.receiver for t in pc.getTransceivers()]
        if receivers:
            mapper = getattr(receivers[0], "_RTCRtpReceiver__timestamp_mapper", None)
            session.rtp_origin = getattr(mapper, "_origin", None)
        await close_quietly(pc)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if janus_session is not None:
            try:
                await janus_call(f"{api}/{janus_session}", {"janus": "destroy"})
            except Exception:  # noqa: BLE001 - Janus ends it after its timeout anyway
                pass
        for receiver in receivers:
            PACKET_LOGS.pop(id(receiver), None)
    return session


async def run_broadcast(target: Target, api: str, samplers: dict, count: int, options) -> dict:
    """One broadcast with count listeners: they connect, then the speech is sent once; each
    listener's results, and the CPU of the server, Janus and this process over the speech."""
    frames = round(options.seconds * options.frame_rate)
    utterances = [Utterance(frames) for _ in range(options.utterances)]
    loop_lag = LoopLag()
    async with websockets.connect(
        f"ws://{target.address}/broadcast",
        additional_headers={"Authorization": f"Bearer {target.token}"},
        compression=None,
        ping_interval=None,
    ) as broadcast:
        announced = json.loads(await broadcast.recv())
        if announced.get("type") != "broadcast":
            raise RuntimeError(f"/broadcast answered {announced}")
        sender = Session(-1, utterances, id=announced["id"])
        spoken = asyncio.Event()
        readies = [asyncio.Event() for _ in range(count)]
        listeners = [
            asyncio.ensure_future(
                run_listener(
                    api, announced["mountpoint"], Session(i, utterances), readies[i], spoken, options
                )
            )
            for i in range(count)
        ]
        await asyncio.gather(*(ready.wait() for ready in readies))
        await asyncio.sleep(0.5)  # the last answers' DTLS settled
        loop_lag.start()
        cpu_before, host_before, start = client_cpu_s(), host_cpu_s(), time.monotonic()
        for sampler in samplers.values():
            sampler.sample_now()
        try:
            await send_utterances(target, sender, options.pause_s)
            await asyncio.sleep(0.5)  # the last packets' way through the server and Janus
        finally:
            spoken.set()
        end, host_after = time.monotonic(), host_cpu_s()
        for sampler in samplers.values():
            sampler.sample_now()
        client = {
            "cpu_percent": round(100 * (client_cpu_s() - cpu_before) / (end - start), 1),
            "loop_lag": await loop_lag.stop(),
        }
        sessions = await asyncio.gather(*listeners)
    server, janus = samplers["server"].summary(start, end) or {}, samplers["janus"].summary(start, end) or {}
    # The machine's CPU over the speech, all processes: what the server, Janus and this process
    # leave of it is the rest of the machine (another user's build, say).
    host = {
        "busy_percent": round(100 * (host_after - host_before) / (end - start), 1),
        "cores": os.cpu_count(),
    }
    host["others_percent"] = round(
        host["busy_percent"]
        - sum(x.get("cpu_percent") or 0 for x in (server, janus))
        - client["cpu_percent"],
        1,
    )
    results = [analyse_session(s, options) for s in sessions]
    return {
        "listeners": count,
        "session": announced["id"],
        "mountpoint": announced["mountpoint"],
        "results": results,
        "summary": summarise(results),
        "server_process": server,
        "janus_process": janus,
        "client": client,
        "host": host,
        "load_average": os.getloadavg(),
    }


def host_cpu_s() -> float:
    """CPU seconds the whole machine has been busy (all cores, /proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def interface_address(interface: str) -> str:
    """The IPv4 address of a network interface (ip -o -4 addr show dev IF)."""
    shown = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "dev", interface], capture_output=True, text=True
    ).stdout
    match = re.search(r"inet (\S+)/", shown)
    if not match:
        raise RuntimeError(f"no IPv4 address on {interface} (tools/janus-load.sh makes one)")
    return match.group(1)


class JanusProcess:
    """Debian's Janus, started with a config of its own: the Streaming plugin and the HTTP
    transport alone, its API on 127.0.0.1 with JANUS_API_SECRET, the plugin's admin key
    JANUS_ADMIN_KEY, ICE on one interface (--janus-ice-interface)."""

    def __init__(self, proc, folder: Path, api: str):
        self.proc, self.folder, self.api = proc, folder, api

    @classmethod
    async def start(cls, options) -> "JanusProcess":
        modules = next(
            (p for p in Path("/usr/lib").glob("*/janus") if (p / "plugins/libjanus_streaming.so").exists()),
            None,
        )
        if modules is None:
            raise RuntimeError("no Janus plugins under /usr/lib/*/janus (Debian's janus)")
        folder = Path(tempfile.mkdtemp(prefix="webrtc-load-janus-"))

        def others(kind: str, keep: str) -> str:
            return ",".join(p.name for p in sorted((modules / kind).glob("*.so")) if p.name != keep)

        with socket.socket() as probe:  # a free port for the API
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        (folder / "janus.jcfg").write_text(
            f'general: {{ configs_folder = "{folder}" plugins_folder = "{modules}/plugins" '
            f'transports_folder = "{modules}/transports" events_folder = "{modules}/events" '
            f'loggers_folder = "{modules}/loggers" debug_level = 3 api_secret = "{JANUS_API_SECRET}" }}\n'
            f'media: {{ rtp_port_range = "{options.janus_rtp_ports}" }}\n'
            f'nat: {{ ice_enforce_list = "{options.janus_ice_interface}" }}\n'
            f'plugins: {{ disable = "{others("plugins", "libjanus_streaming.so")}" }}\n'
            f'transports: {{ disable = "{others("transports", "libjanus_http.so")}" }}\n'
            "events: { broadcast = false }\n"
            f'loggers: {{ disable = "{others("loggers", "")}" }}\n'
        )
        (folder / "janus.transport.http.jcfg").write_text(
            f'general: {{ base_path = "/janus" http = true port = {port} ip = "127.0.0.1" https = false }}\n'
            "admin: { admin_http = false }\n"
        )
        (folder / "janus.plugin.streaming.jcfg").write_text(f'general: {{ admin_key = "{JANUS_ADMIN_KEY}" }}\n')
        log = open(folder / "janus.log", "w")
        proc = await asyncio.create_subprocess_exec(
            options.janus_binary, "--configs-folder", str(folder), "--disable-colors", stdout=log, stderr=log
        )
        log.close()
        janus = cls(proc, folder, f"http://127.0.0.1:{port}/janus")
        deadline = time.monotonic() + 15
        while True:
            try:
                await http_json(janus.api + "/info", timeout=2)
                return janus
            except (OSError, ValueError, TimeoutError):
                if proc.returncode is not None or time.monotonic() > deadline:
                    await janus.stop()
                    raise RuntimeError("Janus does not answer; its log:\n" + janus.log_tail()) from None
                await asyncio.sleep(0.1)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join((self.folder / "janus.log").read_text().splitlines()[-lines:])
        except OSError:
            return ""

    async def stop(self):
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def broadcasts(target: Target, janus: JanusProcess, server_sampler: "Sampler", options) -> dict:
    """One broadcast per step of --janus-listeners, one after the other, on the same server and Janus."""
    samplers = {
        "server": server_sampler,
        "janus": Sampler(ServerProcess(janus.proc.pid), options.sample_interval),
    }
    samplers["janus"].start()
    steps = []
    try:
        for count in options.janus_listeners:
            try:
                step = await run_broadcast(target, janus.api, samplers, count, options)
            except websockets.ConnectionClosed as err:  # refused: admission, Janus, the token
                raise RuntimeError(f"/broadcast for {count} listeners: {close_reason(err)}") from None
            s, p, j = step["summary"], step["server_process"] or {}, step["janus_process"] or {}
            print_progress(
                f"broadcast: {count} listeners: {s['failed']} failed, {s['underran']} underran, first audio "
                f"p50 {fmt(s['first_audio_ms']['p50'])} ms; server CPU {fmt(p.get('cpu_percent'))} %, "
                f"Janus {fmt(j.get('cpu_percent'))} %, this process {step['client']['cpu_percent']} %"
            )
            steps.append(step)
            await wait_for_sessions_gone(target.address)
            await asyncio.sleep(options.settle_s)
    finally:
        await samplers["janus"].stop()
    return {"janus_api": janus.api, "janus_log": janus.log_tail(), "steps": steps}


# --- the report ----------------------------------------------------------------------------------


def machine_description() -> dict:
    """The CPU (its model, AVX-512, what limited it: what names its results) and its cores."""
    return {**this_machine(), "cores": os.cpu_count()}


def git_commit() -> dict:
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    try:
        return {
            "commit": git("rev-parse", "--short", "HEAD") or "unknown",
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        }
    except OSError:
        return {"commit": "unknown", "dirty": None}


def fmt(value) -> str:
    return "–" if value is None else f"{value:g}" if isinstance(value, (int, float)) else str(value)


def row(*cells) -> str:
    """A markdown table row."""
    return "| " + " | ".join(fmt(cell) for cell in cells) + " |"


def markdown_header(report: dict) -> list[str]:
    server, options, machine = report["server"], report["options"], report["machine"]
    commit = report["commit"]["commit"] + (" (with uncommitted changes)" if report["commit"]["dirty"] else "")
    external = " (external server)" if server["external"] else ""
    pauses = f", {options['pause_s']:g} s apart" if options["utterances"] > 1 else ""
    return [
        f"# qwencodec-server WebRTC load test: {report['mode']}",
        "",
        f"- machine: {machine['cpu']} ({machine['cores']} cores), commit {commit}, {report['started']}",
        f"- server: model `{server['model']}`, dtype {server['dtype']}, "
        f"chunk-frames {server['chunk_frames']}, device {server['device']}, "
        f"max-sessions {server['max_sessions']}, admission {server['admission']}{external}",
        f"- speech per session: {options['utterances']} utterance(s) of {options['seconds']:g} s{pauses}, "
        f"one frame per message at {options['frame_rate']:g} frames/s; stagger {options['stagger_ms']:g} ms",
        f"- criteria: underrun = a packet over {options['underrun_ms']:g} ms late or a lost packet; first "
        f"audio at most {options['max_first_audio_ms']:g} ms; at least {MIN_RECEIVED_FRACTION:.0%} of the "
        "audio received",
        "",
    ]


def markdown_sessions_table(results: list[dict]) -> list[str]:
    lines = [
        row("session", "connect ms", "first audio ms", "sent s", "received s (%)", "max late ms")
        + " late pkts | lost pkts | result |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        first = ", ".join(fmt(ms) for ms in r["first_audio_ms"])
        share = f" ({r['received_fraction'] * 100:.0f} %)" if r["received_fraction"] is not None else ""
        result = "; ".join(r["problems"]) or "ok"
        lines.append(
            row(r["index"], r["connect_ms"], first, r["sent_s"], fmt(r["received_s"]) + share)
            + row(r["max_lateness_ms"], r["late_packets"], r["lost_packets"], result)[1:]
        )
    return lines


def markdown_run_summary(run: dict) -> list[str]:
    s, p, c = run["summary"], run["server_process"] or {}, run["client"]
    d = run.get("decoder") or {}
    fa = s["first_audio_ms"]
    return [
        f"- first audio: p50 {fmt(fa['p50'])} ms, p95 {fmt(fa['p95'])} ms, max {fmt(fa['max'])} ms "
        f"({fa['count']} utterances)",
        f"- sessions that failed: {s['failed']}, underran: {s['underran']}, received under "
        f"{MIN_RECEIVED_FRACTION:.0%}: {s['short_audio']} (of {s['sessions']}); "
        f"largest lateness {fmt(s['max_lateness_ms'])} ms",
        f"- server: CPU {fmt(p.get('cpu_percent'))} % of a core on average "
        f"(decoder {fmt(p.get('decoder_cpu_percent'))} %, the rest {fmt(p.get('other_cpu_percent'))} %), "
        f"RSS {fmt(p.get('rss_mb_start'))} → peak {fmt(p.get('rss_mb_peak'))} MB, "
        f"threads up to {fmt(p.get('threads_peak'))}, fds up to {fmt(p.get('fds_peak'))}",
        f"- decoder (the server's /metrics): {fmt(d.get('batches'))} batches of "
        f"{fmt(d.get('rows_per_batch'))} rows on average, computing {fmt(d.get('compute_busy_percent'))} % "
        f"of the run; {fmt(d.get('late_at_sender'))} packets late at the server's sender",
        f"- load generator: CPU {c['cpu_percent']} % of a core, "
        f"event-loop lag p99 {c['loop_lag']['p99_ms']} ms (max {c['loop_lag']['max_ms']} ms)",
    ]


def markdown_capacity(report: dict) -> list[str]:
    capacity = report["capacity"]
    lines = [
        row("sessions", "result", "first audio p50 / p95 / max ms", "underran", "failed", "server CPU %")
        + " rows a batch | late at the sender | RSS peak MB | client loop lag p99 ms |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in capacity["steps"]:
        fa, p, summary = run["summary"]["first_audio_ms"], run["server_process"] or {}, run["summary"]
        first_audio = f"{fmt(fa['p50'])} / {fmt(fa['p95'])} / {fmt(fa['max'])}"
        lines.append(
            row(
                run["sessions"],
                (run["failure"] or "pass")
                + (f" (run again: the first try {run['before']})" if run.get("before") else ""),
                first_audio,
                summary["underran"],
                summary["failed"],
            )
            + row(
                p.get("cpu_percent"),
                (run.get("decoder") or {}).get("rows_per_batch"),
                (run.get("decoder") or {}).get("late_at_sender"),
                p.get("rss_mb_peak"),
                run["client"]["loop_lag"]["p99_ms"],
            )[1:]
        )
    lines += ["", f"**Capacity: {capacity['largest_passing']} sessions** pass."]
    if capacity["first_failing"]:
        lines.append(
            f"Beyond it, {capacity['first_failing']} sessions failed first on: {capacity['failed_first']}."
        )
    else:
        lines.append(f"Every step up to --capacity-max ({report['options']['capacity_max']}) passed.")
    return lines


def markdown_broadcast(report: dict) -> list[str]:
    lines = [
        row("listeners", "connected", "first audio p50 / p95 / max ms", "received min %", "underran")
        + " server CPU % (decoder / rest) | Janus CPU % | load generator CPU % | loop lag p99 ms"
        + " | other processes CPU % | load avg |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for step in report["broadcast"]["steps"]:
        s, p, j = step["summary"], step["server_process"] or {}, step["janus_process"] or {}
        fa = s["first_audio_ms"]
        fractions = [r["received_fraction"] for r in step["results"] if r["received_fraction"] is not None]
        server_cpu = (
            f"{fmt(p.get('cpu_percent'))} "
            f"({fmt(p.get('decoder_cpu_percent'))} / {fmt(p.get('other_cpu_percent'))})"
        )
        lines.append(
            row(
                step["listeners"],
                s["sessions"] - s["failed"],
                f"{fmt(fa['p50'])} / {fmt(fa['p95'])} / {fmt(fa['max'])}",
                round(100 * min(fractions), 1) if fractions else None,
                s["underran"],
                server_cpu,
                j.get("cpu_percent"),
            )
            + row(
                step["client"]["cpu_percent"],
                step["client"]["loop_lag"]["p99_ms"],
                step["host"]["others_percent"],
                " ".join(f"{x:.2f}" for x in step["load_average"]),
            )[1:]
        )
    return lines + [
        "",
        "CPU in % of one core over the speech (its first frame sent to 0.5 s after its last); other "
        "processes: the machine's busy CPU (/proc/stat) less the server's, Janus's and the load "
        "generator's; the load average (1, 5, 15 min) at the step's end.",
    ]


def markdown_churn(report: dict) -> list[str]:
    churn_report = report["churn"]
    base = churn_report["baseline"] or {}
    lines = [
        f"Before the first batch: RSS {fmt(base.get('rss_mb'))} MB, threads {fmt(base.get('threads'))}, "
        f"fds {fmt(base.get('fds'))}.",
        "",
        row("batch", "sessions so far", "problems", "first audio p95 ms", "RSS MB", "threads", "fds")
        + " /status after |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for b in churn_report["batches"]:
        p95 = b["summary"]["first_audio_ms"]["p95"]
        lines.append(
            row(
                b["batch"], b["sessions_so_far"], len(b["problems"]), p95, b["rss_mb"], b["threads"], b["fds"]
            )
            + f" {json.dumps(b['status'])} |"
        )
    return lines + ["", f"/status at the end: {json.dumps(churn_report['final_status'])}"]


def markdown_report(report: dict) -> str:
    lines = markdown_header(report)
    if report["mode"] == "sessions":
        run = report["run"]
        lines += markdown_sessions_table(run["results"]) + [""] + markdown_run_summary(run)
    elif report["mode"] == "capacity":
        lines += markdown_capacity(report)
    elif report["mode"] == "broadcast":
        lines += markdown_broadcast(report)
    else:
        lines += markdown_churn(report)
    lines += ["", "**Clean**: yes" if not report["problems"] else "**Problems**:"]
    lines += [f"- {p}" for p in report["problems"][:50]]
    if len(report["problems"]) > 50:
        lines.append(f"- … and {len(report['problems']) - 50} more")
    return "\n".join(lines) + "\n"


def report_problems(report: dict) -> list[str]:
    """Everything that --expect-clean fails on."""
    if report["mode"] == "sessions":
        return [f"session {r['index']}: {p}" for r in report["run"]["results"] for p in r["problems"]]
    if report["mode"] == "broadcast":
        return [
            f"{step['listeners']} listeners: listener {r['index']}: {p}"
            for step in report["broadcast"]["steps"]
            for r in step["results"]
            for p in r["problems"]
        ]
    if report["mode"] == "capacity":
        return [] if report["capacity"]["largest_passing"] else ["not even the first step passed"]
    problems = [f"batch {b['batch']}: {p}" for b in report["churn"]["batches"] for p in b["problems"]]
    final = report["churn"]["final_status"]
    if not final or final.get("sessions") != 0 or final.get("pipelines") != 0:
        problems.append(f"/status at the end: {final} (every session and pipeline should be freed)")
    return problems


# --- main ----------------------------------------------------------------------------------------


def parse_options(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--sessions", type=int, help="N sessions at once")
    mode.add_argument(
        "--churn", type=int, metavar="TOTAL", help="open and close TOTAL sessions, --batch at a time"
    )
    mode.add_argument(
        "--find-capacity", action="store_true", help="the most sessions that play cleanly at once"
    )
    mode.add_argument(
        "--janus-listeners",
        metavar="N[,N...]",
        type=lambda text: [int(n) for n in text.split(",")],
        help="one broadcast per N, heard by N listeners through Janus (started here)",
    )
    parser.add_argument("--batch", type=int, default=8, help="sessions at once in --churn (8)")
    parser.add_argument("--stagger-ms", type=float, default=0, help="between session starts (0)")
    parser.add_argument("--seconds", type=float, default=3.0, help="speech per utterance (3)")
    parser.add_argument("--utterances", type=int, default=1, help="utterances per session (1)")
    parser.add_argument("--pause-s", type=float, default=1.0, help="pause between utterances (1)")
    parser.add_argument("--codes", type=Path, help="codes file, S16LE (the model's codes.raw)")
    parser.add_argument(
        "--codebooks", type=int, help="codes per frame (from the model's config.json, else 16)"
    )
    parser.add_argument(
        "--frame-rate", type=float, default=12.5, help="frames per second the talker emits (12.5)"
    )
    parser.add_argument("--capacity-start", type=int, default=1)
    parser.add_argument("--capacity-max", type=int, default=64)
    parser.add_argument(
        "--settle-s",
        type=float,
        default=4.0,
        help="pause between --find-capacity steps (4: longer than the server's 3 s window of late audio)",
    )
    parser.add_argument(
        "--underrun-ms",
        type=float,
        default=UNDERRUN_LATENESS_S * 1000,
        help="lateness that is an underrun (200)",
    )
    parser.add_argument("--max-first-audio-ms", type=float, default=400)
    parser.add_argument(
        "--level-threshold",
        type=float,
        default=DEFAULT_LEVEL_THRESHOLD,
        help="RMS (full scale 1) that is audio (0.05)",
    )
    parser.add_argument("--connect-timeout", type=float, default=15.0)
    parser.add_argument(
        "--sample-interval", type=float, default=0.5, help="server process sampling period, s (0.5)"
    )
    parser.add_argument(
        "--expect-clean", action="store_true", help="exit 1 on any failed, underrun, short or slow session"
    )
    parser.add_argument("--json", type=Path, help="write the full results here")
    parser.add_argument("--markdown", type=Path, help="write the summary here too")
    parser.add_argument(
        "--out",
        type=Path,
        metavar="RESULTS",
        help="with --find-capacity or --janus-listeners: write both to RESULTS/<cpu>/server-capacity-<dtype> "
        "or janus-broadcast-<dtype> (.md, .json); RESULTS is measurements/results for a result to keep",
    )
    server = parser.add_argument_group("the server (started here unless --server is given)")
    server.add_argument("--server", metavar="ADDR", help="use a running server at host:port")
    server.add_argument("--token", help="its codes ingress token (required with --server)")
    server.add_argument("--server-pid", type=int, help="its process, to sample (found by its port otherwise)")
    server.add_argument("--server-binary", type=Path, default=DEFAULT_BINARY)
    server.add_argument("--model", type=Path, help=f"checkpoint folder ({DEFAULT_MODEL.relative_to(REPO)})")
    server.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
    server.add_argument("--chunk-frames", type=int, default=1)
    server.add_argument("--device", default="auto")
    server.add_argument(
        "--max-sessions", type=int, help="(enough for the run: N, the batch, or --capacity-max)"
    )
    server.add_argument(
        "--admission",
        default="measured",
        choices=["measured", "off"],
        help="the server's admission: refuse sessions past what it serves in real time, or not",
    )
    server.add_argument("--server-log", type=Path, help="write the server's log here")
    server.add_argument(
        "--start-timeout", type=float, default=120.0, help="seconds for the server to load its model"
    )
    janus = parser.add_argument_group("Janus (--janus-listeners)")
    janus.add_argument("--janus-binary", default="janus")
    janus.add_argument(
        "--janus-ice-interface",
        help="the interface Janus and the listeners gather ICE candidates on: not lo, where Janus "
        "gathers none (tools/janus-load.sh makes one, qwload0, in a network namespace)",
    )
    janus.add_argument("--janus-rtp-ports", default="20000-40000", help="Janus's RTP port range")
    options = parser.parse_args(argv)
    if options.server and not options.token:
        parser.error("--server needs --token")
    if options.janus_listeners and options.server:
        parser.error("--janus-listeners starts its own server (with --janus)")
    if options.janus_listeners and not options.janus_ice_interface:
        parser.error("--janus-listeners needs --janus-ice-interface (tools/janus-load.sh gives it)")
    if options.out and not (options.find_capacity or options.janus_listeners):
        parser.error("--out takes a capacity or broadcast run (--find-capacity, --janus-listeners)")
    if options.out and options.server:
        parser.error("--out needs the server started here: the result names this CPU and the dtype it ran")
    if options.janus_listeners and min(options.janus_listeners) < 1:
        parser.error("--janus-listeners takes counts of at least 1")
    for name in ("sessions", "churn", "batch", "utterances", "capacity_start", "capacity_max"):
        value = getattr(options, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if options.seconds * options.frame_rate < 1:
        parser.error("--seconds must hold at least one frame")
    if options.max_sessions is None:
        needed = options.sessions or (options.batch if options.churn else options.capacity_max)
        options.max_sessions = max(16, needed)
    if options.model is None and not options.server:
        options.model = DEFAULT_MODEL
    config = options.model / "config.json" if options.model else None
    if options.codebooks is None:
        options.codebooks = (
            json.loads(config.read_text()).get("num_quantizers", 16) if config and config.exists() else 16
        )
    if options.codes is None:
        options.codes = (
            options.model / "codes.raw"
            if options.model and (options.model / "codes.raw").exists()
            else DEFAULT_MODEL / "codes.raw"
        )
    return options


async def main_async(options) -> int:
    server_process, address, token = None, options.server, options.token
    janus, options.janus_api = None, None
    if options.janus_listeners:
        # The listeners' ICE candidates on the interface Janus gathers its own on.
        ice_address = interface_address(options.janus_ice_interface)
        aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: [ice_address]
        janus = await JanusProcess.start(options)
        options.janus_api = janus.api
        print_progress(f"Janus at {janus.api} (pid {janus.proc.pid}, config and log in {janus.folder})")
    if options.server:
        port = int(options.server.rsplit(":", 1)[1])
        server_process = ServerProcess(options.server_pid or pid_listening_on(port))
    else:
        try:
            server_process, address, token = await ServerProcess.start(options)
        except BaseException:
            if janus:
                await janus.stop()
            raise
    print_progress(f"server at {address} (pid {server_process.pid})")
    codes = options.codes.read_bytes()
    frame_bytes = 2 * options.codebooks
    target = Target(
        address, token, codes[: len(codes) // frame_bytes * frame_bytes], frame_bytes, options.frame_rate
    )
    sampler = Sampler(server_process, options.sample_interval)
    sampler.start()
    report = {
        "tool": "tools/webrtc_load.py",
        "date": datetime.date.today().isoformat(),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_description(),
        "commit": git_commit(),
        "server": {
            "address": address,
            "external": bool(options.server),
            "model": str(options.model) if options.model else "unknown (external server)",
            # An external server's settings are what this tool was told, not what it saw.
            "dtype": options.dtype + (" (as told)" if options.server else ""),
            "chunk_frames": f"{options.chunk_frames}" + (" (as told)" if options.server else ""),
            "device": options.device + (" (as told)" if options.server else ""),
            "max_sessions": "unknown" if options.server else options.max_sessions,
            "admission": "unknown" if options.server else options.admission,
        },
        "options": {
            key: (str(value) if isinstance(value, Path) else value)
            for key, value in vars(options).items()
            if key not in ("token",)
        },
    }
    try:
        if options.sessions:
            report["mode"] = "sessions"
            report["run"] = await run_sessions_at_once(target, sampler, options.sessions, options)
        elif options.janus_listeners:
            report["mode"] = "broadcast"
            report["broadcast"] = await broadcasts(target, janus, sampler, options)
        elif options.churn:
            report["mode"] = "churn"
            report["churn"] = await churn(target, sampler, options)
        else:
            report["mode"] = "capacity"
            report["capacity"] = await find_capacity(target, sampler, options)
        # Closed sessions should leave nothing behind (an external server may have other clients).
        report["status_at_end"] = await (
            fetch_status(address) if options.server else wait_for_sessions_gone(address)
        )
    finally:
        await sampler.stop()
        if not options.server:
            await server_process.stop()
        if janus:
            await janus.stop()
    report["server_samples"] = sampler.samples
    report["server_exit"] = server_process.exited()
    report["problems"] = report_problems(report)
    status = report.get("status_at_end")
    if (
        report["mode"] != "churn"
        and not options.server
        and (not status or status.get("sessions") or status.get("pipelines"))
    ):
        report["problems"].append(
            f"/status after every session closed: {status} (every pipeline should be freed)"
        )
    if server_process.exited() not in (None, 0, -15):
        report["problems"].append(
            f"the server exited with {server_process.exited()}: " + " | ".join(list(server_process.log)[-5:])
        )
    summary = markdown_report(report)
    print(summary)
    if options.markdown:
        options.markdown.write_text(summary)
    if options.json:
        options.json.write_text(json.dumps(report, indent=1) + "\n")
    if options.out:
        kind = "server-capacity" if report["mode"] == "capacity" else "janus-broadcast"
        stem = result_path(options.out, report["machine"], f"{kind}-{options.dtype}")
        stem.with_suffix(".md").write_text(summary)
        stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        print_progress(f"written: {stem}.{{md,json}}")
    return 1 if options.expect_clean and report["problems"] else 0


def main() -> int:
    options = parse_options()
    try:
        return asyncio.run(main_async(options))
    except (TimeoutError, RuntimeError, OSError) as err:
        print(f"webrtc_load: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
