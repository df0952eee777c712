"""Qwen3-TTS in process as a pipecat TTS service, decoded by qwencodecdec (docs/pipecat.md).

    from pipecat_qwencodec import QwenCodecTTSService
"""

from .tts import QwenCodecTTSService, QwenCodecTTSSettings
from .version import __version__

__all__ = ["QwenCodecTTSService", "QwenCodecTTSSettings", "__version__"]
