#!/usr/bin/env bash
# The main job: decode the bundled codes to a WAV with gst-launch, then text to speech through
# the talker and the same decoder; say what was written each time.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$here/demo.wav}"
"$here/examples/pipelines/codes-to-wav.sh" "${CODES:-$here/tests/fixtures/release-tiny/codes.raw}" "$out" "${MODEL:-}"

# wavenc's header: rate at byte 24, channels at 22, bits at 34, the data chunk's size at 40 (a
# chunk of tags may follow the data).
describe() {
  local rate channels bits bytes
  rate=$(od -An -tu4 -j24 -N4 "$1" | tr -d ' ')
  channels=$(od -An -tu2 -j22 -N2 "$1" | tr -d ' ')
  bits=$(od -An -tu2 -j34 -N2 "$1" | tr -d ' ')
  bytes=$(od -An -tu4 -j40 -N4 "$1" | tr -d ' ')
  echo "wrote $1: $(awk -v b="$bytes" -v r="$rate" -v c="$channels" -v s="$bits" \
    'BEGIN { printf "%.3f s", b / (r * c * s / 8) }') of audio, ${rate} Hz, ${channels} channel(s), ${bits}-bit$2"
}
describe "$out" ""

# Text to speech: TALKER=<checkpoint> (with its speech_tokenizer/) speaks TEXT; by default a tiny
# random talker made once with upstream's code (noise, but every stage real) and the bundled
# decoder.
text="${TEXT:-Hello from the Qwen3-TTS talker, streamed into GStreamer.}"
tts_out="${out%.wav}-tts.wav"
if [ -n "${TALKER:-}" ]; then
  "$here/examples/pipelines/text-to-wav.sh" "$TALKER" "$text" "$tts_out" ${SPEAKER:+--speaker "$SPEAKER"} 2>"$tts_out.log" \
    || { cat "$tts_out.log" >&2; exit 1; }
else
  talker="${QWENCODEC_CACHE:-/var/cache/qwencodec}/fixtures/talker-tiny-custom_voice"
  python="${QWENCODEC_CACHE:-/var/cache/qwencodec}/venv/bin/python"
  if [ ! -f "$talker/model.safetensors" ]; then
    "$python" "$here/tools/make_talker_fixture.py" --kind custom_voice --out "$talker" >"$tts_out.log" 2>&1 \
      || { cat "$tts_out.log" >&2; exit 1; }
  fi
  DECODER="$here/tests/fixtures/release-tiny" "$here/examples/pipelines/text-to-wav.sh" "$talker" "$text" "$tts_out" \
    --speaker vivian --seed 1 2>"$tts_out.log" || { cat "$tts_out.log" >&2; exit 1; }
fi
frames="$(grep -o 'sent [0-9]* frames' "$tts_out.log" | tail -1)"
rm -f "$tts_out.log"
describe "$tts_out" " (\"$text\": the talker $frames)"
