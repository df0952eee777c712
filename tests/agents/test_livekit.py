"""livekit.plugins.qwencodec.TTS driven as an AgentSession drives a TTS (livekit-agents 1.8.9).

livekit-agents ships no test TTS or offline harness for a TTS plugin (its `testing` module is a
fake JobContext for a whole agent in a room, which needs a LiveKit server), so this drives the
TTS the way AgentSession's tts_node does: `synthesize(text)` collected, and `stream()` with
push_text / flush / end_input, iterating the SynthesizedAudio it yields; aclose() is the
interruption path (tts_node's `async with stream` closing).

On the tiny CustomVoice talker (made here in a temp folder) and the bundled release-tiny decoder,
with fixed seeds, each utterance's audio is compared with the same text's codes (the same seed,
from upstream's `generate` streamed by `qwencodec_talker.stream_codes`, not through the adapter,
which runs our own loop) decoded by a second qwencodecdec
pipeline, so a dropped, repeated or reordered chunk fails, and so does silence:

1. synthesize(text): one segment, every chunk mono at the decoder's rate under one request id,
   the last one final; the samples are frames_made x 1920, equal to the reference decode.
2. stream(): two sentences pushed in pieces, the rest of the text held back after the start of
   the second until the first sentence's audio is heard, then flush and end_input: one segment (livekit 1.8.9
   keeps one segment per stream; text after a flush is dropped by its base class) whose audio
   is the first sentence's decode then the second's, each spoken as its own utterance; the
   first audio comes while the talker is still on the first sentence (frames made then, counted
   by a hook on the code predictor's last head, fewer than the sentence's frames).
3. aclose() once a long utterance has been heard: the talker stops within a few frames (counted
   by the hook, and Speaker.frames_made), makes no frame after aclose returns, the decoder holds
   no audio of it, nothing is emitted after; a new stream then speaks exactly its reference.

    G_DEBUG=fatal_warnings VENV/bin/python tests/agents/test_livekit.py

with the venv that tools/setup-packages.sh pip-installs the packages into (tools/check-agents.sh).
"""

import asyncio
import faulthandler
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("G_DEBUG", "fatal_warnings")
ROOT = Path(__file__).resolve().parents[2]

import numpy as np  # noqa: E402
import torch  # noqa: E402

from qwencodec_talker import generate_kwargs, stream_codes  # noqa: E402
from qwencodec_talker.prompt import load_processor, prompt  # noqa: E402
from qwencodec_talker.speech import Decoder, Speaker  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from installed import installed  # noqa: E402

DECODER = ROOT / "tests" / "fixtures" / "release-tiny"
VOICE = "vivian"
SEED = 4
# Frames with seed 4 and upstream's defaults (CustomVoice: non_streaming_mode) on the tiny talker.
FIRST = "Hello there, how are you today?"   # 25 frames
SECOND = "This is the second sentence."     # 31 frames
LONG = "Here is a long story that goes on and on for quite a while."  # 23 frames
MAX_NEW_TOKENS = 200
CANCEL_SLACK = 3  # frames the talker may make after aclose is called

failures = []


def check(condition, message):
    print(("ok   " if condition else "FAIL ") + message, flush=True)
    if not condition:
        failures.append(message)


class FrameCounter:
    """Frames the talker has made so far: a forward hook on the code predictor's last head,
    which runs once a frame, when the frame's last code is made (on either loop)."""

    def __init__(self, model):
        self.frames = 0
        self.handle = model.talker.code_predictor.lm_head[-1].register_forward_hook(self.hook)

    def hook(self, module, args, output):
        self.frames += 1


class References:
    """The same text's codes with the same seed from upstream's generate (streamed by
    qwencodec_talker.stream_codes; not through the adapter or Speaker, which run our own loop),
    decoded by a second appsrc ! qwencodecdec ! appsink."""

    def __init__(self, talker_dir, model):
        self.talker_dir, self.model = talker_dir, model
        self.processor = load_processor(talker_dir)
        self.decoder = Decoder(DECODER)
        self.cache = {}

    def frames(self, text):
        return list(stream_codes(
            self.model, **prompt(self.model, self.processor, text, speaker=VOICE), seed=SEED,
            **generate_kwargs(self.model, max_new_tokens=MAX_NEW_TOKENS)))

    def audio(self, text):
        if text not in self.cache:
            frames = self.frames(text)
            for frame in frames:
                self.decoder.push(frame)
            self.decoder.drain()
            pcm = b""
            want = 2 * len(frames) * self.decoder.samples_per_frame
            deadline = time.monotonic() + 60
            while len(pcm) < want and time.monotonic() < deadline:
                pcm += self.decoder.pull(0.1) or b""
            assert len(pcm) == want, f"reference decode: {len(pcm)} of {want} bytes"
            self.decoder.flush()
            self.cache[text] = (len(frames), np.frombuffer(pcm, dtype=np.int16))
        return self.cache[text]

    def close(self):
        self.decoder.close()


