#!/usr/bin/env python3
"""QwenCodecTTSService (the pipecat-qwencodec package) under pipecat's own test helpers.

A plain script (asyncio.run, exit status 1 on any failure), run by tools/check-agents.sh with the
venv that tools/setup-packages.sh pip-installs the packages into. It drives the service with `pipecat.tests.utils.run_test` (the service between
pipecat's queued source and sink processors in a real PipelineWorker) and an observer, on the
tiny random CustomVoice talker (tools/make_talker_fixture.py, made in a temp folder unless
$QWENCODEC_TALKER_CV names one) and the bundled decoder tests/fixtures/release-tiny:

1. text in: TTSStartedFrame, audio frames, TTSStoppedFrame; the samples are frames_made x 1920
   and equal, byte for byte, the same seed's codes from upstream's `generate` (streamed by
   `qwencodec_talker.stream_codes`; the service speaks through our own loop) decoded by gst-launch-1.0
   (filesrc ! qwencodecdec, not through the service); the first audio leaves before the talker
   has made its last frame.
2. a barge-in (InterruptionFrame) mid-utterance: the talker stops within 2 frames of the frames
   it had made when the service took the interruption, its thread ends, no audio of that
   utterance comes after the InterruptionFrame, and the next run_tts speaks a whole utterance
   whose audio starts with the interrupted one's (the same seed: a fresh decoder after the flush).
3. TTFB: a MetricsFrame with the service's TTFBMetricsData, at least the time to the first audio
   and under half the utterance.
"""

import asyncio
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]

from pipecat.frames.frames import (  # noqa: E402
    InterruptionFrame,
    MetricsFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSUpdateSettingsFrame,
)
from pipecat.metrics.metrics import TTFBMetricsData  # noqa: E402
from pipecat.observers.base_observer import BaseObserver, FrameProcessed, FramePushed  # noqa: E402
from pipecat.pipeline.worker import PipelineParams  # noqa: E402
from pipecat.tests.utils import SleepFrame, run_test  # noqa: E402

from pipecat_qwencodec import QwenCodecTTSService  # noqa: E402
from qwencodec_talker import generate_kwargs, stream_codes  # noqa: E402
from qwencodec_talker.prompt import prompt  # noqa: E402
from qwencodec_talker.speech import Speaker  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from installed import installed  # noqa: E402

DECODER = ROOT / "tests" / "fixtures" / "release-tiny"
SAMPLES_PER_FRAME = 1920
# Seeds for upstream's defaults (CustomVoice: non_streaming_mode) on the tiny talker.
SHORT = ("Hello there.", 11)  # text, seed: 14 frames, ends on EOS
LONG = ("Hello from the pipecat test, a longer sentence to say.", 14)  # 126 frames uninterrupted


installed(sys.modules[QwenCodecTTSService.__module__], sys.modules[Speaker.__module__],
          script="tools/check-agents.sh")


class Steps:
    """Counts the talker's steps (its codec head runs once a step, on either loop; the prefill is
    one): at N steps the talker has made N - 1 frames, and may be making the Nth."""

    def __init__(self, model):
        self.count = 0
        self.handle = model.talker.codec_head.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        self.count += 1


class Watch(BaseObserver):
    """What the service pushes and when, with the talker's steps at that moment."""

    def __init__(self, service, steps):
        super().__init__()
        self.service, self.steps = service, steps
        self.pushed = []  # (monotonic time, talker steps, frame)
        self.interrupted_at_steps = None
        self.received = set()  # ids of the frames the service was given (passed on, not made)

    async def on_push_frame(self, data: FramePushed):
        if data.source is self.service:
            self.pushed.append((time.monotonic(), self.steps.count, data.frame))

    async def on_process_frame(self, data: FrameProcessed):
        if data.processor is self.service:
            self.received.add(id(data.frame))
        if data.processor is self.service and isinstance(data.frame, InterruptionFrame):
            if self.interrupted_at_steps is None:
                self.interrupted_at_steps = self.steps.count


def tts_frames(frames):
    return [f for f in frames if isinstance(f, (TTSStartedFrame, TTSAudioRawFrame, TTSStoppedFrame))]


def shape(frames):
    """The TTS frames as a string: S (started), A (audio), T (stopped)."""
    letters = {TTSStartedFrame: "S", TTSAudioRawFrame: "A", TTSStoppedFrame: "T"}
    return "".join(letters[type(f)] for f in tts_frames(frames))


