#!/usr/bin/env bash
# Receives Opus over RTP (from examples/pipelines/rtp-send.sh) and writes the audio to a WAV file.
#   examples/pipelines/rtp-receive.sh [OUT.wav]
# ADDRESS and PORT (environment; default 127.0.0.1 and 5004) say where to listen. RTP has no
# end of stream: the receiver ends by itself (IDLE_TIMEOUT, WAIT_TIMEOUT: lib/receive-until-idle.sh).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/lib/receive-until-idle.sh"
out="${1:-received.wav}"
rtp_caps="application/x-rtp,media=audio,clock-rate=48000,encoding-name=OPUS,payload=96"

# filesink unbuffered: the file grows as audio arrives, which is how the receiver sees it.
receive_until_idle "$out" rtp-receive \
  udpsrc address="${ADDRESS:-127.0.0.1}" port="${PORT:-5004}" caps="$rtp_caps" \
  ! rtpjitterbuffer latency=100 ! rtpopusdepay ! opusdec \
  ! audioconvert ! audio/x-raw,format=S16LE,channels=1 \
  ! wavenc ! filesink location="$out" buffer-mode=unbuffered
