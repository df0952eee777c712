#!/usr/bin/env bash
# The plugin as gst-inspect-1.0 sees it, from a fresh registry: it must load without a
# warning or critical, and list its five features.
set -euo pipefail
cd "$(dirname "$0")/.."

plugin_dir="$(realpath "${1:-target/release}")"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
export GST_PLUGIN_PATH="$plugin_dir" GST_REGISTRY="$scratch/registry.bin" G_DEBUG=fatal_warnings

for what in qwencodec qwencodecdec qwencodecparse rtpqwencodespay rtpqwencodesdepay; do
  if ! gst-inspect-1.0 "$what" >"$scratch/out" 2>"$scratch/err"; then
    cat "$scratch/err" >&2
    echo "check-inspect: gst-inspect-1.0 $what failed" >&2
    exit 1
  fi
  if [ -s "$scratch/err" ]; then
    cat "$scratch/err" >&2
    echo "check-inspect: gst-inspect-1.0 $what wrote to stderr" >&2
    exit 1
  fi
done
gst-inspect-1.0 qwencodec >"$scratch/out"
# GST_PLUGIN_PATH is scanned recursively: make sure this build is the one loaded.
grep -q "Filename *$plugin_dir/libgstqwencodec.so$" "$scratch/out" ||
  { grep Filename "$scratch/out" >&2; echo "check-inspect: not the plugin in $plugin_dir" >&2; exit 1; }
for feature in qwencodecdec qwencodecparse rtpqwencodespay rtpqwencodesdepay qwencodec_npy; do
  grep -q "^  $feature: " "$scratch/out" || { echo "check-inspect: no $feature in the plugin" >&2; exit 1; }
done
echo "check-inspect: gst-inspect-1.0 loads the plugin and its 5 features cleanly"
