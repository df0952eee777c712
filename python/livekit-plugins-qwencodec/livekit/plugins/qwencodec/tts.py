"""The LiveKit Agents TTS (livekit-agents 1.8.9) on `qwencodec_talker.speech.Speaker`.

The talker runs in this process and its frames are decoded by qwencodecdec as they are made; the
audio of each decode step is pushed to LiveKit's AudioEmitter ("audio/pcm", mono, the decoder's
sample rate: 24000 for the released model) as soon as the step finishes.

- `synthesize(text)` (a ChunkedStream) speaks the whole text as one utterance.
- `stream()` (a SynthesizeStream, `capabilities.streaming`) cuts the pushed text into sentences
  with LiveKit's own sentence tokenizer (by default the blingfire one its AgentSession puts in
  front of a non-streaming TTS) and speaks each sentence as soon as the tokenizer hands it out,
  while the text after it is still coming; a flush ends the segment.
- Closing a stream (`aclose()`, which is how an AgentSession interrupts speech) sets the
  Speaker's cancel: the talker stops before its next step and the decoder drops what it holds;
  `aclose()` returns once that is done.

Each utterance is a `qwencodec_talker.bridge.Utterance`: `Speaker.speak` in a thread of its own,
its audio handed to the event loop as it comes.
"""

from __future__ import annotations

import asyncio

from livekit.agents import APIConnectOptions, APIError, tokenize, tts, utils
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, NotGivenOr

from qwencodec_talker.bridge import Utterance
from qwencodec_talker.clone import voice_clone_prompt
from qwencodec_talker.speech import Speaker

__all__ = ["TTS", "ChunkedStream", "SynthesizeStream"]