def pcm_of(events):
    """The events' audio, less LiveKit's end-of-segment marker: when a segment's held-back tail
    was already flushed (by the plugin after its last audio, or by the AudioEmitter's timer
    when audio comes slower than it plays), the AudioEmitter ends the segment with a synthetic
    10 ms of silence marked final, which it does not count as pushed audio."""
    if events and events[-1].is_final:
        last = events[-1].frame
        marker = last.samples_per_channel == last.sample_rate // 100
        if marker and not np.frombuffer(last.data.tobytes(), dtype=np.int16).any():
            events = events[:-1]
    return np.frombuffer(b"".join(ev.frame.data.tobytes() for ev in events), dtype=np.int16)


def same_audio(got, want, what):
    """Equal sample for sample (within 2 LSB of int16 rounding) and not silence."""
    check(len(got) == len(want), f"{what}: {len(got)} samples, reference {len(want)}")
    if len(got) == len(want) and len(want):
        diff = int(np.max(np.abs(got.astype(np.int32) - want.astype(np.int32))))
        rms = float(np.sqrt(np.mean(want.astype(np.float64) ** 2)))
        check(rms > 30, f"{what}: the reference is sound (rms {rms:.0f})")
        check(diff <= 2, f"{what}: equal to the reference decode (largest difference {diff})")


def check_events(events, sample_rate, what):
    check(len(events) > 0, f"{what}: {len(events)} audio events")
    if not events:
        return
    check(all(ev.frame.sample_rate == sample_rate and ev.frame.num_channels == 1 for ev in events),
          f"{what}: every frame mono at {sample_rate} Hz")
    check(len({ev.request_id for ev in events}) == 1 and events[0].request_id,
          f"{what}: one request id")
    check(events[-1].is_final and not any(ev.is_final for ev in events[:-1]),
          f"{what}: the last event alone is final")


async def test_synthesize(tts, speaker, refs):
    events = []
    async with tts.synthesize(FIRST) as chunked:
        async for ev in chunked:
            events.append(ev)
    frames, want = refs.audio(FIRST)
    check_events(events, speaker.sample_rate, "synthesize")
    got = pcm_of(events)
    check(speaker.frames_made == frames,
          f"synthesize: the talker made {speaker.frames_made} frames, the reference {frames}")
    check(len(got) == speaker.frames_made * speaker.decoder.samples_per_frame,
          f"synthesize: {len(got)} samples = frames_made x {speaker.decoder.samples_per_frame}")
    same_audio(got, want, "synthesize")


async def test_stream(tts, speaker, refs, counter):
    stream = tts.stream()
    events = []
    first_audio_frames = None
    first_audio = asyncio.Event()
    before_flush = None
    started = counter.frames
    text = FIRST + " " + SECOND
    pieces = [text[i:i + 7] for i in range(0, len(text), 7)]   # an LLM's deltas
    # The first sentence is complete once text after it arrives: up to "This is" here.
    held = len(FIRST + " This is") // 7 + 1

    async def push():
        nonlocal before_flush
        for piece in pieces[:held]:
            stream.push_text(piece)
            await asyncio.sleep(0.01)
        try:  # the rest of the text waits for the first sentence's first audio
            await asyncio.wait_for(first_audio.wait(), 30)
        except asyncio.TimeoutError:
            pass
        before_flush = first_audio.is_set()
        for piece in pieces[held:]:
            stream.push_text(piece)
            await asyncio.sleep(0.01)
        stream.flush()
        stream.end_input()

    pusher = asyncio.create_task(push())
    async with stream:
        async for ev in stream:
            if first_audio_frames is None:
                first_audio_frames = counter.frames - started
                first_audio.set()
            events.append(ev)
    await pusher
    (f1, a1), (f2, a2) = refs.audio(FIRST), refs.audio(SECOND)
    check_events(events, speaker.sample_rate, "stream")
    check(len({ev.segment_id for ev in events}) == 1 and events and events[0].segment_id,
          "stream: one segment (one flush) with an id")
    got = pcm_of(events)
    per_frame = speaker.decoder.samples_per_frame
    check(len(got) == (f1 + f2) * per_frame,
          f"stream: {len(got)} samples = ({f1} + {f2} frames) x {per_frame}")
    same_audio(got[:f1 * per_frame], a1, "stream, first sentence")
    same_audio(got[f1 * per_frame:], a2, "stream, second sentence")
    check(before_flush, "stream: the first sentence is heard before the rest of the text comes")
    check(first_audio_frames is not None and first_audio_frames < f1,
          f"stream: first audio after {first_audio_frames} frames of the first sentence's {f1}")
    return first_audio_frames


