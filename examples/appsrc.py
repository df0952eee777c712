#!/usr/bin/python3
"""Feeds qwencodecdec from a Python application, as a TTS server does (the same as appsrc.rs).

The talker's codec frames go into an appsrc a few at a time, live and timestamped, and the
decoder pushes each buffer's audio as soon as it is decoded. Reports the wall-clock latency from
a buffer of frames pushed to its audio leaving the decoder, for the first buffer (the time to
first audio) and for all.

    /usr/bin/python3 examples/appsrc.py [--model DIR] [--codes FILE] [--frames-per-push N]
        [--sink auto|fake|wav:OUT.wav] [--device auto|cpu|cuda] [--plugin-dir DIR]

Needs Debian's python3-gi, gir1.2-gstreamer-1.0 and gir1.2-gst-plugins-base-1.0 (run it with
/usr/bin/python3, not a venv without them) and the plugin built (cargo build --release).
"""

import argparse
import json
import os
import sys
import threading
import time

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstApp", "1.0")
from gi.repository import Gst, GstApp  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_MODEL = os.path.join(ROOT, "tests", "fixtures", "release-tiny")


def model_caps(model):
    """The codes' caps from the model's config.json (a tokenizer folder or a full checkpoint)."""
    folder = os.path.join(model, "speech_tokenizer")
    if not os.path.isdir(folder):
        folder = model
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    codebooks = config["decoder_config"].get("num_quantizers", 16)
    # Frames per second: the output rate over the samples each frame gives, reduced.
    num, den = config["output_sample_rate"], config["decode_upsample_rate"]
    divisor = gcd(num, den)
    return codebooks, (num // divisor, den // divisor)


def gcd(a, b):
    while b:
        a, b = b, a % b
    return a


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--codes", default=os.path.join(DEFAULT_MODEL, "codes.raw"))
    parser.add_argument("--frames-per-push", type=int, default=4)
    parser.add_argument("--sink", default="auto", help="auto, fake or wav:OUT.wav")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--plugin-dir", default=os.path.join(ROOT, "target", "release"))
    args = parser.parse_args()

    Gst.init(None)
    Gst.Registry.get().scan_path(args.plugin_dir)
    if Gst.ElementFactory.find("qwencodecdec") is None:
        sys.exit(f"appsrc.py: no qwencodecdec in {args.plugin_dir}: build the plugin first")

    codebooks, (rate_num, rate_den) = model_caps(args.model)
    frame_bytes = 2 * codebooks
    with open(args.codes, "rb") as f:
        data = f.read()
    frames = len(data) // frame_bytes
    if frames == 0:
        sys.exit(f"appsrc.py: {args.codes}: not one whole frame in it")

    def offset(index):
        """Where frame `index` starts, in nanoseconds: exact, no drift."""
        return index * rate_den * Gst.SECOND // rate_num

    if args.sink == "auto":
        sink_description = "audioconvert ! audioresample ! autoaudiosink"
    elif args.sink == "fake":
        sink_description = "fakesink sync=true"
    elif args.sink.startswith("wav:"):
        location = args.sink[4:].replace('"', '\\"')
        sink_description = f'audioconvert ! audio/x-raw,format=S16LE ! wavenc ! filesink location="{location}"'
    else:
        sys.exit(f"appsrc.py: --sink {args.sink}: expected auto, fake or wav:FILE")

    pipeline = Gst.Pipeline.new()
    appsrc = Gst.ElementFactory.make("appsrc", "codes")
    appsrc.set_property("is-live", True)
    appsrc.set_property("format", Gst.Format.TIME)
    appsrc.set_caps(
        Gst.Caps.from_string(f"audio/x-qwen3-tts-codes,codebooks={codebooks},framerate={rate_num}/{rate_den}")
    )
    decoder = Gst.ElementFactory.make("qwencodecdec")
    decoder.set_property("model-path", args.model)
    decoder.set_property("device", args.device)
    sink = Gst.parse_bin_from_description(sink_description, True)
    for element in (appsrc, decoder, sink):
        pipeline.add(element)
    appsrc.link(decoder)
    decoder.link(sink)

    # Each output buffer of the decoder carries the timestamp of the first input buffer it
    # decodes, so the timestamp finds the push it answers.
    pushed = {}
    measured = []
    lock = threading.Lock()

    def on_audio(_pad, info):
        out = time.monotonic()
        buffer = info.get_buffer()
        with lock:
            if buffer is not None and buffer.pts in pushed:
                measured.append(out - pushed[buffer.pts])
        return Gst.PadProbeReturn.OK

    decoder.get_static_pad("src").add_probe(Gst.PadProbeType.BUFFER, on_audio)

    # The model loads here (READY to PAUSED), before the call returns; a live pipeline then
    # goes on to PLAYING without waiting for the sink to preroll.
    bus = pipeline.get_bus()
    if pipeline.set_state(Gst.State.PLAYING) == Gst.StateChangeReturn.FAILURE:
        fail(bus, "the pipeline does not start", pipeline)

    # Frames are handed over once their time has come, stamped with the running time they are
    # pushed at, so a synchronised sink plays them at once.
    start_running_time = pipeline.get_current_running_time()
    start = time.monotonic()
    per_push = max(1, args.frames_per_push)
    for first in range(0, frames, per_push):
        end = min(first + per_push, frames)
        wait = start + offset(first) / Gst.SECOND - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        buffer = Gst.Buffer.new_wrapped(data[first * frame_bytes : end * frame_bytes])
        buffer.pts = start_running_time + offset(first)
        buffer.duration = offset(end) - offset(first)
        with lock:
            pushed[buffer.pts] = time.monotonic()
        if appsrc.push_buffer(buffer) != Gst.FlowReturn.OK:
            fail(bus, "pushing the codes failed", pipeline)
    appsrc.end_of_stream()
    pushing = time.monotonic() - start

    timeout = offset(frames) + 30 * Gst.SECOND
    message = bus.timed_pop_filtered(timeout, Gst.MessageType.EOS | Gst.MessageType.ERROR)
    if message is None or message.type == Gst.MessageType.ERROR:
        fail(bus, "no end of stream", pipeline, message)
    stats = decoder.get_property("stats")
    pipeline.set_state(Gst.State.NULL)

    with lock:
        if not measured:
            sys.exit("appsrc.py: no audio came out of the decoder")
        print(
            f"pushed {frames} frames ({offset(frames) / Gst.SECOND:.2f} s of speech) in {len(pushed)} buffers "
            f"of up to {per_push} frames, live, in {pushing:.2f} s"
        )
        print(
            f"first audio after {measured[0] * 1e3:.1f} ms "
            "(from the first frame pushed to its audio leaving qwencodecdec)"
        )
        print(
            f"push to audio, per buffer: mean {sum(measured) / len(measured) * 1e3:.1f} ms, "
            f"max {max(measured) * 1e3:.1f} ms over {len(measured)} buffers"
        )
    print(
        f"decoder: {stats.get_value('samples-out')} samples out, "
        f"mean step {stats.get_value('mean-step-ms'):.2f} ms, "
        f"real-time factor {stats.get_value('real-time-factor'):.3f}"
    )


def fail(bus, what, pipeline, message=None):
    if message is None or message.type != Gst.MessageType.ERROR:
        message = bus.pop_filtered(Gst.MessageType.ERROR)
    if message is not None:
        error, _debug = message.parse_error()
        what = f"{error.message} (from {message.src.get_path_string()})"
    pipeline.set_state(Gst.State.NULL)
    sys.exit(f"appsrc.py: {what}")


if __name__ == "__main__":
    main()
