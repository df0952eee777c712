"""Text in, audio out, in this process: the talker's frames into appsrc ! qwencodecdec ! appsink.

`Speaker(talker_dir).speak(text)` yields 16-bit mono PCM as each decode step finishes, while the
talker is still generating; the pipecat and LiveKit integrations are built on it. It needs
GStreamer's Python bindings (Debian's python3-gi, seen by a venv made with
--system-site-packages) and the plugin where GStreamer finds it (docs/talker.md).
"""

import json
import threading
from pathlib import Path

import torch

from . import generate_kwargs, load_model, stream_frames
from .pipeline import CodesPipeline
from .prompt import load_processor, prompt

__all__ = ["Decoder", "Speaker", "decoder_geometry"]


def decoder_geometry(model_dir):
    """(codebooks, frame rate as (num, den), sample rate, samples per frame) from the speech
    tokenizer's config.json (its folder, or a checkpoint holding speech_tokenizer/)."""
    folder = Path(model_dir)
    if (folder / "speech_tokenizer").is_dir():
        folder = folder / "speech_tokenizer"
    config = json.loads((folder / "config.json").read_text())
    codebooks = config["decoder_config"].get("num_quantizers", 16)
    rate, per_frame = config["output_sample_rate"], config["decode_upsample_rate"]
    return codebooks, (rate, per_frame), rate, per_frame


class Decoder(CodesPipeline):
    """appsrc ! qwencodecdec ! appsink, one utterance at a time: `push` frames, `drain` at the
    utterance's end (the element's qwencodec-drain event: its held-back frames are decoded, the
    next frame starts a fresh decode), `flush` to drop everything not yet pulled (barge-in)."""

    def __init__(self, model_dir, *, chunk_frames=None, device="cpu", plugin_dir=None):
        codebooks, frame_rate, self.sample_rate, self.samples_per_frame = decoder_geometry(model_dir)
        decoder = {"model-path": str(model_dir), "device": device}
        if chunk_frames is not None:
            decoder["chunk-frames"] = chunk_frames
        super().__init__(
            "qwencodecdec name=decoder ! audioconvert ! appsink name=audio sync=false "
            "caps=audio/x-raw,format=S16LE,channels=1",
            properties={"decoder": decoder}, codebooks=codebooks, frame_rate=frame_rate,
            plugin_dir=plugin_dir, what="the decoder")
        self.appsink = self.pipeline.get_by_name("audio")

    def drain(self):
        Gst = self.Gst
        self.appsrc.send_event(Gst.Event.new_custom(
            Gst.EventType.CUSTOM_DOWNSTREAM, Gst.Structure.new_empty("qwencodec-drain")))

    def pull(self, timeout_s):
        """The next decoded audio (bytes, S16LE mono), or None after `timeout_s`."""
        sample = self.appsink.try_pull_sample(int(timeout_s * self.Gst.SECOND))
        if sample is None:
            error = self.error()
            if error:
                raise RuntimeError(error)
            return None
        buffer = sample.get_buffer()
        return buffer.extract_dup(0, buffer.get_size())

    def flush(self):
        """Drops every frame and sample not yet pulled; the next frame starts a fresh decode."""
        Gst = self.Gst
        self.appsrc.send_event(Gst.Event.new_flush_start())
        self.appsrc.send_event(Gst.Event.new_flush_stop(True))
        self.frames = 0


class Speaker:
    """A talker and an in-process qwencodecdec: text in, audio out as each step finishes.

    talker_dir: a Qwen3-TTS 12 Hz checkpoint folder (published layout); decoder_dir: its
    speech tokenizer (default talker_dir/speech_tokenizer). device ("cpu", "cuda", "cuda:N") is
    the talker's and the decoder's; dtype (a torch dtype or "float32", "bfloat16", "float16")
    and attn_implementation the talker's, as load_model takes them; loop the generation loop
    (qwencodec_talker.LOOPS: "own", or "upstream" for checking). One `speak` at a time.
    """

    def __init__(self, talker_dir, *, decoder_dir=None, chunk_frames=None, device="cpu",
                 dtype=torch.float32, attn_implementation=None, plugin_dir=None, loop="own"):
        self.talker_dir = Path(talker_dir)
        self.model = load_model(self.talker_dir, dtype=dtype, device=device,
                                attn_implementation=attn_implementation)
        self.processor = load_processor(self.talker_dir)
        self.decoder = Decoder(decoder_dir or self.talker_dir / "speech_tokenizer",
                               chunk_frames=chunk_frames, device=device, plugin_dir=plugin_dir)
        self.sample_rate = self.decoder.sample_rate
        self.loop = loop
        self.frames_made = 0
        self._lock = threading.Lock()

    def speak(self, text, *, speaker=None, instruct=None, language=None, non_streaming_mode=None,
              voice_clone_prompt=None, seed=None, greedy=False, cancel=None, **sampling):
        """Yields bytes of S16LE mono audio at `sample_rate` as the decoder makes them.

        The prompt is upstream's wrapper method's for the model's kind (`prompt.prompt`:
        speaker, instruct, language and non_streaming_mode as it takes them, None its defaults;
        a Base checkpoint's voice_clone_prompt from `clone.voice_clone_prompt`).
        The utterance's audio is exactly the talker's frames decoded (samples_per_frame each).
        Stopping early (closing the generator, or setting the threading.Event `cancel`) stops
        the talker before its next step and drops the decoder's queued frames and audio.
        `seed` seeds this utterance's own sampling (on the "own" loop, a torch.Generator of
        its own: no other stream's randomness is touched). `sampling`: upstream's options (temperature, top_k, top_p, repetition_penalty,
        max_new_tokens, subtalker_*).
        """
        with self._lock:
            words = prompt(self.model, self.processor, text, speaker=speaker, instruct=instruct,
                           language=language, non_streaming_mode=non_streaming_mode,
                           voice_clone_prompt=voice_clone_prompt)
            yield from self._speak(words, seed, greedy, cancel, sampling)

    def _speak(self, words, seed, greedy, cancel, sampling):
        stop = threading.Event()
        decoder = self.decoder
        progress = {"frames": 0, "done": False, "error": None}
        options = generate_kwargs(self.model, greedy=greedy, **sampling)

        def talk():
            try:
                for frame in stream_frames(self.model, loop=self.loop, seed=seed, cancel=stop,
                                           **words, **options):
                    decoder.push(frame)
                    progress["frames"] += 1
                    self.frames_made = progress["frames"]
                if not stop.is_set():
                    decoder.drain()
            except BaseException as error:  # handed to the consumer
                progress["error"] = error
            finally:
                progress["done"] = True

        self.frames_made = 0
        talker = threading.Thread(target=talk, name="qwencodec-speaker", daemon=True)
        talker.start()
        samples = 0
        finished = False
        try:
            while not (cancel is not None and cancel.is_set()):
                audio = decoder.pull(0.02)
                if audio is not None:
                    samples += len(audio) // 2
                    yield audio
                if progress["error"] is not None:
                    raise progress["error"]
                if progress["done"] and samples >= progress["frames"] * decoder.samples_per_frame:
                    finished = True
                    break
        finally:
            stop.set()
            talker.join()
            self.frames_made = progress["frames"]
            if not finished:
                decoder.flush()

    def close(self):
        self.decoder.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
