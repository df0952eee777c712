"""The pipecat TTS service (pipecat-ai 1.14): Qwen3-TTS in this process, decoded by qwencodecdec.

`QwenCodecTTSService.run_tts(text)` runs upstream's talker and the plugin's decoder through
`qwencodec_talker.speech.Speaker` (appsrc ! qwencodecdec ! appsink) and yields each decode step's
audio as a `TTSAudioRawFrame` the moment it is made, while the talker goes on. As pipecat's own
local services (piper, pocket_tts) do, the base class opens the audio context with
`TTSStartedFrame` and starts TTFB, the first audio stops TTFB, and `TTSStoppedFrame` closes the
turn (push_start_frame / push_stop_frames).

Each utterance is a `qwencodec_talker.bridge.Utterance`: `Speaker.speak` in a thread of its own,
its audio handed to the event loop as it comes. A barge-in (pipecat's `InterruptionFrame`, which
cancels the task running `run_tts`), a closed generator or a `CancelFrame` sets the utterance's
cancel event: the talker stops before its next step and the decoder drops what it holds.
Utterances run one after another, each on the same Speaker.

Audio: 16-bit mono at the decoder's rate (24000 Hz for Qwen3-TTS 12 Hz). At that output rate
(pipecat's default `audio_out_sample_rate`) the frames carry the decoder's samples unchanged; at
any other, pipecat's own stream resampler (soxr, as its piper and pocket_tts services) converts
them, which is no longer sample-exact.
"""

import asyncio
import collections
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from pipecat.frames.frames import CancelFrame, ErrorFrame, Frame
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TTSService
from pipecat.transcriptions.language import Language, resolve_language
from pipecat.utils.tracing.service_decorators import traced_tts
from pipecat.utils.types import NOT_GIVEN, NotGiven, is_given

from qwencodec_talker.bridge import Utterance
from qwencodec_talker.clone import voice_clone_prompt

# Upstream's language names (the talker config's codec_language_id), by pipecat language.
LANGUAGES = {
    Language.EN: "english",
    Language.ZH: "chinese",
    Language.DE: "german",
    Language.ES: "spanish",
    Language.FR: "french",
    Language.IT: "italian",
    Language.JA: "japanese",
    Language.KO: "korean",
    Language.PT: "portuguese",
    Language.RU: "russian",
}


@dataclass
class QwenCodecTTSSettings(TTSSettings):
    """Settings for QwenCodecTTSService, read at the start of each utterance.

    Parameters:
        voice: the CustomVoice speaker (e.g. "vivian"); None for VoiceDesign.
        language: a pipecat `Language` or upstream's name ("english"); None: upstream's "Auto".
        instruct: VoiceDesign's voice description.
        seed: seeds each utterance's own sampling (None: not seeded).
        max_new_tokens: the most talker steps of an utterance (None: the checkpoint's).
    """

    instruct: str | None | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    seed: int | None | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    max_new_tokens: int | None | NotGiven = field(default_factory=lambda: NOT_GIVEN)


@dataclass(eq=False)
class QwenCodecUtterance(Utterance):
    """One run_tts: the bridge's utterance under pipecat's context id."""

    context_id: str = ""


