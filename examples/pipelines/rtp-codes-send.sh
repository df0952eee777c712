#!/usr/bin/env bash
# Sends codec frames as codes over RTP (X-QWEN3-TTS-CODES, docs/rtp-codes.md), paced in real
# time: the speech is decoded where it is heard (examples/pipelines/rtp-codes-receive.sh).
#   examples/pipelines/rtp-codes-send.sh [CODES.raw]
# HOST and PORT (environment; default 127.0.0.1 and 5004) say where to send; FRAMES_PER_PACKET
# (default 1: the lowest latency); CODEBOOKS and FRAMERATE as in codes-to-wav.sh. No model here.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
codes="${1:-$here/tests/fixtures/release-tiny/codes.raw}"
export GST_PLUGIN_PATH="$here/target/release${GST_PLUGIN_PATH:+:$GST_PLUGIN_PATH}"

# qwencodecparse times the frames; udpsink syncs to the clock, so packets leave at the pace of
# the audio.
gst-launch-1.0 -q filesrc location="$codes" \
  ! "audio/x-qwen3-tts-codes,codebooks=${CODEBOOKS:-16},framerate=${FRAMERATE:-25/2}" \
  ! qwencodecparse ! rtpqwencodespay pt=96 frames-per-packet="${FRAMES_PER_PACKET:-1}" \
  ! udpsink host="${HOST:-127.0.0.1}" port="${PORT:-5004}"