def reference_audio(speaker, tmp, text, seed, max_new_tokens):
    """The same seed's codes from upstream's generate (qwencodec_talker.stream_codes), decoded by
    gst-launch-1.0: not the service, whose Speaker runs our own loop.

    One frame a decode step (max-step-frames=1), as the service's decoder takes the talker's
    frames one by one; a step of several frames rounds a few samples 1 LSB apart."""
    model = speaker.model
    frames = list(stream_codes(model, **prompt(model, speaker.processor, text, speaker="vivian"), seed=seed,
                               **generate_kwargs(model, max_new_tokens=max_new_tokens)))
    codes, audio = Path(tmp) / "codes.raw", Path(tmp) / "audio.raw"
    codes.write_bytes(b"".join(int(c).to_bytes(2, "little", signed=True)
                               for frame in frames for c in frame))
    subprocess.run(
        ["gst-launch-1.0", "-q", "filesrc", f"location={codes}",
         "!", "audio/x-qwen3-tts-codes,codebooks=16,framerate=25/2",
         "!", "qwencodecdec", f"model-path={DECODER}", "device=cpu",
         "max-step-frames=1",
         "!", "audio/x-raw,format=S16LE,channels=1", "!", "filesink", f"location={audio}"],
        check=True, timeout=60)
    return len(frames), audio.read_bytes()


def pcm(audio):
    return np.frombuffer(audio, dtype="<i2").astype(np.int32)


class LoopLag:
    """The longest the event loop was late for a 10 ms sleep: the talker must not block it."""

    async def __aenter__(self):
        self.worst = 0.0
        self.task = asyncio.create_task(self._tick())
        return self

    async def _tick(self):
        while True:
            t = time.monotonic()
            await asyncio.sleep(0.01)
            self.worst = max(self.worst, time.monotonic() - t - 0.01)

    async def __aexit__(self, *exc):
        self.task.cancel()


async def test_text_in_audio_out(speaker, tmp):
    text, seed = SHORT
    service = QwenCodecTTSService(speaker=speaker, settings=QwenCodecTTSService.Settings(
        voice="vivian", seed=seed, max_new_tokens=60))
    steps = Steps(speaker.model)
    watch = Watch(service, steps)
    started = time.monotonic()
    try:
        async with LoopLag() as lag:
            down, _ = await run_test(service, frames_to_send=[TTSSpeakFrame(text)],
                                     observers=[watch],
                                     pipeline_params=PipelineParams(enable_metrics=True))
    finally:
        steps.handle.remove()
    assert await service.wait_for_talker(5), "the talker thread did not end"
    (utterance,) = service.utterances
    made = utterance.frames_made
    assert shape(down) == "S" + "A" * (len(shape(down)) - 2) + "T" and "A" in shape(down), shape(down)
    audio_frames = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    assert all(f.sample_rate == speaker.sample_rate == 24000 and f.num_channels == 1
               for f in audio_frames)
    audio = b"".join(f.audio for f in audio_frames)
    assert made > 1 and not utterance.cancelled and speaker.frames_made == made, utterance
    assert len(audio) // 2 == made * SAMPLES_PER_FRAME, (len(audio) // 2, made)
    assert len(audio_frames) >= 2, "the audio came in one piece"

    ref_frames, ref_audio = reference_audio(speaker, tmp, text, seed, 60)
    differ = int((pcm(audio) != pcm(ref_audio)).sum()) if len(audio) == len(ref_audio) else None
    assert ref_frames == made, (ref_frames, made)
    assert abs(pcm(ref_audio)).max() > 1000, "the reference decode is silent"
    ours, theirs = pcm(audio), pcm(ref_audio)
    off = int(abs(ours - theirs).max())
    assert off <= 1, f"the service's audio differs from gst-launch's decode by up to {off}"

    pushed_audio = [(t, s) for t, s, f in watch.pushed if isinstance(f, TTSAudioRawFrame)]
    _, first_steps = pushed_audio[0]
    last_t, _ = pushed_audio[-1]

    # 3. TTFB, reported as pipecat's services report it: the service's own MetricsFrame (the
    # worker's first one, passed on, holds a zero for every processor), reaching the sink.
    ttfbs = [d.value for _, _, f in watch.pushed
             if isinstance(f, MetricsFrame) and id(f) not in watch.received for d in f.data
             if isinstance(d, TTFBMetricsData) and d.processor == service.name]
    assert len(ttfbs) == 1, ttfbs
    ttfb, span = ttfbs[0], last_t - started
    assert any(isinstance(d, TTFBMetricsData) and d.value == ttfb
               for f in down if isinstance(f, MetricsFrame) for d in f.data)
    # At the first audio, not the last: that it left while the talker still spoke is counted in
    # talker steps below (a time bound on a short utterance failed under load).
    assert utterance.first_audio_s - 0.005 <= ttfb < span, (ttfb, utterance.first_audio_s, span)

    # Streaming: the first audio left while the talker was still making frames.
    assert first_steps <= made - 2, f"first audio after {first_steps} talker steps of {made + 1}"
    assert lag.worst < 0.5, f"the event loop stalled {lag.worst:.2f} s while the talker spoke"
    return dict(frames=made, differ=differ, lag=round(lag.worst, 3), chunks=len(audio_frames),
                ttfb=ttfb, first_steps=first_steps, wall=last_t - started)


