"""qwencodec-speech's /v1/audio/speech with the clients users have: the openai Python client,
pipecat's OpenAITTSService and LiveKit's openai.TTS, each pointed at it with base_url.

The installed `qwencodec-speech serve` runs the tiny CustomVoice talker (made in a temp folder)
and the bundled release-tiny decoder on a free port, every request seeded (`--seed`), with
OpenAI's voice names `alloy` and `ash` aliased to the speaker `vivian` (pipecat's service takes
no other names). Each client's audio must equal the same seed's codes (`stream_frames`, in this
process, not through the server) decoded by gst-launch-1.0 (filesrc ! qwencodecdec, a frame a
step, as the server's decoder takes them): the same length, at most 1 LSB apart, not silent.

1. `GET /v1/audio/voices` lists the speakers and the aliases; a voice or format not served is
   refused with OpenAI's error body naming what is, and so are an empty input, an unknown
   language and an unknown stream format.
2. The openai client's streaming response, `pcm`: the audio, and the time to its first audio
   (the client's, and the server's from the request's arrival); `wav`: the
   same samples behind a streaming WAV header; `opus` where GStreamer's opusenc is: an Ogg stream;
   `stream_format="sse"`: the same pcm in `speech.audio.delta` events, then `speech.audio.done`
   with the frames as its output tokens.
3. A client that leaves after three frames' audio: the server records the request cancelled, the
   talker stopped within 2 frames of those it had made when the client went, and fewer than the
   same request makes uninterrupted.
4. pipecat's OpenAITTSService(base_url=...) through pipecat's run_test: its audio frames, joined.
5. LiveKit's openai.TTS(base_url=..., response_format="pcm").synthesize(): its frames, joined.
6. A second server on the tiny VoiceDesign talker: a request's `instructions` are the voice
   (the same seed's codes for that instruct, decoded), and one without them is refused.

    G_DEBUG=fatal_warnings VENV/bin/python tests/agents/test_speech_endpoint.py

with the venv that tools/setup-packages.sh pip-installs the packages into, with their openai
extras (tools/check-agents.sh).
"""

import asyncio
import base64
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

os.environ.setdefault("G_DEBUG", "fatal_warnings")
ROOT = Path(__file__).resolve().parents[2]

import numpy as np  # noqa: E402

import qwencodec_talker as qt  # noqa: E402
from qwencodec_talker.prompt import load_processor, prompt  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from installed import installed  # noqa: E402

DECODER = ROOT / "tests" / "fixtures" / "release-tiny"
SEED = 4
MAX_NEW_TOKENS = 200
SHORT = "Hello there, how are you today?"
LONG = ("Here is a long story that goes on and on for quite a while.", 400)  # text, max_new_tokens


installed(qt, script="tools/check-agents.sh")


class Server:
    """`qwencodec-speech serve` in a subprocess: its port, and the requests it records."""

    def __init__(self, talker_dir, aliases=("alloy=vivian", "ash=vivian")):
        command = [str(Path(sys.executable).parent / "qwencodec-speech"), "serve", "--model", str(talker_dir),
                   "--decoder", str(DECODER), "--port", "0", "--seed", str(SEED),
                   "--max-new-tokens", str(MAX_NEW_TOKENS), "--threads", "1"]
        for alias in aliases:
            command += ["--voice-alias", alias]
        self.process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        self.requests = queue.Queue()
        self.lines = []
        ready = queue.Queue()

        def read():
            for line in self.process.stderr:
                self.lines.append(line)
                if line.startswith("qwencodec-speech: serving "):
                    ready.put(int(line.split("/v1/")[0].rsplit(":", 1)[1]))
                elif line.startswith("qwencodec-speech: request "):
                    self.requests.put(json.loads(line.split("request ", 1)[1]))
            ready.put(None)

        threading.Thread(target=read, daemon=True).start()
        self.port = ready.get(timeout=180)
        if self.port is None:
            raise AssertionError("qwencodec-speech did not start:\n" + "".join(self.lines[-30:]))
        self.url = f"http://127.0.0.1:{self.port}"

    def request(self, timeout=120):
        return self.requests.get(timeout=timeout)

    def close(self):
        self.process.terminate()
        self.process.wait(30)


