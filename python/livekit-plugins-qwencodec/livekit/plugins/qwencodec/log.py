import logging

logger = logging.getLogger("livekit.plugins.qwencodec")
