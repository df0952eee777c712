"""Qwen3-TTS in the agent's process as a LiveKit Agents TTS, decoded by qwencodecdec.

    from livekit.plugins import qwencodec
    session = AgentSession(tts=qwencodec.TTS("/models/Qwen3-TTS-12Hz-0.6B-CustomVoice", voice="vivian"), ...)

Importing it registers the plugin with LiveKit (`Plugin.register_plugin`), as LiveKit's own
plugins do; docs/livekit.md.
"""

from livekit.agents import Plugin

from .log import logger
from .tts import TTS, ChunkedStream, SynthesizeStream
from .version import __version__

__all__ = ["TTS", "ChunkedStream", "SynthesizeStream", "__version__"]


class QwenCodecPlugin(Plugin):
    def __init__(self) -> None:
        super().__init__(__name__, __version__, __package__, logger)


Plugin.register_plugin(QwenCodecPlugin())
