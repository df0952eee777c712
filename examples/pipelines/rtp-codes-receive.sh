#!/usr/bin/env bash
# Receives codes over RTP (from examples/pipelines/rtp-codes-send.sh), decodes them here and writes the
# speech to a WAV file.
#   examples/pipelines/rtp-codes-receive.sh [OUT.wav] [MODEL]
# ADDRESS and PORT (environment; default 127.0.0.1 and 5004) say where to listen; DEVICE as in
# codes-to-wav.sh. The caps are what an SDP's a=rtpmap and a=fmtp carry (docs/rtp-codes.md): the
# payload's version (1), CODEBOOKS (16), CODEBOOK_SIZE (2048), CLOCK_RATE (24000),
# SAMPLES_PER_FRAME (1920). Lost frames are filled with the last one (plc=true: docs/rtp-codes.md#loss).
# RTP has no end of stream: the receiver ends by itself (IDLE_TIMEOUT,
# WAIT_TIMEOUT: lib/receive-until-idle.sh).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
. "$here/lib/receive-until-idle.sh"
out="${1:-received.wav}"
model="${2:-${QWENCODEC_MODEL_PATH:-$root/tests/fixtures/release-tiny}}"
export GST_PLUGIN_PATH="$root/target/release${GST_PLUGIN_PATH:+:$GST_PLUGIN_PATH}"
rtp_caps="application/x-rtp,media=audio,encoding-name=X-QWEN3-TTS-CODES,payload=96"
rtp_caps+=",clock-rate=${CLOCK_RATE:-24000},version=(string)1,codebooks=(string)${CODEBOOKS:-16}"
rtp_caps+=",codebook-size=(string)${CODEBOOK_SIZE:-2048},samples-per-frame=(string)${SAMPLES_PER_FRAME:-1920}"

# filesink unbuffered: the file grows as audio arrives, which is how the receiver sees it.
receive_until_idle "$out" rtp-codes-receive \
  udpsrc address="${ADDRESS:-127.0.0.1}" port="${PORT:-5004}" caps="$rtp_caps" \
  ! rtpjitterbuffer latency=100 do-lost=true ! rtpqwencodesdepay \
  ! qwencodecdec model-path="$model" device="${DEVICE:-auto}" plc=true \
  ! audioconvert ! audio/x-raw,format=S16LE,channels=1 \
  ! wavenc ! filesink location="$out" buffer-mode=unbuffered
