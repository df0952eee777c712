#!/usr/bin/env bash
# Plays codec frames as they are decoded, paced by the audio sink's clock.
#   examples/pipelines/play-live.sh [CODES.raw] [MODEL]
# AUDIO_SINK overrides the sink (default autoaudiosink), e.g. AUDIO_SINK="fakesink sync=true"
# where there is no sound card. CODEBOOKS, FRAMERATE, DEVICE as in codes-to-wav.sh.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
codes="${1:-$here/tests/fixtures/release-tiny/codes.raw}"
model="${2:-${QWENCODEC_MODEL_PATH:-$here/tests/fixtures/release-tiny}}"
export GST_PLUGIN_PATH="$here/target/release${GST_PLUGIN_PATH:+:$GST_PLUGIN_PATH}"

# shellcheck disable=SC2086 # AUDIO_SINK is a pipeline fragment
gst-launch-1.0 -q filesrc location="$codes" \
  ! "audio/x-qwen3-tts-codes,codebooks=${CODEBOOKS:-16},framerate=${FRAMERATE:-25/2}" \
  ! qwencodecdec model-path="$model" device="${DEVICE:-auto}" \
  ! queue ! audioconvert ! audioresample ! ${AUDIO_SINK:-autoaudiosink}
