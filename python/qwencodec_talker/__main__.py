"""Stream talker codes as they are made: raw S16LE frames (16 codes each, frame-major) to
standard output or a file, the media server's /codes WebSocket, or RTP to a host and port.

    qwencodec-talker --model DIR --text "Hello." \\
        --speaker vivian --out - | gst-launch-1.0 fdsrc fd=0 \\
        ! audio/x-qwen3-tts-codes,codebooks=16,framerate=25/2 \\
        ! qwencodecdec model-path=DIR/speech_tokenizer ! audioconvert ! autoaudiosink

    ... --server "ws://HOST:8080/codes?session=ID" --token TOKEN   (add &transport=rtp for RTP)
    ... --rtp HOST:PORT                  (rtpqwencodespay; udpsrc ! rtpqwencodesdepay at the other end)

Each frame goes out as soon as upstream's talker has made it. SIGINT or SIGTERM is a barge-in:
generation stops before the talker's next step, the server is sent a cancel, and the count of
frames sent is printed. Text goes through the checkpoint's own tokenizer; --text-ids takes the
token ids of the whole assistant prompt instead. Base (voice clone) needs reference audio
encoded by the speech tokenizer and is not offered here.
"""

import argparse
import os
import signal
import sys
import threading

import torch

from . import (DTYPES, assistant_text, generate_kwargs, instruct_text, load_model,
               stream_codes, tokenize)
from .destinations import RawCodes, Rtp, Server


def main(argv=None):
    p = argparse.ArgumentParser(prog="qwencodec-talker", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="checkpoint folder (published layout)")
    text = p.add_mutually_exclusive_group(required=True)
    text.add_argument("--text")
    text.add_argument("--text-ids", help="comma-separated token ids of the whole assistant prompt")
    p.add_argument("--speaker", help="CustomVoice speaker name")
    p.add_argument("--instruct", help="VoiceDesign (or 1.7B CustomVoice) instruction")
    p.add_argument("--language", default="auto")
    p.add_argument("--seed", type=int)
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
    if a.threads:
        torch.set_num_threads(a.threads)

    model = load_model(a.model, dtype=a.dtype, device=a.device,
                       attn_implementation=a.attn_implementation)
    if a.text_ids:
        input_ids = torch.tensor([[int(t) for t in a.text_ids.split(",")]])
    else:
        input_ids = tokenize(a.model, assistant_text(a.text))
    input_ids = input_ids.to(model.device)
    instruct_ids = tokenize(a.model, instruct_text(a.instruct)).to(model.device) if a.instruct else None
    gen = generate_kwargs(model, greedy=a.greedy, temperature=a.temperature, top_k=a.top_k,
                          top_p=a.top_p, repetition_penalty=a.repetition_penalty,
                          max_new_tokens=a.max_new_tokens)
    if a.server:
        destination = Server(a.server, a.token)
    elif a.rtp:
        host, _, port = a.rtp.rpartition(":")
        destination = Rtp(host, int(port))
    else:
        destination = RawCodes(sys.stdout.buffer if a.out == "-" else open(a.out, "wb"))

    cancel = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: cancel.set())
    frames = 0
    stream = stream_codes(model, input_ids=input_ids, instruct_ids=instruct_ids,
                          language=a.language, speaker=a.speaker, seed=a.seed, cancel=cancel, **gen)
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
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        stream.close()
        destination.close()
    how = "cancelled after" if cancel.is_set() else "sent"
    print(f"qwencodec_talker: {how} {frames} frames", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
