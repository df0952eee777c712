#!/usr/bin/python3
"""Pushes a codes file to a session of the server (qwencodec-server) in real time, as a TTS model would:
12.5 frames a second (the model's frame rate), a few frames per WebSocket message.

    /usr/bin/python3 examples/send_codes.py --session ID --token TOKEN [--server ws://127.0.0.1:8080]
        [--codes FILE] [--codebooks 16] [--frame-rate 12.5] [--frames-per-message 1]
        [--cancel-after SECONDS] [--burst]

Needs Debian's python3-websocket (websocket-client). --cancel-after stops sending after that
much speech and sends a cancel (barge-in); --burst sends every frame at once, as a model faster
than real time would (the server paces the audio). Without --cancel-after the utterance ends
with {"type":"end"}. Exits 1 when the server refuses (its close code and reason are printed).
"""

import argparse
import json
import select
import struct
import sys
import time
from pathlib import Path

import websocket

DEFAULT_CODES = Path(__file__).resolve().parent.parent / "tests/fixtures/release-tiny/codes.raw"


def refusal(ws):
    """The server's close code and reason, if it has closed the connection."""
    if not select.select([ws.sock], [], [], 0)[0]:
        return None
    opcode, frame = ws.recv_data_frame(control_frame=True)
    if opcode != websocket.ABNF.OPCODE_CLOSE:
        return None
    code = struct.unpack("!H", frame.data[:2])[0] if len(frame.data) >= 2 else None
    return code, frame.data[2:].decode("utf-8", "replace")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default="ws://127.0.0.1:8080")
    parser.add_argument("--session", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--codes", type=Path, default=DEFAULT_CODES)
    parser.add_argument("--codebooks", type=int, default=16)
    parser.add_argument("--frame-rate", type=float, default=12.5)
    parser.add_argument("--frames-per-message", type=int, default=1)
    parser.add_argument("--cancel-after", type=float)
    parser.add_argument("--burst", action="store_true")
    args = parser.parse_args()

    frame_bytes = 2 * args.codebooks
    data = args.codes.read_bytes()
    frames = len(data) // frame_bytes
    if args.cancel_after is not None:
        frames = min(frames, int(args.cancel_after * args.frame_rate))
    ws = websocket.create_connection(
        f"{args.server}/codes?session={args.session}",
        header=[f"Authorization: Bearer {args.token}"],
    )
    start = time.monotonic()
    for first in range(0, frames, args.frames_per_message):
        if not args.burst:
            # A frame is handed over once its time has come.
            time.sleep(max(0.0, start + first / args.frame_rate - time.monotonic()))
        end = min(first + args.frames_per_message, frames)
        ws.send_binary(data[first * frame_bytes:end * frame_bytes])
        closed = refusal(ws)
        if closed:
            print(f"send_codes: the server closed the connection: {closed[0]} {closed[1]}", file=sys.stderr)
            return 1
    if args.cancel_after is not None:
        if args.burst:
            time.sleep(max(0.0, start + args.cancel_after - time.monotonic()))
        ws.send(json.dumps({"type": "cancel"}))
    else:
        # The utterance is complete: its last frames play at once, whatever --chunk-frames.
        ws.send(json.dumps({"type": "end"}))
    print(f"sent {frames} frames ({frames / args.frame_rate:.2f} s of speech) in {time.monotonic() - start:.2f} s")
    ws.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
