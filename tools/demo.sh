#!/usr/bin/env bash
# The main job: decode the bundled codes to a WAV with gst-launch, then say what was written.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$here/demo.wav}"
"$here/pipelines/codes-to-wav.sh" "${CODES:-$here/tests/fixtures/release-tiny/codes.raw}" "$out" "${MODEL:-}"

# wavenc's header: rate at byte 24, channels at 22, bits at 34, the data chunk's size at 40 (a
# chunk of tags may follow the data).
rate=$(od -An -tu4 -j24 -N4 "$out" | tr -d ' ')
channels=$(od -An -tu2 -j22 -N2 "$out" | tr -d ' ')
bits=$(od -An -tu2 -j34 -N2 "$out" | tr -d ' ')
bytes=$(od -An -tu4 -j40 -N4 "$out" | tr -d ' ')
echo "wrote $out: $(awk -v b="$bytes" -v r="$rate" -v c="$channels" -v s="$bits" \
  'BEGIN { printf "%.3f s", b / (r * c * s / 8) }') of audio, ${rate} Hz, ${channels} channel(s), ${bits}-bit"