async def test_aclose(tts, speaker, refs, counter):
    stream = tts.stream()
    events, after = [], []
    closed = False
    heard = asyncio.Event()
    per_frame = speaker.decoder.samples_per_frame

    async def listen():
        async for ev in stream:
            (after if closed else events).append(ev)
            if sum(e.frame.samples_per_channel for e in events) >= 2 * per_frame:
                heard.set()

    listener = asyncio.create_task(listen())
    started = counter.frames
    stream.push_text(LONG)
    stream.flush()
    try:
        await asyncio.wait_for(heard.wait(), 60)
    except asyncio.TimeoutError:
        pass
    at_close = counter.frames - started
    check(heard.is_set(), f"aclose: two frames of audio heard, after {at_close} frames made")
    t0 = time.monotonic()
    await stream.aclose()
    close_s = time.monotonic() - t0
    closed = True
    at_return = counter.frames - started
    await asyncio.sleep(0.5)
    later = counter.frames - started
    listener.cancel()
    await asyncio.gather(listener, return_exceptions=True)
    check(at_return - at_close <= CANCEL_SLACK,
          f"aclose: the talker made {at_return - at_close} frames after aclose was called "
          f"({at_close} before), at most {CANCEL_SLACK}; aclose took {close_s:.2f} s")
    check(speaker.frames_made <= at_return,
          f"aclose: Speaker.frames_made {speaker.frames_made} <= {at_return}")
    check(later == at_return, f"aclose: no frame made after aclose returned ({later - at_return})")
    check(not after, f"aclose: nothing emitted after aclose ({len(after)} events)")
    left = speaker.decoder.pull(0.3)
    check(left is None, f"aclose: the decoder was flushed ({len(left or b'')} bytes left)")

    if later != at_return or left is not None:
        return at_close, at_return - at_close, close_s  # the talker runs on: a new stream waits
    whole = len(refs.frames(LONG))
    check(at_close + CANCEL_SLACK < whole,
          f"aclose: closed mid-sentence ({at_close} + {CANCEL_SLACK} of its {whole} frames)")

    # A new stream works, and starts with none of the cancelled utterance's audio.
    stream = tts.stream()
    stream.push_text(SECOND)
    stream.end_input()
    events = []
    async with stream:
        async for ev in stream:
            events.append(ev)
    frames, want = refs.audio(SECOND)
    check_events(events, speaker.sample_rate, "after aclose, a new stream")
    same_audio(pcm_of(events), want, "after aclose, a new stream")
    return at_close, at_return - at_close, close_s


async def main(talker_dir):
    from livekit.agents import Plugin
    from livekit.plugins import qwencodec

    installed(qwencodec, sys.modules[Speaker.__module__], script="tools/check-agents.sh")
    check([p.package for p in Plugin.registered_plugins].count("livekit.plugins.qwencodec") == 1,
          "the plugin registers itself with LiveKit once, as livekit.plugins.qwencodec")
    TTS = qwencodec.TTS

    speaker = Speaker(talker_dir, decoder_dir=DECODER)
    tts = TTS(speaker=speaker, voice=VOICE, seed=SEED, max_new_tokens=MAX_NEW_TOKENS)
    check(tts.capabilities.streaming and tts.sample_rate == 24000 and tts.num_channels == 1,
          "TTS: streaming, 24000 Hz, mono")
    counter = FrameCounter(speaker.model)
    refs = References(talker_dir, speaker.model)
    # A TTS that makes its own Speaker loads the talker as device, dtype and attn_implementation say.
    own = TTS(talker_dir, decoder_dir=DECODER, voice=VOICE, device="cpu", dtype="bfloat16",
              attn_implementation="eager")
    model = own.speaker.model
    check((str(model.device), model.dtype, model.config._attn_implementation)
          == ("cpu", torch.bfloat16, "eager"), "TTS(device, dtype, attn_implementation) reach the talker")
    await own.aclose()
    try:
        t0 = time.monotonic()
        await test_synthesize(tts, speaker, refs)
        first = await test_stream(tts, speaker, refs, counter)
        at_close, slack, close_s = await test_aclose(tts, speaker, refs, counter)
        print(f"livekit: first audio after {first} frames; aclose after {at_close} frames stopped "
              f"the talker within {slack} more in {close_s:.2f} s ({time.monotonic() - t0:.0f} s)")
    finally:
        counter.handle.remove()
        await tts.aclose()
        refs.close()
        speaker.close()


if __name__ == "__main__":
    faulthandler.dump_traceback_later(300, exit=True)  # a hang fails, with its stacks
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        talker = Path(tmp) / "cv"
        subprocess.run([sys.executable, str(ROOT / "tools" / "make_talker_fixture.py"),
                        "--kind", "custom_voice", "--out", str(talker)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        asyncio.run(main(talker))
    if failures:
        print(f"test_livekit: {len(failures)} FAILED", file=sys.stderr)
        sys.exit(1)
    print("test_livekit: ok")
