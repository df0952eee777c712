#!/usr/bin/env bash
# Decodes codec frames and sends the speech as Opus over RTP (UDP), paced in real time.
#   examples/pipelines/rtp-send.sh [CODES.raw] [MODEL]
# HOST and PORT (environment; default 127.0.0.1 and 5004) say where to send; examples/pipelines/rtp-receive.sh
# is the other end. CODEBOOKS, FRAMERATE, DEVICE as in codes-to-wav.sh.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
codes="${1:-$here/tests/fixtures/release-tiny/codes.raw}"
model="${2:-${QWENCODEC_MODEL_PATH:-$here/tests/fixtures/release-tiny}}"
export GST_PLUGIN_PATH="$here/target/release${GST_PLUGIN_PATH:+:$GST_PLUGIN_PATH}"

# Opus takes 8, 12, 16, 24 or 48 kHz: audioresample covers models at other rates.
# udpsink syncs to the clock, so packets leave at the pace of the audio.
gst-launch-1.0 -q filesrc location="$codes" \
  ! "audio/x-qwen3-tts-codes,codebooks=${CODEBOOKS:-16},framerate=${FRAMERATE:-25/2}" \
  ! qwencodecdec model-path="$model" device="${DEVICE:-auto}" \
  ! audioconvert ! audioresample ! opusenc audio-type=voice \
  ! rtpopuspay pt=96 ! queue ! udpsink host="${HOST:-127.0.0.1}" port="${PORT:-5004}"
