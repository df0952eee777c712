#!/usr/bin/env bash
# Text to a WAV file, streaming: the talker (the qwencodec-talker package of python/) writes
# each frame's codes to a pipe as it makes them, and qwencodecdec decodes them as they come.
#   examples/pipelines/text-to-wav.sh TALKER "TEXT" [OUT.wav] [talker options, e.g. --speaker vivian]
# TALKER is a Qwen3-TTS 12 Hz checkpoint folder (published layout, with speech_tokenizer/);
# DECODER (environment) names another decoder checkpoint. The talker runs from the venv that
# tools/setup-packages.sh installs python/'s packages into (made on first use).
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
talker="$1"
text="$2"
out="${3:-speech.wav}"
shift $(($# < 3 ? $# : 3))
decoder="${DECODER:-$talker/speech_tokenizer}"
talker_command="$(bash "$here/tools/setup-packages.sh")/bin/qwencodec-talker"
export GST_PLUGIN_PATH="$here/target/release${GST_PLUGIN_PATH:+:$GST_PLUGIN_PATH}"

"$talker_command" --model "$talker" --text "$text" --out - "$@" \
  | gst-launch-1.0 -q fdsrc fd=0 \
    ! "audio/x-qwen3-tts-codes,codebooks=16,framerate=25/2" \
    ! qwencodecdec model-path="$decoder" device="${DEVICE:-auto}" \
    ! audioconvert ! audio/x-raw,format=S16LE ! wavenc ! filesink location="$out"