async def test_interruption(speaker):
    text, seed = LONG
    service = QwenCodecTTSService(speaker=speaker, settings=QwenCodecTTSService.Settings(
        voice="vivian", seed=seed, max_new_tokens=400))
    steps = Steps(speaker.model)
    watch = Watch(service, steps)
    second_frames = 15
    try:
        down, _ = await run_test(service, observers=[watch], frames_to_send=[
            TTSSpeakFrame(text),
            SleepFrame(sleep=1.5),
            InterruptionFrame(),
            SleepFrame(sleep=0.1),
            TTSUpdateSettingsFrame(delta=QwenCodecTTSService.Settings(
                max_new_tokens=second_frames + 1)),
            TTSSpeakFrame(text),
        ])
    finally:
        steps.handle.remove()
    ended = await service.wait_for_talker(10)
    assert ended, "the talker thread was still running 10 s after the utterance"
    first, second = service.utterances
    at = watch.interrupted_at_steps
    assert at is not None, "the service never took the InterruptionFrame"
    # At `at` talker steps (the prefill is one) the talker had made at - 1 frames.
    assert first.cancelled, first
    assert 1 <= first.frames_made <= (at - 1) + 2, (first.frames_made, at)
    assert first.frames_made < 399, "the utterance ended before the interruption"

    cut = next(i for i, f in enumerate(down) if isinstance(f, InterruptionFrame))
    before, after = down[:cut], down[cut + 1:]
    heard = b"".join(f.audio for f in before if isinstance(f, TTSAudioRawFrame))
    assert all(f.context_id == first.context_id for f in before if isinstance(f, TTSAudioRawFrame))
    assert heard, "no audio before the interruption: it was not mid-utterance"
    assert (len(heard) // 2) % SAMPLES_PER_FRAME == 0, len(heard)
    late = [f for f in after if isinstance(f, TTSAudioRawFrame) and f.context_id != second.context_id]
    assert not late, f"{len(late)} audio frames of the interrupted utterance after the interruption"
    assert shape(after) == "S" + "A" * (len(shape(after)) - 2) + "T", shape(after)

    assert not second.cancelled and second.frames_made == second_frames, second
    again = b"".join(f.audio for f in after if isinstance(f, TTSAudioRawFrame))
    assert len(again) // 2 == second.frames_made * SAMPLES_PER_FRAME, (len(again), second)
    # The same text and seed: the interrupted audio is a prefix of the whole one.
    n = min(len(heard), len(again))
    assert n >= SAMPLES_PER_FRAME * 2 and heard[:n] == again[:n], \
        "the next utterance's audio does not start as the interrupted one did"
    return dict(at=at - 1, made=first.frames_made, heard=len(heard) // 2 // SAMPLES_PER_FRAME,
                second=second.frames_made)


async def test_model_options(talker_dir):
    """The service's own Speaker loads the talker as device, dtype and attn_implementation say."""
    service = QwenCodecTTSService(model_dir=talker_dir, decoder_dir=DECODER, device="cpu",
                                  dtype="bfloat16", attn_implementation="eager")
    try:
        model = service.speaker.model
        got = (str(model.device), model.dtype, model.config._attn_implementation)
        assert got == ("cpu", torch.bfloat16, "eager"), f"the service's talker is {got}"
    finally:
        await service.cleanup()
    assert service.speaker is None, "cleanup did not close the Speaker the service made"
    return dict(dtype="bfloat16", attn="eager")


async def main(talker_dir, tmp):
    failures = []
    t0 = time.monotonic()
    speaker = Speaker(talker_dir, decoder_dir=DECODER)
    loaded = time.monotonic() - t0
    results = {}
    try:
        for name, test in (("text in, audio out, TTFB", lambda: test_text_in_audio_out(speaker, tmp)),
                           ("interruption", lambda: test_interruption(speaker)),
                           ("device, dtype, attention", lambda: test_model_options(talker_dir))):
            t = time.monotonic()
            try:
                results[name] = await test()
                print(f"ok   {name} ({time.monotonic() - t:.1f} s): {results[name]}", flush=True)
            except Exception:
                traceback.print_exc()
                failures.append(name)
                print(f"FAIL {name} ({time.monotonic() - t:.1f} s)", flush=True)
    finally:
        speaker.close()
    if failures:
        return failures
    one, two = results["text in, audio out, TTFB"], results["interruption"]
    print(f"pipecat: ok, {one['frames']} frames in {one['chunks']} audio frames equal to "
          f"gst-launch's decode ({one['differ']} samples 1 LSB apart), TTFB {one['ttfb'] * 1000:.0f} ms; barge-in at frame {two['at']} "
          f"stopped the talker at {two['made']}, then {two['second']} frames "
          f"(talker loaded in {loaded:.1f} s)")
    return failures


def run():
    with tempfile.TemporaryDirectory(prefix="qwencodec-pipecat-") as tmp:
        talker = os.environ.get("QWENCODEC_TALKER_CV")
        if not talker:
            talker = f"{tmp}/cv"
            subprocess.run([sys.executable, str(ROOT / "tools" / "make_talker_fixture.py"),
                            "--kind", "custom_voice", "--out", talker],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        failures = asyncio.run(main(talker, tmp))
    if failures:
        print(f"pipecat: FAILED {', '.join(failures)}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run())