class References:
    """The same seed's codes decoded by gst-launch-1.0, a frame a step, by text: as the speaker
    `vivian` says it, or (a VoiceDesign talker) the voice `instruct` describes."""

    def __init__(self, talker_dir, tmp, instruct=None):
        self.model = qt.load_model(talker_dir)
        self.processor = load_processor(talker_dir)
        self.voice = dict(instruct=instruct) if instruct else dict(speaker="vivian")
        self.tmp = Path(tmp)
        self.cache = {}

    def frames(self, text, max_new_tokens=MAX_NEW_TOKENS):
        return list(qt.stream_frames(self.model, seed=SEED, **prompt(self.model, self.processor, text, **self.voice),
                                     **qt.generate_kwargs(self.model, max_new_tokens=max_new_tokens)))

    def audio(self, text):
        if text not in self.cache:
            frames = self.frames(text)
            codes, audio = self.tmp / "codes.raw", self.tmp / "audio.raw"
            codes.write_bytes(b"".join(int(c).to_bytes(2, "little", signed=True) for f in frames for c in f))
            subprocess.run(
                ["gst-launch-1.0", "-q", "filesrc", f"location={codes}",
                 "!", "audio/x-qwen3-tts-codes,codebooks=16,framerate=25/2",
                 "!", "qwencodecdec", f"model-path={DECODER}", "device=cpu", "max-step-frames=1",
                 "!", "audio/x-raw,format=S16LE,channels=1", "!", "filesink", f"location={audio}"],
                check=True, timeout=60)
            self.cache[text] = (len(frames), audio.read_bytes())
        return self.cache[text]


def same_audio(got, want, what):
    """Asserts equal length, at most 1 LSB apart, not silent; returns the samples that differ."""
    assert len(got) == len(want), f"{what}: {len(got)} bytes, the reference decode {len(want)}"
    a = np.frombuffer(got, dtype="<i2").astype(np.int32)
    b = np.frombuffer(want, dtype="<i2").astype(np.int32)
    off = int(np.abs(a - b).max()) if len(a) else 0
    assert off <= 1, f"{what}: differs from gst-launch's decode by up to {off}"
    assert np.abs(b).max() > 100, f"{what}: the reference decode is silent"
    return int((a != b).sum())


async def test_plain_requests(server, refs):
    import httpx

    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        voices = (await http.get("/v1/audio/voices")).json()["voices"]
        assert {"vivian", "alloy", "ash"} <= set(voices), voices
        bad = await http.post("/v1/audio/speech", json=dict(model="x", input="Hi.", voice="nobody",
                                                             response_format="pcm"))
        assert bad.status_code == 400 and "vivian" in bad.json()["error"]["message"], bad.text
        bad = await http.post("/v1/audio/speech", json=dict(model="x", input="Hi.", voice="vivian",
                                                             response_format="aac"))
        message = bad.json()["error"]["message"]
        assert bad.status_code == 400 and "pcm" in message and "wav" in message, bad.text
        bad = await http.post("/v1/audio/speech", json=dict(model="x", input="", voice="vivian"))
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "input", bad.text
        bad = await http.post("/v1/audio/speech", json=dict(model="x", input="Hi.", voice="vivian",
                                                             response_format="pcm", language="klingon"))
        assert bad.status_code == 400 and "english" in bad.json()["error"]["message"].lower(), bad.text
        bad = await http.post("/v1/audio/speech", json=dict(model="x", input="Hi.", voice="vivian",
                                                             response_format="pcm", stream_format="chunks"))
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "stream_format", bad.text
    return f"{len(voices)} voices; unknown voice, format, language, stream format, empty input refused"


