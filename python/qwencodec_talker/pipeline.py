"""GStreamer in this process: the plugin loaded, and `appsrc ! …` pipelines fed codes frames.

The RTP destination (destinations.Rtp) and the in-process decoder (speech.Decoder) are both a
`CodesPipeline`: frames pushed into an appsrc of `audio/x-qwen3-tts-codes`, each stamped at its
place in the utterance, with the pipeline's first error in every failure's message.
"""

import struct

from . import CODEBOOKS

def load_plugin(plugin_dir=None):
    """GStreamer (initialised) with this project's plugin: where GStreamer finds it (`make
    install`, or a folder on GST_PLUGIN_PATH), else registered from `plugin_dir`."""
    import gi

    gi.require_version("Gst", "1.0")
    gi.require_version("GstApp", "1.0")
    from gi.repository import Gst, GstApp  # noqa: F401 - GstApp gives appsrc and appsink their methods

    if not Gst.is_initialized():
        Gst.init(None)
    if Gst.ElementFactory.find("qwencodecdec") is None and plugin_dir is not None:
        Gst.Registry.get().scan_path(str(plugin_dir))
    if Gst.ElementFactory.find("qwencodecdec") is None:
        where = f"in {plugin_dir}" if plugin_dir is not None else "on GStreamer's plugin path"
        raise RuntimeError(f"no qwencodecdec element {where}: build the plugin (make build) and set "
                           "GST_PLUGIN_PATH to its folder (target/release), or make install")
    return Gst


def pack(frame):
    """One frame's codes as S16LE, the wire and file format of `audio/x-qwen3-tts-codes`."""
    return struct.pack(f"<{len(frame)}h", *frame)


class CodesPipeline:
    """`appsrc name=codes ! <downstream>`, playing: `push` frames, `close` to stop.

    downstream: the rest of the pipeline in gst-launch syntax; properties: {element name:
    {property: value}}, set before the pipeline starts (values that gst-launch syntax would need
    quoted, such as paths); what: the pipeline's name in error messages.
    """

    def __init__(self, downstream, *, properties=None, codebooks=CODEBOOKS, frame_rate=(25, 2),
                 plugin_dir=None, what="the pipeline"):
        Gst = self.Gst = load_plugin(plugin_dir)
        num, den = frame_rate
        self.codebooks, self.what = codebooks, what
        self.frame_ns = den * Gst.SECOND // num
        self.pipeline = Gst.parse_launch(
            f"appsrc name=codes format=time caps=audio/x-qwen3-tts-codes,codebooks={codebooks},"
            f"framerate={num}/{den} ! {downstream}")
        for name, values in (properties or {}).items():
            element = self.pipeline.get_by_name(name)
            for key, value in values.items():
                element.set_property(key, value)
        self.appsrc = self.pipeline.get_by_name("codes")
        self.bus = self.pipeline.get_bus()
        self.frames = 0
        if self.pipeline.set_state(Gst.State.PLAYING) == Gst.StateChangeReturn.FAILURE:
            raise RuntimeError(self.error() or f"{what} does not start")

    def error(self):
        """The pipeline's first error not yet read, as text, or None."""
        message = self.bus.pop_filtered(self.Gst.MessageType.ERROR)
        if message is None:
            return None
        error, debug = message.parse_error()
        return f"{message.src.get_name()}: {error.message} ({debug})"

    def push(self, frame):
        """One frame's codes (ints), stamped after the frames pushed before it."""
        if len(frame) != self.codebooks:
            raise ValueError(f"a frame has {self.codebooks} codes, not {len(frame)}")
        buffer = self.Gst.Buffer.new_wrapped(pack(frame))
        buffer.pts = self.frames * self.frame_ns
        buffer.duration = self.frame_ns
        self.frames += 1
        if self.appsrc.emit("push-buffer", buffer) != self.Gst.FlowReturn.OK:
            raise RuntimeError(self.error() or f"{self.what} took no more frames")

    def close(self):
        self.pipeline.set_state(self.Gst.State.NULL)
