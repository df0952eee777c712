"""Stream talker codes as they are made: raw S16LE frames (16 codes each, frame-major) to
standard output or a file, the media server's /codes WebSocket, or RTP to a host and port.

    qwencodec-talker --model DIR --text "Hello." \\
        --speaker vivian --out - | gst-launch-1.0 fdsrc fd=0 \\
        ! audio/x-qwen3-tts-codes,codebooks=16,framerate=25/2 \\
        ! qwencodecdec model-path=DIR/speech_tokenizer ! audioconvert ! autoaudiosink

    ... --server "ws://HOST:8080/codes?session=ID" --token TOKEN   (add &transport=rtp for RTP)
    ... --rtp HOST:PORT                  (rtpqwencodespay; udpsrc ! rtpqwencodesdepay at the other end)

Each frame goes out as soon as its 16 codes exist: the generation loop is qwencodec_talker.loop's
(--loop upstream: upstream's generate, a frame out after the talker's next step, for checking).
SIGINT or SIGTERM is a barge-in: generation stops before the talker's next step, the server is
sent a cancel, and the count of frames sent is printed. The prompt is upstream's wrapper
method's for the model's kind (generate_custom_voice, generate_voice_design,
generate_voice_clone): the text through the checkpoint's processor, its non_streaming_mode
default, a 0.6B CustomVoice's instruct dropped; --text-ids takes the token ids of the whole
assistant prompt instead. A Base checkpoint clones the voice of --ref-audio (with --ref-text, or
--x-vector-only) as upstream's generate_voice_clone does (qwencodec_talker.clone).
"""

import argparse
import os
import signal
import sys
import threading

import torch

from . import DTYPES, LOOPS, generate_kwargs, load_model, stream_frames
from .destinations import RawCodes, Rtp, Server
from .clone import load_speech_tokenizer, voice_clone_prompt
from .prompt import load_processor, prompt


def main(argv=None):
    p = argparse.ArgumentParser(prog="qwencodec-talker", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="checkpoint folder (published layout)")
    text = p.add_mutually_exclusive_group(required=True)
    text.add_argument("--text")
    text.add_argument("--text-ids", help="comma-separated token ids of the whole assistant prompt")
    p.add_argument("--speaker", help="CustomVoice speaker name")
    p.add_argument("--instruct", help="VoiceDesign voice description, or a 1.7B CustomVoice's instruction")
    p.add_argument("--language", help="english, chinese, ... (default: upstream's Auto)")
    p.add_argument("--non-streaming-mode", action=argparse.BooleanOptionalAction,
                   help="upstream's non_streaming_mode (default: its wrapper's for the model's kind)")
    p.add_argument("--ref-audio", help="Base: the reference recording to clone (a WAV file)")
    p.add_argument("--ref-text", help="Base: the reference's transcript (ICL cloning)")
    p.add_argument("--x-vector-only", action="store_true",
                   help="Base: clone from the speaker embedding alone, without --ref-text")
    p.add_argument("--speech-tokenizer", help="Base: the speech tokenizer that encodes the reference "
                                              "(default MODEL/speech_tokenizer)")
    p.add_argument("--seed", type=int, help="seeds this stream's sampling (the same codes on both loops)")
    p.add_argument("--loop", choices=LOOPS, default="own",
                   help="own: qwencodec_talker.loop, a frame out when its codes exist (default); "
                        "upstream: upstream's generate, for checking")
    p.add_argument("--greedy", action="store_true", help="no sampling, talker and code predictor")
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--repetition-penalty", type=float)
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--device", default="cpu", help="the talker's torch device: cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES), help="the talker's weights")
    p.add_argument("--attn-implementation", choices=["eager", "sdpa", "flash_attention_2"],
                   help="the talker's attention (default: transformers' choice, as upstream's)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", default="-", help="raw codes: '-' for standard output, else a file")
    where.add_argument("--server", help="the media server's ws://HOST:PORT/codes?session=ID[&transport=rtp]")
    where.add_argument("--rtp", metavar="HOST:PORT", help="RTP (rtpqwencodespay) to HOST:PORT")
    p.add_argument("--token", default=os.environ.get("QWENCODEC_TOKEN"),
                   help="--server's bearer token (default: $QWENCODEC_TOKEN)")
    a = p.parse_args(argv)
    codes = None
    if not (a.server or a.rtp):
        if a.out == "-":
            # Standard output is the codes' alone: what else is written to it (upstream's and the
            # tokenizers' notices, from Python or from native code) goes to standard error.
            codes = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
            sys.stdout.flush()
            os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
        else:
            codes = open(a.out, "wb")
    if a.threads:
        torch.set_num_threads(a.threads)

    model = load_model(a.model, dtype=a.dtype, device=a.device,
                       attn_implementation=a.attn_implementation)
    try:
        clone = None
        if a.ref_audio:
            clone = voice_clone_prompt(
                model, a.ref_audio, ref_text=a.ref_text, x_vector_only_mode=a.x_vector_only, talker_dir=a.model,
                speech_tokenizer=load_speech_tokenizer(a.speech_tokenizer, model.device) if a.speech_tokenizer else None)
        words = prompt(model, load_processor(a.model), a.text, speaker=a.speaker, instruct=a.instruct,
                       language=a.language, non_streaming_mode=a.non_streaming_mode, voice_clone_prompt=clone,
                       input_ids=torch.tensor([[int(t) for t in a.text_ids.split(",")]]) if a.text_ids else None)
    except ValueError as error:
        p.error(str(error))
    gen = generate_kwargs(model, greedy=a.greedy, temperature=a.temperature, top_k=a.top_k,
                          top_p=a.top_p, repetition_penalty=a.repetition_penalty,
                          max_new_tokens=a.max_new_tokens)
    if a.server:
        destination = Server(a.server, a.token)
    elif a.rtp:
        host, _, port = a.rtp.rpartition(":")
        destination = Rtp(host, int(port))
    else:
        destination = RawCodes(codes)

    cancel = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: cancel.set())
    frames = 0
    stream = stream_frames(model, loop=a.loop, seed=a.seed, cancel=cancel, **words, **gen)
    try:
        for frame in stream:
            destination.send(frame)
            frames += 1
        if cancel.is_set():
            destination.cancel()
        else:
            destination.end()
    except RuntimeError as error:
        print(f"qwencodec_talker: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away: stop generating at once, quietly.
        stream.close()
        if codes is not None:
            os.dup2(os.open(os.devnull, os.O_WRONLY), codes.fileno())
        return 0
    finally:
        stream.close()
        destination.close()
    how = "cancelled after" if cancel.is_set() else "sent"
    print(f"qwencodec_talker: {how} {frames} frames", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
