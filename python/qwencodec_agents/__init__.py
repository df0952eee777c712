"""Voice-agent adapters for Qwen3-TTS through qwencodecdec, in process.

Each framework's module wraps `qwencodec_talker.speech.Speaker` (the talker's frames into appsrc !
qwencodecdec ! appsink) and imports only that framework; both speak through `bridge.Utterance`
(one utterance in a thread, its audio handed to the event loop, cancelled on barge-in):

- `qwencodec_agents.pipecat`: `QwenCodecTTSService`, a pipecat `TTSService` (pipecat-ai 1.14.0);
  docs/pipecat.md.
- `qwencodec_agents.livekit`: `TTS`, a LiveKit Agents `tts.TTS` with a streaming
  `SynthesizeStream` (livekit-agents 1.8.9); docs/livekit.md.

The frameworks live in the agents venv (tools/setup-agents.sh); put `python/` on the path.
"""
