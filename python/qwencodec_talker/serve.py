"""An OpenAI-compatible speech endpoint: the talker's frames decoded by qwencodecdec, streamed.

    qwencodec-speech serve --model DIR [--port 8000] [--voice-alias alloy=vivian] [--seed 1]
    qwencodec-speech serve --model BASE_DIR --voice ref=REF.wav --voice-text ref="Its words."

`POST /v1/audio/speech` takes OpenAI's body (`input`, `voice`, `response_format`,
`instructions`, `model`, `speed`) and answers with the audio as the decoder makes it, a chunk a
decode step, while the talker is still speaking: `pcm` (24 kHz 16-bit mono, little-endian),
`wav` (the same behind a header whose sizes say "unknown length", as a stream's must) and
`opus` (Ogg Opus by GStreamer's opusenc) or `mp3` (lamemp3enc) where those elements are
installed. `GET /v1/audio/voices` lists the voices. A client that goes away cancels its
utterance: the talker stops before its next step. One utterance at a time (one Speaker, one
decoder); others wait their turn.

OpenAI clients name OpenAI's voices (pipecat's OpenAITTSService takes no other): `--voice-alias`
maps such a name to one of the checkpoint's voices. `voice` is a CustomVoice speaker, or a Base
checkpoint's voice cloned at start from `--voice NAME=WAV` (with `--voice-text NAME=TRANSCRIPT`,
ICL; without, the x-vector alone: qwencodec_talker.clone); a VoiceDesign checkpoint takes its
voice from `instructions` and ignores `voice`. Beyond OpenAI's
fields, `seed` (default `--seed`), `max_new_tokens` (default `--max-new-tokens`, else the
checkpoint's) and `language` (default upstream's Auto) are taken. `stream_format` `audio` (the
default, which LiveKit's openai.TTS reads) streams the audio itself; `sse` streams OpenAI's
server-sent events instead, a `speech.audio.delta` (the chunk in base64) a decode step and a
`speech.audio.done` with the usage (input characters, output frames). Each request's outcome is
written to standard error as a line `qwencodec-speech: request {json}`.
"""

import argparse
import asyncio
import base64
import contextlib
import json
import signal
import struct
import sys
import time

try:
    from aiohttp import web
except ImportError as missing:  # the package's "serve" extra
    raise ImportError("qwencodec-speech needs aiohttp: pip install 'qwencodec-talker[serve]'") from missing

from . import DTYPES, LOOPS
from .bridge import Utterance
from .clone import voice_clone_prompt

# The formats always served, and the GStreamer encoders behind the others (used where found).
PLAIN = {"pcm": "audio/pcm", "wav": "audio/wav"}
ENCODED = {"opus": ("opusenc ! oggmux", "audio/opus"), "mp3": ("lamemp3enc", "audio/mpeg")}


def error(status, message, param=None):
    """OpenAI's error body."""
    return web.json_response({"error": {"message": message, "type": "invalid_request_error",
                                        "param": param, "code": None}}, status=status)


# OpenAI's stream_format values: the audio itself, or server-sent events carrying it.
STREAM_FORMATS = ("audio", "sse")


def sse_event(kind, **fields):
    """One server-sent event of OpenAI's speech stream: `data: {"type": kind, ...}`."""
    return f"data: {json.dumps(dict(type=kind, **fields))}\n\n".encode()


def wav_header(rate):
    """A 16-bit mono WAV header for a stream of unknown length (sizes 0xFFFFFFFF)."""
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt " +
            struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16) +
            b"data" + struct.pack("<I", 0xFFFFFFFF))


