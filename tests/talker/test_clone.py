#!/usr/bin/env python3
"""Voice cloning on the tiny Base talker: a reference WAV made here, through upstream's encoders.

A tiny random speech tokenizer with an encoder (upstream's Qwen3TTSTokenizerV2Model, a Mimi
encoder of width 32, 16 codebooks of 2048, its codebooks random) is built into a temp folder
beside a copy of the tiny Base talker, and a 2 s reference WAV (a tone and noise, 24 kHz 16-bit)
is written. `qwencodec_talker.clone.voice_clone_prompt` on it, through `prompt.prompt` and the
default loop's `stream_frames`, must give the codes upstream's wrapper gives for the same call,
`Qwen3TTSModel.generate_voice_clone(text, ref_audio=WAV, ref_text=…)` (its speech tokenizer's
decode replaced by one that keeps the codes): ICL greedy and seeded sampling, the x-vector alone
greedy; so must the command line's `--ref-audio --ref-text`, and `qwencodec-speech serve
--voice ref=WAV --voice-text ref=…`'s pcm must be those codes decoded by gst-launch-1.0, as must
the audio of pipecat's `QwenCodecTTSService` and LiveKit's `TTS` given `ref_audio` and `ref_text`. The reference's codes must not be
constant and a second recording must give another speaker embedding, so the encoders are used.

    python tests/talker/test_clone.py FIXTURE_ROOT   (holds base/)

with the python of the venv that tools/setup-packages.sh pip-installs the package into
(tools/check-talker.sh).
"""

import json
import shutil
import struct
import subprocess
import sys
import tempfile
import urllib.request
import wave
from pathlib import Path

import numpy as np
import torch

import qwencodec_talker as qt
from qwencodec_talker.__main__ import main as cli
from qwencodec_talker.clone import load_speech_tokenizer, voice_clone_prompt
from qwencodec_talker.prompt import load_processor, prompt
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from installed import installed  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TEXT = "A cloned voice says this."
REF_TEXT = "The words of the reference."
MAX_NEW = 30
DECODER = ROOT / "tests" / "fixtures" / "release-tiny"


installed(qt, script="tools/check-talker.sh")


def make_speech_tokenizer(folder):
    """A tiny random speech tokenizer in the published layout, its encoder usable."""
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    decoder = json.loads((ROOT / "tests" / "fixtures" / "release-tiny" / "config.json").read_text())["decoder_config"]
    encoder = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                   intermediate_size=64, num_filters=4, codebook_size=2048, codebook_dim=16, num_quantizers=16,
                   num_semantic_quantizers=1, frame_rate=12.5, sampling_rate=24000, upsampling_ratios=[8, 6, 5, 4],
                   sliding_window=16, max_position_embeddings=512, upsample_groups=32,
                   vector_quantization_hidden_dimension=16)
    config = Qwen3TTSTokenizerV2Config(encoder_config=encoder, decoder_config=decoder, encoder_valid_num_quantizers=16,
                                       input_sample_rate=24000, output_sample_rate=24000,
                                       decode_upsample_rate=1920, encode_downsample_rate=1920)
    torch.manual_seed(0)
    model = Qwen3TTSTokenizerV2Model(config).eval()
    g = torch.Generator().manual_seed(1)
    for name, buffer in model.encoder.named_buffers():
        # Mimi's codebooks are running means (embed_sum / cluster_usage), zero when made.
        if name.endswith("embed_sum"):
            buffer.copy_(torch.randn(buffer.shape, generator=g))
        elif name.endswith(("cluster_usage", "initialized")):
            buffer.fill_(1.0)
    model.save_pretrained(folder)
    (Path(folder) / "preprocessor_config.json").write_text(json.dumps(
        {"feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1, "sampling_rate": 24000,
         "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True,
         "chunk_length_s": None, "overlap": None}))


def write_wav(path, hz, seed, seconds=2.0, rate=24000):
    t = np.arange(int(rate * seconds)) / rate
    x = 0.3 * np.sin(2 * np.pi * hz * t) + 0.05 * np.random.default_rng(seed).standard_normal(len(t))
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())


