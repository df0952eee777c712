#!/usr/bin/env bash
# Receives Opus over RTP (from pipelines/rtp-send.sh) and writes the audio to a WAV file.
#   pipelines/rtp-receive.sh [OUT.wav]
# ADDRESS and PORT (environment; default 127.0.0.1 and 5004) say where to listen. RTP has no
# end of stream, so the receiver ends by itself: once audio has arrived and then none has come
# for IDLE_TIMEOUT seconds (default 2), or when nothing at all came in WAIT_TIMEOUT seconds
# (default 60; exit status 1). Ctrl-C ends it too; the WAV is complete in every case.
set -euo pipefail
out="${1:-received.wav}"
idle_timeout="${IDLE_TIMEOUT:-2}"
wait_timeout="${WAIT_TIMEOUT:-60}"
rtp_caps="application/x-rtp,media=audio,clock-rate=48000,encoding-name=OPUS,payload=96"

rm -f "$out"
# -e: on SIGINT, gst-launch sends EOS first, so that wavenc writes the final header.
# filesink unbuffered: the file grows as audio arrives, which is how the loop below sees it.
gst-launch-1.0 -q -e udpsrc address="${ADDRESS:-127.0.0.1}" port="${PORT:-5004}" caps="$rtp_caps" \
  ! rtpjitterbuffer latency=100 ! rtpopusdepay ! opusdec \
  ! audioconvert ! audio/x-raw,format=S16LE,channels=1 \
  ! wavenc ! filesink location="$out" buffer-mode=unbuffered &
receiver=$!
stop() {
  kill -INT "$receiver" 2>/dev/null || true
  wait "$receiver"
}
trap 'stop; exit 130' INT TERM

size() { stat -c %s "$out" 2>/dev/null || echo 0; }
tick=0.2
ticks_per_second=5
waited=0
while [ "$(size)" -le 44 ]; do # nothing past the WAV header yet
  if ! kill -0 "$receiver" 2>/dev/null; then
    wait "$receiver"
    exit 1
  fi
  if [ "$waited" -ge $((wait_timeout * ticks_per_second)) ]; then
    echo "rtp-receive: nothing arrived on port ${PORT:-5004} in ${wait_timeout} s" >&2
    stop
    exit 1
  fi
  sleep "$tick"
  waited=$((waited + 1))
done

last_size=$(size)
quiet=0
while [ "$quiet" -lt $((idle_timeout * ticks_per_second)) ]; do
  sleep "$tick"
  current=$(size)
  if [ "$current" = "$last_size" ]; then quiet=$((quiet + 1)); else quiet=0; fi
  last_size=$current
done
stop
echo "rtp-receive: wrote $out"