class Encoder:
    """appsrc (S16LE mono) ! audioconvert ! ENCODER ! appsink: `push` PCM, take what is encoded;
    `finish` ends the stream and hands back the rest."""

    def __init__(self, Gst, encoder, rate):
        self.Gst = Gst
        self.pipeline = Gst.parse_launch(
            f"appsrc name=pcm format=time is-live=false caps=audio/x-raw,format=S16LE,channels=1,"
            f"rate={rate},layout=interleaved ! audioconvert ! audioresample ! {encoder} "
            "! appsink name=out sync=false")
        self.appsrc = self.pipeline.get_by_name("pcm")
        self.appsink = self.pipeline.get_by_name("out")
        self.rate = rate
        self.samples = 0
        self.pipeline.set_state(Gst.State.PLAYING)

    def push(self, pcm):
        Gst = self.Gst
        buffer = Gst.Buffer.new_wrapped(pcm)
        buffer.pts = Gst.util_uint64_scale(self.samples, Gst.SECOND, self.rate)
        self.samples += len(pcm) // 2
        buffer.duration = Gst.util_uint64_scale(self.samples, Gst.SECOND, self.rate) - buffer.pts
        self.appsrc.emit("push-buffer", buffer)
        return self._take(0)

    def finish(self, timeout_s=10):
        self.appsrc.emit("end-of-stream")
        return self._take(timeout_s)

    def _take(self, timeout_s):
        out = b""
        while True:
            if timeout_s and self.appsink.get_property("eos"):
                timeout_s = 0
            sample = self.appsink.try_pull_sample(int(timeout_s * self.Gst.SECOND))
            if sample is None:
                return out
            buffer = sample.get_buffer()
            out += buffer.extract_dup(0, buffer.get_size())

    def close(self):
        self.pipeline.set_state(self.Gst.State.NULL)