async def test_openai_client(server, refs):
    from openai import AsyncOpenAI

    frames, want = refs.audio(SHORT)
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused")
    results = {}
    for fmt in ("pcm", "wav", "opus"):
        started = time.monotonic()
        first, data = None, b""
        async with client.audio.speech.with_streaming_response.create(
                model="qwen3-tts", voice="vivian", input=SHORT, response_format=fmt) as response:
            if response.status_code != 200:
                served = "opus" not in (await response.aread()).decode()
                if fmt == "opus" and served:
                    results[fmt] = "not served (no opusenc)"
                    continue
                raise AssertionError(f"{fmt}: status {response.status_code}")
            async for chunk in response.iter_bytes():
                if first is None and chunk:
                    first = time.monotonic() - started
                data += chunk
        record = server.request()
        assert record["format"] == fmt and not record["cancelled"] and record["frames"] == frames, record
        if fmt == "pcm":
            differ = same_audio(data, want, "openai client, pcm")
            results[fmt] = f"{frames} frames, {differ} samples 1 LSB apart, first audio {first * 1000:.0f} ms " \
                           f"(server: {record['first_audio_s'] * 1000:.0f} ms)"
        elif fmt == "wav":
            assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt " and data[36:40] == b"data", data[:44]
            assert int.from_bytes(data[24:28], "little") == 24000, "wav: not 24 kHz"
            same_audio(data[44:], want, "openai client, wav")
            results[fmt] = "the pcm behind a streaming header"
        else:
            assert data[:4] == b"OggS" and b"OpusHead" in data[:64], data[:64]
            results[fmt] = f"Ogg Opus, {len(data)} bytes"
    # OpenAI's server-sent events: the same pcm in base64 deltas, then the usage.
    deltas, done = [], None
    async with client.audio.speech.with_streaming_response.create(
            model="qwen3-tts", voice="vivian", input=SHORT, response_format="pcm", stream_format="sse") as response:
        assert response.headers["content-type"].startswith("text/event-stream"), response.headers
        async for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[len("data: "):])
            assert done is None, f"an event after speech.audio.done: {event}"
            if event["type"] == "speech.audio.delta":
                deltas.append(base64.b64decode(event["audio"]))
            else:
                assert event["type"] == "speech.audio.done", event
                done = event
    record = server.request()
    assert record["sse"] and record["frames"] == frames, record
    assert done is not None and done["usage"]["output_tokens"] == frames, done
    same_audio(b"".join(deltas), want, "openai client, sse")
    results["sse"] = f"{len(deltas)} deltas, then the usage"
    await client.close()
    return results


async def test_disconnect(server, refs):
    """The client leaves after three frames' audio: the talker stops within 2 frames."""
    from openai import AsyncOpenAI

    text, max_new_tokens = LONG
    whole = len(refs.frames(text, max_new_tokens))
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused")
    async with client.audio.speech.with_streaming_response.create(
            model="qwen3-tts", voice="vivian", input=text, response_format="pcm",
            extra_body={"max_new_tokens": max_new_tokens}) as response:
        heard = 0
        async for chunk in response.iter_bytes():
            heard += len(chunk)
            if heard >= 3 * 1920 * 2:  # three frames' audio
                break
    await client.close()
    record = server.request()
    at, made = record["frames_at_disconnect"], record["frames"]
    assert record["cancelled"] and at is not None, record
    assert made - at <= 2, f"the talker made {made - at} frames after the client went ({record})"
    assert made < whole, f"the talker made {made} frames, the whole utterance is {whole}"
    return f"client gone at frame {at}, talker stopped at {made} of {whole}"


async def test_pipecat(server, refs):
    from pipecat.frames.frames import TTSAudioRawFrame, TTSSpeakFrame
    from pipecat.services.openai.tts import OpenAITTSService
    from pipecat.tests.utils import run_test

    frames, want = refs.audio(SHORT)
    service = OpenAITTSService(api_key="unused", base_url=f"{server.url}/v1",
                               settings=OpenAITTSService.Settings(voice="alloy", model="qwen3-tts"))
    down, _ = await run_test(service, frames_to_send=[TTSSpeakFrame(SHORT)])
    audio = b"".join(f.audio for f in down if isinstance(f, TTSAudioRawFrame))
    record = server.request()
    assert record["voice"] == "vivian" and record["frames"] == frames, record
    differ = same_audio(audio, want, "pipecat OpenAITTSService")
    return f"{frames} frames, {differ} samples 1 LSB apart"


