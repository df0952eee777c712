#!/usr/bin/env bash
# Makes the checkpoint that tests/released_geometry.rs decodes, once per machine: the released
# geometry at full widths with random weights (preset full-release of tools/make_fixtures.py,
# about 460 MB, too large to commit) and upstream's float64 decode of its codes, in the cache
# folder. Needs tools/setup-reference.sh. Idempotent: does nothing when the checkpoint is there.
set -euo pipefail

cache="${QWENCODEC_CACHE:-/var/cache/qwencodec}"
python="$cache/venv/bin/python"
# 80 frames: more than the attention window (72), so that the KV window both fills and slides.
# tests/released_geometry.rs reads the same folder name.
frames=80
name="full-release-$frames"
dir="$cache/fixtures/$name"

[ -f "$dir/expected.safetensors" ] && exit 0

echo "released-fixture: making $dir (a minute or two)"
mkdir -p "$cache/fixtures"
# Made aside and moved into place whole, so that an interrupted run leaves nothing to load.
work="$(mktemp -d "$cache/fixtures/.$name.XXXXXX")"
trap 'rm -rf "$work"' EXIT
"$python" "$(dirname "$0")/make_fixtures.py" --preset full-release --frames "$frames" --out "$work"
rm -rf "$dir"
chmod -R a+rX "$work/full-release"  # a cache shared by every user of the machine
mv -T "$work/full-release" "$dir"
