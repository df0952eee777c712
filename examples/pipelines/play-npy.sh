#!/usr/bin/env bash
# Plays a .npy file of codec frames with playbin, as gst-play-1.0 CODES.npy does.
#   examples/pipelines/play-npy.sh [CODES.npy] [MODEL]
# AUDIO_SINK overrides the sink (default autoaudiosink), e.g. AUDIO_SINK="fakesink sync=true"
# where there is no sound card. CODES and MODEL default as in npy-to-wav.sh.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
codes="${1:-}"
model="${2:-${QWENCODEC_MODEL_PATH:-$here/tests/fixtures/release-tiny}}"
if [ -z "$codes" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  codes="$tmp/codes.npy"
  bash "$here/examples/pipelines/raw-to-npy.sh" "$here/tests/fixtures/release-tiny/codes.raw" 16 "$codes"
fi
path="$(realpath "$codes")"
export GST_PLUGIN_PATH="$here/target/release${GST_PLUGIN_PATH:+:$GST_PLUGIN_PATH}"

QWENCODEC_MODEL_PATH="$model" gst-launch-1.0 -q playbin uri="file://${path// /%20}" \
  audio-sink="${AUDIO_SINK:-autoaudiosink}"
