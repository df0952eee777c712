"""Stream talker codes as raw S16LE frames (16 codes each, frame-major).

    PYTHONPATH=python python -m qwencodec_talker --model DIR --text "Hello." \\
        --speaker vivian --out - | gst-launch-1.0 fdsrc fd=0 \\
        ! audio/x-qwen3-tts-codes,codebooks=16,framerate=25/2 \\
        ! qwencodecdec model-path=DIR/speech_tokenizer ! audioconvert ! autoaudiosink

Each frame is written and flushed as soon as upstream's talker has made it.
Text goes through the checkpoint's own tokenizer (vocab.json/merges.txt of a
real download); --text-ids takes token ids instead (the tiny test talkers
have no tokenizer). Base (voice clone) needs reference audio encoded by the
speech tokenizer and is not offered here.
"""

import argparse
import os
import struct
import sys

import torch

from . import (assistant_text, generate_kwargs, instruct_text, load_model,
               stream_codes, tokenize)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m qwencodec_talker", description=__doc__.splitlines()[0])
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
    p.add_argument("--out", default="-", help="'-' for standard output, else a file")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)

    model = load_model(a.model)
    if a.text_ids:
        input_ids = torch.tensor([[int(t) for t in a.text_ids.split(",")]])
    else:
        input_ids = tokenize(a.model, assistant_text(a.text))
    instruct_ids = tokenize(a.model, instruct_text(a.instruct)) if a.instruct else None
    gen = generate_kwargs(model, greedy=a.greedy, temperature=a.temperature, top_k=a.top_k,
                          top_p=a.top_p, repetition_penalty=a.repetition_penalty,
                          max_new_tokens=a.max_new_tokens)
    out = sys.stdout.buffer if a.out == "-" else open(a.out, "wb")
    frames = 0
    stream = stream_codes(model, input_ids=input_ids, instruct_ids=instruct_ids,
                          language=a.language, speaker=a.speaker, seed=a.seed, **gen)
    try:
        for frame in stream:
            out.write(struct.pack("<16h", *frame))
            out.flush()
            frames += 1
    except BrokenPipeError:
        # The reader went away: stop generating at once, quietly.
        stream.close()
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        return 0
    finally:
        stream.close()
        if out is not sys.stdout.buffer:
            out.close()
    print(f"qwencodec_talker: {frames} frames", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
