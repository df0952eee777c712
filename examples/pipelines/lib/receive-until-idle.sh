# Sourced by the RTP receivers: runs a gst-launch pipeline that writes a WAV file and ends it
# by itself, since RTP has no end of stream: once audio has arrived and then none has come for
# IDLE_TIMEOUT seconds (default 2), or when nothing at all came in WAIT_TIMEOUT seconds
# (default 60; exit status 1). Ctrl-C ends it too; the WAV is complete in every case.
#   receive_until_idle OUT.wav WHAT gst-launch-arguments...
receive_until_idle() {
  local out="$1" what="$2"
  shift 2
  local idle_timeout="${IDLE_TIMEOUT:-2}" wait_timeout="${WAIT_TIMEOUT:-60}"
  rm -f "$out"
  # -e: on SIGINT, gst-launch sends EOS first, so that wavenc writes the final header.
  gst-launch-1.0 -q -e "$@" &
  local receiver=$!
  stop() {
    kill -INT "$receiver" 2>/dev/null || true
    wait "$receiver"
  }
  trap 'stop; exit 130' INT TERM

  size() { stat -c %s "$out" 2>/dev/null || echo 0; }
  local tick=0.2 ticks_per_second=5 waited=0
  while [ "$(size)" -le 44 ]; do # nothing past the WAV header yet
    if ! kill -0 "$receiver" 2>/dev/null; then
      wait "$receiver"
      return 1
    fi
    if [ "$waited" -ge $((wait_timeout * ticks_per_second)) ]; then
      echo "$what: nothing arrived in ${wait_timeout} s" >&2
      stop
      return 1
    fi
    sleep "$tick"
    waited=$((waited + 1))
  done

  local last_size current quiet=0
  last_size=$(size)
  while [ "$quiet" -lt $((idle_timeout * ticks_per_second)) ]; do
    sleep "$tick"
    current=$(size)
    if [ "$current" = "$last_size" ]; then quiet=$((quiet + 1)); else quiet=0; fi
    last_size=$current
  done
  stop
  echo "$what: wrote $out"
}