class TTS(tts.TTS):
    """Qwen3-TTS through qwencodecdec, as a LiveKit TTS.

    talker_dir: a Qwen3-TTS 12 Hz checkpoint folder (published layout); or `speaker`, a
    `qwencodec_talker.speech.Speaker` already made (then it is not closed by `aclose`).
    voice: the CustomVoice speaker name (Speaker.speak's `speaker`, e.g. "vivian"); instruct:
    a VoiceDesign instruction (or a 1.7B CustomVoice's); language (None: upstream's "Auto"),
    seed, greedy, non_streaming_mode (None: upstream's wrapper's default for the model's kind)
    and `sampling` (temperature, top_k, top_p,
    repetition_penalty, max_new_tokens, subtalker_*) go to every `speak`.
    ref_audio (a WAV path, a URL, base64, or (samples, rate)) with ref_text (its transcript; or
    x_vector_only_mode): a Base checkpoint's voice, cloned once here through upstream's encoders
    (`qwencodec_talker.clone.voice_clone_prompt`) and spoken by every `speak`.
    decoder_dir, chunk_frames, device, dtype, attn_implementation, plugin_dir, loop: Speaker's,
    when it is made here (device "cpu", "cuda", "cuda:N"; dtype "float32", "bfloat16", "float16";
    attn_implementation "eager", "sdpa", "flash_attention_2", None for transformers' choice;
    loop "own", qwencodec_talker.loop, or "upstream", upstream's generate, for checking).
    sentence_tokenizer: how `stream()` cuts text (default
    `tokenize.blingfire.SentenceTokenizer(retain_format=True)`, as AgentSession's StreamAdapter).
    """

    def __init__(self, talker_dir=None, *, speaker: Speaker | None = None, voice: str | None = None,
                 instruct: str | None = None, language: str | None = None, seed: int | None = None,
                 greedy: bool = False, ref_audio=None, ref_text: str | None = None,
                 x_vector_only_mode: bool = False, decoder_dir=None, chunk_frames: int | None = None,
                 device: str = "cpu", dtype="float32", attn_implementation: str | None = None,
                 plugin_dir=None, loop: str = "own",
                 sentence_tokenizer: NotGivenOr[tokenize.SentenceTokenizer] = NOT_GIVEN,
                 **sampling) -> None:
        if (speaker is None) == (talker_dir is None):
            raise ValueError("give a talker_dir or a Speaker, not both")
        self._owns_speaker = speaker is None
        if speaker is None:
            speaker = Speaker(talker_dir, decoder_dir=decoder_dir, chunk_frames=chunk_frames,
                              device=device, dtype=dtype, attn_implementation=attn_implementation,
                              plugin_dir=plugin_dir, loop=loop)
        self._speaker = speaker
        super().__init__(capabilities=tts.TTSCapabilities(streaming=True),
                         sample_rate=speaker.sample_rate, num_channels=1)
        self._options = dict(speaker=voice, instruct=instruct, language=language, seed=seed,
                             greedy=greedy, **sampling)
        if ref_audio is not None:
            self._options["voice_clone_prompt"] = voice_clone_prompt(
                speaker.model, ref_audio, ref_text=ref_text, x_vector_only_mode=x_vector_only_mode,
                talker_dir=speaker.talker_dir)
        self._sentence_tokenizer = (
            sentence_tokenizer if utils.is_given(sentence_tokenizer)
            else tokenize.blingfire.SentenceTokenizer(retain_format=True))
        # One utterance at a time on the Speaker; waiting here (not on the Speaker's own lock in
        # a thread) lets a stream that is closed while it waits stop at once.
        self._lock = asyncio.Lock()
        # The emitter's frames are one talker frame long (80 ms at 12.5 Hz), so a decode step's
        # audio leaves whole; by default (200 ms) the emitter would hold steps back to fill one.
        self._frame_size_ms = max(10, speaker.decoder.samples_per_frame * 1000 // speaker.sample_rate)

    @property
    def speaker(self) -> Speaker:
        return self._speaker

    @property
    def model(self) -> str:
        return self._speaker.talker_dir.name

    @property
    def provider(self) -> str:
        return "qwencodec"

    def synthesize(self, text: str, *,
                   conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> ChunkedStream:
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(self, *,
               conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> SynthesizeStream:
        return SynthesizeStream(tts=self, conn_options=conn_options)

    async def aclose(self) -> None:
        if self._owns_speaker:
            async with self._lock:
                self._speaker.close()

    def _initialize(self, output_emitter: tts.AudioEmitter, *, stream: bool) -> None:
        output_emitter.initialize(request_id=utils.shortuuid(), sample_rate=self.sample_rate,
                                  num_channels=1, mime_type="audio/pcm",
                                  frame_size_ms=self._frame_size_ms, stream=stream)

    async def _speak(self, text: str, output_emitter: tts.AudioEmitter) -> None:
        """Speaks one utterance, pushing each decode step's audio as it comes. Cancelled (the
        stream closed), it stops the talker and flushes the decoder before it returns."""
        async with self._lock:
            utterance = Utterance(self._speaker, text, self._options)
            try:
                async for chunk in utterance.audio():
                    output_emitter.push(chunk)
            except Exception as error:
                if error is not utterance.error:
                    raise
                raise APIError(f"qwencodec: {error}", retryable=False) from error
            finally:
                # The talker stops before its next step and the decoder is flushed before this
                # returns, however often the task is cancelled meanwhile (a closed stream's
                # gather cancels this task, then its cleanup cancels it again).
                await utterance.finish()


class ChunkedStream(tts.ChunkedStream):
    """`synthesize(text)`: the whole text as one utterance."""

    def __init__(self, *, tts: TTS, input_text: str, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._tts: TTS = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        self._tts._initialize(output_emitter, stream=False)
        await self._tts._speak(self._input_text, output_emitter)
        output_emitter.flush()


class SynthesizeStream(tts.SynthesizeStream):
    """`stream()`: text pushed is cut into sentences, each spoken as soon as it is complete;
    a flush ends the segment (its last sentence spoken, the segment's audio marked final)."""

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._tts: TTS = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        self._tts._initialize(output_emitter, stream=True)
        # One sentence stream per segment (the text between flushes), opened by its first text.
        segments = utils.aio.Chan[tokenize.SentenceStream]()
        opened: list[tokenize.SentenceStream] = []

        async def read_input() -> None:
            sentences = None
            async for data in self._input_ch:
                if isinstance(data, self._FlushSentinel):
                    if sentences is not None:
                        sentences.end_input()
                        sentences = None
                    continue
                if sentences is None:
                    sentences = self._tts._sentence_tokenizer.stream()
                    opened.append(sentences)
                    segments.send_nowait(sentences)
                sentences.push_text(data)
            if sentences is not None:
                sentences.end_input()
            segments.close()

        async def speak() -> None:
            async for sentences in segments:
                output_emitter.start_segment(segment_id=utils.shortuuid())
                async for sentence in sentences:
                    text = sentence.token.strip()
                    if not text:
                        continue
                    self._mark_started()
                    await self._tts._speak(text, output_emitter)
                    output_emitter.flush()  # the held-back tail, before the next sentence's wait
                output_emitter.end_segment()

        tasks = [asyncio.create_task(read_input()), asyncio.create_task(speak())]
        try:
            await asyncio.gather(*tasks)
        finally:
            await utils.aio.cancel_and_wait(*tasks)
            for sentences in opened:
                await sentences.aclose()
