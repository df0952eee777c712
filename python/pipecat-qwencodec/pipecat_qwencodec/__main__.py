"""The service alone in a pipecat pipeline, from the command line: text in, a WAV out.

    python -m pipecat_qwencodec --model DIR --speaker vivian --text "Hello." --out a.wav
"""

import argparse
import asyncio
import wave

from pipecat.frames.frames import EndFrame, MetricsFrame, TTSAudioRawFrame, TTSSpeakFrame
from pipecat.metrics.metrics import TTFBMetricsData
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.workers.runner import WorkerRunner

from .tts import QwenCodecTTSService


async def _speak_to_wav(args):
    """The service alone in a pipecat pipeline: TTSSpeakFrame in, its audio frames to a WAV."""
    service = QwenCodecTTSService(
        model_dir=args.model, decoder_dir=args.decoder, device=args.device, dtype=args.dtype,
        attn_implementation=args.attn_implementation,
        settings=QwenCodecTTSService.Settings(voice=args.speaker, language=args.language,
                                              instruct=args.instruct, seed=args.seed,
                                              max_new_tokens=args.max_new_tokens))
    audio, ttfb = bytearray(), []

    class Collect(FrameProcessor):
        async def process_frame(self, frame, direction):
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSAudioRawFrame):
                audio.extend(frame.audio)
            elif isinstance(frame, MetricsFrame):
                ttfb.extend(d.value for d in frame.data
                            if isinstance(d, TTFBMetricsData) and d.processor == service.name
                            and d.value > 0)
            await self.push_frame(frame, direction)

    worker = PipelineWorker(Pipeline([service, Collect()]), cancel_on_idle_timeout=False,
                            params=PipelineParams(enable_metrics=True))
    await worker.queue_frames([TTSSpeakFrame(args.text), EndFrame()])
    runner = WorkerRunner(handle_sigint=True)
    await runner.add_workers(worker)
    await runner.run()
    with wave.open(args.out, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(service.sample_rate)
        out.writeframes(bytes(audio))
    made = service.utterances[-1].frames_made if service.utterances else 0
    print(f"qwencodec pipecat: {made} frames, {len(audio) // 2} samples at {service.sample_rate} Hz"
          f" to {args.out}" + (f", TTFB {ttfb[0] * 1000:.0f} ms" if ttfb else ""))


def main(argv=None):
    """python -m pipecat_qwencodec --model DIR --speaker vivian --text "Hello." --out a.wav"""
    parser = argparse.ArgumentParser(prog="python -m pipecat_qwencodec",
                                     description=_speak_to_wav.__doc__)
    parser.add_argument("--model", required=True, help="Qwen3-TTS 12 Hz talker checkpoint folder")
    parser.add_argument("--decoder", help="speech tokenizer folder (default MODEL/speech_tokenizer)")
    parser.add_argument("--text", required=True)
    parser.add_argument("--speaker", help="CustomVoice speaker, e.g. vivian")
    parser.add_argument("--instruct", help="VoiceDesign voice description")
    parser.add_argument("--language", help="english, chinese, ... (default auto)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (talker and decoder)")
    parser.add_argument("--dtype", default="float32", help="the talker's: float32, bfloat16, float16")
    parser.add_argument("--attn-implementation", help="the talker's: eager, sdpa, flash_attention_2")
    parser.add_argument("--out", required=True, help="WAV file")
    asyncio.run(_speak_to_wav(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
