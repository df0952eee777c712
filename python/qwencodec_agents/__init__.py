"""Voice-agent adapters for Qwen3-TTS through qwencodecdec, in process.

Each module wraps `qwencodec_talker.speech.Speaker` (the talker's frames into appsrc !
qwencodecdec ! appsink) for one framework, and imports only that framework:

- `qwencodec_agents.pipecat`: `QwenCodecTTSService`, a pipecat `TTSService` (pipecat-ai 1.14.0);
  docs/pipecat.md.
- `qwencodec_agents.livekit`: `TTS`, a LiveKit Agents `tts.TTS` with a streaming
  `SynthesizeStream` (livekit-agents 1.8.9); docs/livekit.md.

The frameworks live in the agents venv (tools/setup-agents.sh); put `python/` on the path.
"""