class SpeechServer:
    """The endpoint over one Speaker. `aliases`: OpenAI voice name -> the checkpoint's speaker;
    `clones`: a Base checkpoint's voices, name -> clone.voice_clone_prompt's item;
    `seed`, `max_new_tokens`: each request's unless it gives its own (None: the checkpoint's
    max_new_tokens); `log`: where request lines go."""

    def __init__(self, speaker, *, aliases=None, clones=None, seed=None, max_new_tokens=None, log=sys.stderr):
        self.speaker = speaker
        self.model = speaker.model
        self.kind = self.model.tts_model_type
        self.clones = dict(clones or {})
        if self.kind == "base" and not self.clones:
            raise ValueError("a Base checkpoint speaks in cloned voices: give at least one --voice NAME=WAV")
        if self.clones and self.kind != "base":
            raise ValueError(f"a {self.kind} checkpoint does not clone voices (--voice): Base only")
        if self.kind == "custom_voice":
            self.speakers = sorted(self.model.get_supported_speakers() or [])
        else:
            self.speakers = sorted(self.clones)
        self.aliases = dict(aliases or {})
        for alias, name in self.aliases.items():
            if name.lower() not in {s.lower() for s in self.speakers}:
                raise ValueError(f"--voice-alias {alias}={name}: no voice {name!r}; "
                                 f"the voices: {', '.join(self.speakers)}")
        self.seed = seed
        self.max_new_tokens = max_new_tokens
        self.log = log
        self.requests = 0
        self._turn = asyncio.Lock()
        self.formats = dict(PLAIN)
        for name, (encoder, content_type) in ENCODED.items():
            if self._has(encoder):
                self.formats[name] = content_type

    def _has(self, encoder):
        Gst = self.speaker.decoder.Gst
        return all(Gst.ElementFactory.find(part.strip()) is not None for part in encoder.split("!"))

    def app(self):
        app = web.Application()
        app.router.add_post("/v1/audio/speech", self.speech)
        app.router.add_get("/v1/audio/voices", self.voices)
        return app

    async def voices(self, request):
        return web.json_response({"voices": self.speakers + sorted(self.aliases)})

    def _options(self, body):
        """Speaker.speak's options from the request's body, or an error response."""
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            return error(400, "input: the text to speak, a non-empty string", "input")
        fmt = body.get("response_format", "mp3")
        if fmt not in self.formats:
            return error(400, f"response_format {fmt!r} is not served; served: {', '.join(self.formats)}",
                         "response_format")
        stream_format = body.get("stream_format", "audio")
        if stream_format not in STREAM_FORMATS:
            return error(400, f"stream_format {stream_format!r} is not one of {', '.join(STREAM_FORMATS)}",
                         "stream_format")
        speed = body.get("speed", 1.0)
        if speed not in (None, 1, 1.0):
            return error(400, f"speed {speed!r}: only 1.0", "speed")
        seed = body.get("seed", self.seed)
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            return error(400, f"seed {seed!r}: an integer", "seed")
        max_new_tokens = body.get("max_new_tokens", self.max_new_tokens)
        if max_new_tokens is not None and (not isinstance(max_new_tokens, int) or max_new_tokens < 1):
            return error(400, f"max_new_tokens {max_new_tokens!r}: a positive integer", "max_new_tokens")
        language = body.get("language")
        languages = self.model.get_supported_languages()
        if language is not None and (not isinstance(language, str) or (
                languages is not None and language.lower() not in {str(x).lower() for x in languages})):
            return error(400, f"language {language!r} is not one of {', '.join(sorted(languages or []))}",
                         "language")
        options = dict(seed=seed, language=language, max_new_tokens=max_new_tokens, stream_format=stream_format)
        instructions = body.get("instructions") or None
        voice = body.get("voice")
        if self.kind in ("custom_voice", "base"):
            if not isinstance(voice, str):
                return error(400, f"voice: one of {', '.join(self.speakers + sorted(self.aliases))}", "voice")
            voice = self.aliases.get(voice, voice)
            if voice.lower() not in {s.lower() for s in self.speakers}:
                return error(400, f"voice {body.get('voice')!r} is not one of "
                                  f"{', '.join(self.speakers + sorted(self.aliases))}", "voice")
            if self.kind == "base":
                options.update(voice_clone_prompt=self.clones[next(c for c in self.clones if c.lower() == voice.lower())])
            else:
                options.update(speaker=voice, instruct=instructions)
            options["voice"] = voice
        else:
            if not instructions:
                return error(400, "instructions: a VoiceDesign checkpoint needs the voice described",
                             "instructions")
            options.update(instruct=instructions)
        return text, fmt, options

    async def speech(self, request):
        arrived = time.monotonic()
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error(400, "the body is not JSON")
        if not isinstance(body, dict):
            return error(400, "the body is not a JSON object")
        parsed = self._options(body)
        if isinstance(parsed, web.Response):
            return parsed
        text, fmt, options = parsed
        voice = options.pop("voice", None)
        sse = options.pop("stream_format") == "sse"
        self.requests += 1
        record = dict(number=self.requests, format=fmt, sse=sse, voice=voice, seed=options["seed"],
                      frames=0, cancelled=False, frames_at_disconnect=None, first_audio_s=None, bytes=0)
        async with self._turn:
            speaker = self.speaker
            encoder = None
            if fmt in ENCODED:
                encoder = Encoder(speaker.decoder.Gst, ENCODED[fmt][0], speaker.sample_rate)
            utterance = Utterance(speaker, text, options)
            content_type = "text/event-stream" if sse else self.formats[fmt]
            response = web.StreamResponse(headers={"Content-Type": content_type})
            response.enable_chunked_encoding()
            try:
                await response.prepare(request)

                def framed(data):
                    if not sse:
                        return data
                    return sse_event("speech.audio.delta", audio=base64.b64encode(data).decode())

                async def send(data):
                    if data:
                        if record["first_audio_s"] is None:
                            record["first_audio_s"] = round(time.monotonic() - arrived, 4)
                        record["bytes"] += len(data)
                        await response.write(framed(data))

                if fmt == "wav":
                    await response.write(framed(wav_header(speaker.sample_rate)))
                async with contextlib.aclosing(utterance.audio()) as audio:
                    async for pcm in audio:
                        await send(encoder.push(pcm) if encoder else pcm)
                if encoder:
                    await send(await asyncio.get_running_loop().run_in_executor(None, encoder.finish))
                if sse:
                    tokens = dict(input_tokens=len(text), output_tokens=utterance.frames_made)
                    await response.write(sse_event("speech.audio.done",
                                                   usage=dict(tokens, total_tokens=sum(tokens.values()))))
                await response.write_eof()
            except (ConnectionError, asyncio.CancelledError):
                # The client went away (aiohttp cancels the handler, or a write fails).
                record["frames_at_disconnect"] = speaker.frames_made
                raise
            finally:
                try:
                    # The client may go once it has the end, cancelling this wait: it still ends.
                    await utterance.finish()
                finally:
                    if encoder:
                        encoder.close()
                    record.update(frames=utterance.frames_made, cancelled=utterance.cancelled)
                    print(f"qwencodec-speech: request {json.dumps(record)}", file=self.log, flush=True)
        return response


