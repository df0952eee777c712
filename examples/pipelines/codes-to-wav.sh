#!/usr/bin/env bash
# Decodes a raw file of codec frames (Q little-endian int16 codes per frame) to a WAV file.
#   examples/pipelines/codes-to-wav.sh [CODES.raw] [OUT.wav] [MODEL]
# MODEL is a tokenizer checkpoint folder or a full Qwen3-TTS checkpoint; by default the
# bundled test checkpoint (random weights: the audio is noise, the pipeline is real).
# CODEBOOKS and FRAMERATE (environment) must match the model: 16 and 25/2 for the release.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
codes="${1:-$here/tests/fixtures/release-tiny/codes.raw}"
out="${2:-speech.wav}"
model="${3:-${QWENCODEC_MODEL_PATH:-$here/tests/fixtures/release-tiny}}"
export GST_PLUGIN_PATH="$here/target/release${GST_PLUGIN_PATH:+:$GST_PLUGIN_PATH}"

gst-launch-1.0 -q filesrc location="$codes" \
  ! "audio/x-qwen3-tts-codes,codebooks=${CODEBOOKS:-16},framerate=${FRAMERATE:-25/2}" \
  ! qwencodecdec model-path="$model" device="${DEVICE:-auto}" \
  ! audioconvert ! audio/x-raw,format=S16LE ! wavenc ! filesink location="$out"