class QwenCodecTTSService(TTSService):
    """Qwen3-TTS through qwencodecdec, in process: text in, audio frames out as they decode.

    Either `model_dir` (a Qwen3-TTS 12 Hz checkpoint folder; the service builds a Speaker and
    closes it at cleanup) or `speaker` (a `qwencodec_talker.speech.Speaker` the caller owns).
    """

    Settings = QwenCodecTTSSettings
    _settings: Settings

    def __init__(
        self,
        *,
        model_dir: str | None = None,
        decoder_dir: str | None = None,
        speaker: Any = None,
        device: str = "cpu",
        dtype: Any = "float32",
        attn_implementation: str | None = None,
        loop: str = "own",
        chunk_frames: int | None = None,
        plugin_dir: str | None = None,
        sampling: dict[str, Any] | None = None,
        ref_audio: Any = None,
        ref_text: str | None = None,
        x_vector_only_mode: bool = False,
        settings: Settings | None = None,
        **kwargs,
    ):
        """Initialize the service.

        Args:
            model_dir: the talker checkpoint folder (published layout), when `speaker` is None.
            decoder_dir: its speech tokenizer (default model_dir/speech_tokenizer).
            speaker: an existing Speaker to use instead (not closed by the service).
            device: "cpu", "cuda", "cuda:N" for both the talker and the decoder.
            dtype: the talker's weights: "float32", "bfloat16", "float16" (or a torch dtype).
            attn_implementation: the talker's attention ("eager", "sdpa",
                "flash_attention_2"; None: transformers' choice, as upstream's).
            loop: the talker's generation loop: "own" (qwencodec_talker.loop, a frame out
                when its codes exist) or "upstream" (upstream's generate, for checking).
            chunk_frames: qwencodecdec's frames per decode step (default: the element's, 1).
            plugin_dir: where libgstqwencodec.so is when GStreamer does not find it.
            sampling: upstream's sampling options (temperature, top_k, top_p,
                repetition_penalty, greedy, subtalker_*) and non_streaming_mode (default:
                upstream's wrapper's for the model's kind), for every utterance.
            ref_audio: a Base checkpoint's voice to clone (a WAV path, a URL, base64, or
                (samples, rate)), once here through upstream's encoders
                (`qwencodec_talker.clone.voice_clone_prompt`), for every utterance.
            ref_text: the reference's transcript (ICL cloning).
            x_vector_only_mode: clone from the speaker embedding alone, without ref_text.
            settings: runtime-updatable settings (voice, language, instruct, seed, max_new_tokens).
            **kwargs: passed to pipecat's `TTSService` (e.g. sample_rate).
        """
        default_settings = self.Settings(
            model=None, voice=None, language=None, instruct=None, seed=None, max_new_tokens=None
        )
        if settings is not None:
            default_settings.apply_update(settings)
        super().__init__(
            push_start_frame=True,
            push_stop_frames=True,
            settings=default_settings,
            **kwargs,
        )
        if speaker is None:
            if model_dir is None:
                raise ValueError("QwenCodecTTSService needs model_dir or speaker")
            from qwencodec_talker.speech import Speaker

            speaker = Speaker(model_dir, decoder_dir=decoder_dir, chunk_frames=chunk_frames,
                              device=device, dtype=dtype, attn_implementation=attn_implementation,
                              plugin_dir=plugin_dir, loop=loop)
            self._owns_speaker = True
        else:
            self._owns_speaker = False
        self._speaker = speaker
        self._sampling = dict(sampling or {})
        if ref_audio is not None:
            self._sampling["voice_clone_prompt"] = voice_clone_prompt(
                speaker.model, ref_audio, ref_text=ref_text, x_vector_only_mode=x_vector_only_mode,
                talker_dir=speaker.talker_dir)
        self._current: QwenCodecUtterance | None = None
        self.utterances: collections.deque[QwenCodecUtterance] = collections.deque(maxlen=32)

    @property
    def speaker(self):
        """The Speaker (talker and decoder) this service speaks through."""
        return self._speaker

    def can_generate_metrics(self) -> bool:
        """TTFB, processing and usage metrics, as pipecat's services."""
        return True

    def language_to_service_language(self, language: Language) -> str:
        """A pipecat Language as upstream's language name ("english")."""
        return resolve_language(language, LANGUAGES, use_base_code=True)

    async def wait_for_talker(self, timeout: float | None = None) -> bool:
        """Waits until the last utterance's talker thread has ended (True) or `timeout` passed."""
        if self._current is None:
            return True
        return await asyncio.to_thread(self._current.join, timeout)

    async def cancel(self, frame: CancelFrame):
        """Cancel the service: the talker stops before its next step."""
        await super().cancel(frame)
        self._cancel_current()

    async def cleanup(self):
        """Stops the talker, waits for its thread, and closes the Speaker if the service made it."""
        await super().cleanup()
        self._cancel_current()
        await self.wait_for_talker()
        if self._owns_speaker and self._speaker is not None:
            self._speaker.close()
            self._speaker = None

    def _cancel_current(self):
        if self._current is not None:
            self._current.cancel.set()

    def _speak_options(self) -> dict[str, Any]:
        settings = self._settings
        options = dict(self._sampling)

        def given(value):
            return value if is_given(value) else None

        language = given(settings.language)
        options.update(
            speaker=given(settings.voice),
            instruct=given(settings.instruct),
            language=str(language) if language else None,
            seed=given(settings.seed),
        )
        max_new_tokens = given(settings.max_new_tokens)
        if max_new_tokens is not None:
            options["max_new_tokens"] = max_new_tokens
        return options

    @traced_tts
    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame, None]:
        """Speak `text`: a TTSAudioRawFrame for each decode step, as the talker goes on.

        Args:
            text: The text to speak.
            context_id: Unique identifier for this TTS context.

        Yields:
            Frame: audio frames (the base class adds TTSStartedFrame/TTSStoppedFrame).
        """
        # One utterance at a time: this one speaks once the one before has ended, within a
        # talker step of its cancel.
        utterance = QwenCodecUtterance(speaker=self._speaker, text=text,
                                       options=self._speak_options(), after=self._current,
                                       context_id=context_id)
        self.utterances.append(utterance)
        self._current = utterance
        finished = False
        try:
            await self.start_tts_usage_metrics(text)
            async for frame in self._stream_audio_frames_from_iterator(
                utterance.audio(),
                in_sample_rate=self._speaker.sample_rate,
                context_id=context_id,
            ):
                await self.stop_ttfb_metrics()
                yield frame
            finished = True
        except Exception as e:
            logger.error(f"{self} exception: {e}")
            yield ErrorFrame(error=f"qwencodec TTS failed: {e}")
        finally:
            if not finished:  # interrupted: the talker stops before its next step
                utterance.cancel.set()
            logger.debug(f"{self}: Finished TTS [{text}]")
            await self.stop_ttfb_metrics()