async def test_livekit(server, refs):
    from livekit.plugins import openai

    frames, want = refs.audio(SHORT)
    tts = openai.TTS(base_url=f"{server.url}/v1", api_key="unused", model="tts-1", voice="ash",
                     response_format="pcm")
    events = []
    async with tts.synthesize(SHORT) as stream:
        async for event in stream:
            events.append(event)
    await tts.aclose()
    # LiveKit's AudioEmitter may end a segment with 10 ms of silence marked final, which it does
    # not count as audio (tests/agents/test_livekit.py, pcm_of).
    if events and events[-1].is_final:
        last = events[-1].frame
        if last.samples_per_channel == last.sample_rate // 100 and not any(last.data.tobytes()):
            events = events[:-1]
    audio = b"".join(event.frame.data.tobytes() for event in events)
    record = server.request()
    assert record["voice"] == "vivian" and record["frames"] == frames, record
    differ = same_audio(audio, want, "LiveKit openai.TTS")
    return f"{frames} frames, {differ} samples 1 LSB apart"


DESCRIBED = "A calm, low voice, speaking slowly."


async def test_voice_design(talker_dir, tmp):
    """A VoiceDesign talker served: the voice described in `instructions` is the one spoken
    (the same seed's codes for that instruct), and a request without it is refused."""
    import httpx

    server = Server(talker_dir, aliases=())
    try:
        frames, want = References(talker_dir, tmp, instruct=DESCRIBED).audio(SHORT)
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            bad = await http.post("/v1/audio/speech", json=dict(model="x", input=SHORT, voice="alloy",
                                                                 response_format="pcm"))
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "instructions", bad.text
            got = await http.post("/v1/audio/speech", json=dict(model="x", input=SHORT, voice="alloy",
                                                                 instructions=DESCRIBED, response_format="pcm"))
            assert got.status_code == 200, got.text
        record = server.request()
        assert record["frames"] == frames, record
        differ = same_audio(got.content, want, "VoiceDesign")
        return f"{frames} frames, {differ} samples 1 LSB apart; no instructions refused"
    finally:
        server.close()


async def main(talker_dir, tmp):
    server = Server(talker_dir)
    refs = References(talker_dir, tmp)
    failures, results = [], {}
    try:
        for name, test in (("voices and refusals", test_plain_requests), ("openai client", test_openai_client),
                           ("disconnect", test_disconnect), ("pipecat OpenAITTSService", test_pipecat),
                           ("LiveKit openai.TTS", test_livekit)):
            t = time.monotonic()
            try:
                results[name] = await test(server, refs)
                print(f"ok   {name} ({time.monotonic() - t:.1f} s): {results[name]}", flush=True)
            except Exception:
                traceback.print_exc()
                failures.append(name)
                print(f"FAIL {name} ({time.monotonic() - t:.1f} s)", flush=True)
    finally:
        server.close()
    if failures:
        print("".join(server.lines[-40:]), file=sys.stderr)
        return failures
    t = time.monotonic()
    try:
        results["VoiceDesign"] = await test_voice_design(os.environ["QWENCODEC_TALKER_VD"], tmp)
        print(f"ok   VoiceDesign ({time.monotonic() - t:.1f} s): {results['VoiceDesign']}", flush=True)
    except Exception:
        traceback.print_exc()
        failures.append("VoiceDesign")
        print(f"FAIL VoiceDesign ({time.monotonic() - t:.1f} s)", flush=True)
        return failures
    print(f"speech endpoint: ok, openai client {results['openai client']['pcm']}; "
          f"{results['disconnect']}; pipecat and LiveKit equal; VoiceDesign {results['VoiceDesign']}")
    return failures


def run():
    with tempfile.TemporaryDirectory(prefix="qwencodec-speech-") as tmp:
        talker = os.environ.get("QWENCODEC_TALKER_CV")
        if not talker or not os.environ.get("QWENCODEC_TALKER_VD"):
            sys.exit("QWENCODEC_TALKER_CV and QWENCODEC_TALKER_VD: the tiny CustomVoice and VoiceDesign talkers' "
                     "folders (tools/check-agents.sh makes them)")
        failures = asyncio.run(main(talker, tmp))
    if failures:
        print(f"speech endpoint: FAILED {', '.join(failures)}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run())