def serve(args):
    from .speech import Speaker

    def pairs(items, option, what):
        out = {}
        for item in items:
            name, _, value = item.partition("=")
            if not name or not value:
                sys.exit(f"qwencodec-speech: {option} {item!r}: NAME={what}")
            out[name] = value
        return out

    aliases = pairs(args.voice_alias, "--voice-alias", "SPEAKER")
    references = pairs(args.voice, "--voice", "WAV")
    transcripts = pairs(args.voice_text, "--voice-text", "TRANSCRIPT")
    unknown = set(transcripts) - set(references)
    if unknown:
        sys.exit(f"qwencodec-speech: --voice-text for {', '.join(sorted(unknown))}, which no --voice names")
    speaker = Speaker(args.model, decoder_dir=args.decoder, chunk_frames=args.chunk_frames,
                      device=args.device, dtype=args.dtype, attn_implementation=args.attn_implementation,
                      plugin_dir=args.plugin_dir, loop=args.loop)
    try:
        clones = {name: voice_clone_prompt(speaker.model, wav, ref_text=transcripts.get(name),
                                           x_vector_only_mode=name not in transcripts, talker_dir=args.model)
                  for name, wav in references.items()}
        server = SpeechServer(speaker, aliases=aliases, clones=clones, seed=args.seed,
                              max_new_tokens=args.max_new_tokens)
    except ValueError as problem:
        speaker.close()
        sys.exit(f"qwencodec-speech: {problem}")

    async def run():
        runner = web.AppRunner(server.app(), handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        port = runner.addresses[0][1]
        print(f"qwencodec-speech: serving http://{args.host}:{port}/v1/audio/speech "
              f"({', '.join(server.formats)})", file=sys.stderr, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for number in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(number, stop.set)
        await stop.wait()
        await runner.cleanup()

    try:
        asyncio.run(run())
    finally:
        speaker.close()
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="qwencodec-speech", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = p.add_subparsers(dest="command", required=True)
    s = commands.add_parser("serve", help="serve /v1/audio/speech and /v1/audio/voices")
    s.add_argument("--model", required=True, help="the talker checkpoint folder (published layout)")
    s.add_argument("--decoder", help="its speech tokenizer (default MODEL/speech_tokenizer)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000, help="0: any free port (printed)")
    s.add_argument("--voice-alias", action="append", default=[], metavar="ALIAS=SPEAKER",
                   help="an OpenAI voice name (alloy, ...) for one of the checkpoint's speakers")
    s.add_argument("--voice", action="append", default=[], metavar="NAME=WAV",
                   help="Base: a voice cloned from a reference recording")
    s.add_argument("--voice-text", action="append", default=[], metavar="NAME=TRANSCRIPT",
                   help="Base: the reference's transcript (ICL cloning; without it, the x-vector alone)")
    s.add_argument("--seed", type=int, help="each request's seed unless it gives one")
    s.add_argument("--max-new-tokens", type=int, help="each request's most frames unless it gives its own")
    s.add_argument("--chunk-frames", type=int, help="qwencodecdec's frames a decode step")
    s.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (talker and decoder)")
    s.add_argument("--dtype", default="float32", choices=list(DTYPES), help="the talker's weights")
    s.add_argument("--attn-implementation", choices=["eager", "sdpa", "flash_attention_2"])
    s.add_argument("--loop", choices=LOOPS, default="own", help="the talker's generation loop")
    s.add_argument("--plugin-dir", help="the folder of libgstqwencodec.so, if GStreamer does not find it")
    s.add_argument("--threads", type=int, help="torch CPU threads")
    args = p.parse_args(argv)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