class Keeper:
    """Upstream's speech tokenizer for the wrapper: its encoder, and a decode that keeps the codes
    (the wrapper decodes with it; the element's job here)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, *args, **kwargs):
        return self.tokenizer.encode(*args, **kwargs)

    def decode(self, items):
        self.codes = [item["audio_codes"] for item in items]
        return [np.zeros(1, dtype=np.float32) for _ in items], 24000


def endpoint_audio(talker, reference, tmp, frames):
    """`qwencodec-speech serve` with the voice `ref` cloned from `reference`: (its pcm for TEXT,
    seed 6; `frames` decoded by gst-launch-1.0)."""
    codes, decoded = tmp / "clone-codes.raw", tmp / "clone-audio.raw"
    codes.write_bytes(b"".join(struct.pack("<16h", *f) for f in frames))
    subprocess.run(["gst-launch-1.0", "-q", "filesrc", f"location={codes}",
                    "!", "audio/x-qwen3-tts-codes,codebooks=16,framerate=25/2",
                    "!", "qwencodecdec", f"model-path={DECODER}", "device=cpu", "max-step-frames=1",
                    "!", "audio/x-raw,format=S16LE,channels=1", "!", "filesink", f"location={decoded}"],
                   check=True, timeout=60)
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "qwencodec-speech"), "serve", "--model", str(talker),
         "--decoder", str(DECODER), "--port", "0", "--voice", f"ref={reference}", "--voice-text", f"ref={REF_TEXT}",
         "--seed", "6", "--max-new-tokens", str(MAX_NEW), "--threads", "1"],
        stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in server.stderr:
            if line.startswith("qwencodec-speech: serving "):
                port = int(line.split("/v1/")[0].rsplit(":", 1)[1])
                break
        if port is None:
            raise AssertionError("qwencodec-speech did not start")
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/audio/speech", method="POST",
            data=json.dumps(dict(model="qwen3-tts", input=TEXT, voice="ref", response_format="pcm")).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            audio = response.read()
    finally:
        server.terminate()
        server.wait(30)
    return audio, decoded.read_bytes()


def adapters_audio(talker, reference):
    """[(name, pcm)] of pipecat's QwenCodecTTSService and LiveKit's TTS, each made with
    `ref_audio=reference, ref_text=REF_TEXT`, speaking TEXT with seed 6 on one Speaker."""
    import asyncio

    from livekit.plugins.qwencodec import TTS
    from pipecat.frames.frames import TTSAudioRawFrame, TTSSpeakFrame
    from pipecat.tests.utils import run_test
    from pipecat_qwencodec import QwenCodecTTSService
    from qwencodec_talker.speech import Speaker

    async def livekit(speaker):
        tts = TTS(speaker=speaker, ref_audio=str(reference), ref_text=REF_TEXT, seed=6, max_new_tokens=MAX_NEW)
        async with tts.synthesize(TEXT) as stream:
            events = [event async for event in stream]
        await tts.aclose()
        # LiveKit's end-of-segment marker: 10 ms of silence marked final (tests/agents/test_livekit.py).
        if events and events[-1].is_final and events[-1].frame.samples_per_channel == 240 \
                and not any(events[-1].frame.data.tobytes()):
            events = events[:-1]
        return b"".join(event.frame.data.tobytes() for event in events)

    async def pipecat(speaker):
        service = QwenCodecTTSService(speaker=speaker, ref_audio=str(reference), ref_text=REF_TEXT,
                                      sampling=dict(max_new_tokens=MAX_NEW),
                                      settings=QwenCodecTTSService.Settings(seed=6))
        down, _ = await run_test(service, frames_to_send=[TTSSpeakFrame(TEXT)])
        return b"".join(frame.audio for frame in down if isinstance(frame, TTSAudioRawFrame))

    with Speaker(talker, decoder_dir=DECODER) as speaker:
        return [("pipecat's QwenCodecTTSService", asyncio.run(pipecat(speaker))),
                ("LiveKit's TTS", asyncio.run(livekit(speaker)))]


def max_difference(a, b):
    a = np.frombuffer(a, dtype="<i2").astype(np.int32)
    b = np.frombuffer(b, dtype="<i2").astype(np.int32)
    return int(np.abs(a - b).max())


def main():
    from qwen_tts.inference.qwen3_tts_model import Qwen3TTSModel

    torch.set_num_threads(1)
    failures = []

    def check(what, ok, detail=""):
        print(f"{'ok' if ok else 'FAILED'}: {what}{' ' + detail if detail else ''}")
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory(prefix="qwencodec-clone-") as tmp:
        talker = Path(tmp) / "base"
        shutil.copytree(Path(sys.argv[1]) / "base", talker)
        make_speech_tokenizer(talker / "speech_tokenizer")
        reference, other = Path(tmp) / "reference.wav", Path(tmp) / "other.wav"
        write_wav(reference, 220, 0)
        write_wav(other, 523, 1)

        model = qt.load_model(talker)
        processor = load_processor(talker)
        keeper = Keeper(load_speech_tokenizer(talker / "speech_tokenizer"))
        wrapper = Qwen3TTSModel(model, processor, model.generate_config)

        icl = voice_clone_prompt(model, str(reference), ref_text=REF_TEXT, talker_dir=talker)
        ref_code = icl.ref_code
        check("the reference's codes come from the encoder, not constant",
              ref_code is not None and ref_code.shape == (25, 16) and len(set(ref_code.flatten().tolist())) > 16,
              f"({None if ref_code is None else tuple(ref_code.shape)})")
        second = voice_clone_prompt(model, str(other), x_vector_only_mode=True)
        check("another recording, another speaker embedding",
              not torch.equal(second.ref_spk_embedding, icl.ref_spk_embedding))

        runs = 0
        for name, call, ours, greedy, seed in (
                ("ICL, greedy", dict(ref_text=REF_TEXT), dict(ref_text=REF_TEXT), True, 3),
                ("ICL, sampled", dict(ref_text=REF_TEXT), dict(ref_text=REF_TEXT), False, 4),
                ("x-vector only, greedy", dict(x_vector_only_mode=True), dict(x_vector_only_mode=True), True, 5)):
            model.load_speech_tokenizer(keeper)
            torch.manual_seed(seed)
            wrapper.generate_voice_clone(TEXT, ref_audio=str(reference), max_new_tokens=MAX_NEW, **call,
                                         **(dict(do_sample=False, subtalker_dosample=False) if greedy else {}))
            item = voice_clone_prompt(model, str(reference), **ours)
            held = 0 if item.ref_code is None else len(item.ref_code)  # ICL: the wrapper decodes the reference too
            expected = keeper.codes[0][held:].tolist()
            streamed = list(qt.stream_frames(model, seed=seed, **prompt(model, processor, TEXT, voice_clone_prompt=item),
                                             **qt.generate_kwargs(model, greedy=greedy, max_new_tokens=MAX_NEW)))
            runs += 1
            check(f"{name}: the codes of generate_voice_clone", expected and streamed == expected,
                  f"({len(streamed)} streamed, {len(expected)} from the wrapper)")

        model.load_speech_tokenizer(keeper)
        torch.manual_seed(6)
        wrapper.generate_voice_clone(TEXT, ref_audio=str(reference), ref_text=REF_TEXT, max_new_tokens=MAX_NEW)
        expected = keeper.codes[0][len(ref_code):].tolist()
        raw = Path(tmp) / "codes.raw"
        cli(["--model", str(talker), "--text", TEXT, "--ref-audio", str(reference), "--ref-text", REF_TEXT,
             "--seed", "6", "--max-new-tokens", str(MAX_NEW), "--out", str(raw)])
        data = raw.read_bytes()
        check("the command line's --ref-audio --ref-text: generate_voice_clone's codes",
              expected and data == b"".join(struct.pack("<16h", *f) for f in expected),
              f"({len(data) // 32} frames, the wrapper {len(expected)})")

        # The endpoint: a voice cloned at start from the same WAV and transcript; its audio is the
        # wrapper's codes (seed 6, above) decoded by gst-launch-1.0, a frame a step.
        audio, decoded = endpoint_audio(talker, reference, Path(tmp), expected)
        check("qwencodec-speech --voice --voice-text: generate_voice_clone's codes decoded",
              len(audio) == len(decoded) and len(decoded) > 0 and max_difference(audio, decoded) <= 1,
              f"({len(audio)} bytes, the decode {len(decoded)})")
        # The adapters, each cloning the same WAV with the same transcript.
        for name, pcm in adapters_audio(talker, reference):
            check(f"{name}(ref_audio, ref_text): generate_voice_clone's codes decoded",
                  len(pcm) == len(decoded) and max_difference(pcm, decoded) <= 1,
                  f"({len(pcm)} bytes, the decode {len(decoded)})")
        try:
            prompt(model, processor, TEXT)
            check("a Base prompt without a voice is refused", False)
        except ValueError as error:
            check("a Base prompt without a voice is refused naming what it needs", "voice_clone_prompt" in str(error))

    print(f"talker clone: {runs + 1} runs against generate_voice_clone, the endpoint and both adapters; "
          f"{'FAILED ' + ', '.join(failures) if failures else 'all ok'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
