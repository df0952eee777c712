#!/usr/bin/env bash
# Decodes a .npy file of codec frames (an integer array [T, Q] or [1, T, Q], as np.save writes
# the talker's codes) to a WAV file with decodebin, which plugs the plugin's typefinder,
# qwencodecparse and qwencodecdec by itself.
#   examples/pipelines/npy-to-wav.sh [CODES.npy] [OUT.wav] [MODEL]
# MODEL reaches the decoder through QWENCODEC_MODEL_PATH: a tokenizer checkpoint folder or a
# full Qwen3-TTS checkpoint; by default the bundled test checkpoint, and by default the bundled
# codes made into a .npy file. decodebin leaves the parser at 25/2 frames a second: the
# released model's rate.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
codes="${1:-}"
out="${2:-speech.wav}"
model="${3:-${QWENCODEC_MODEL_PATH:-$here/tests/fixtures/release-tiny}}"
if [ -z "$codes" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  codes="$tmp/codes.npy"
  bash "$here/examples/pipelines/raw-to-npy.sh" "$here/tests/fixtures/release-tiny/codes.raw" 16 "$codes"
fi
export GST_PLUGIN_PATH="$here/target/release${GST_PLUGIN_PATH:+:$GST_PLUGIN_PATH}"

QWENCODEC_MODEL_PATH="$model" gst-launch-1.0 -q filesrc location="$codes" ! decodebin \
  ! audioconvert ! audio/x-raw,format=S16LE ! wavenc ! filesink location="$out"
