#!/usr/bin/env bash
# Packs what tools/gpu-check.sh needs on a GPU host that has PyTorch 2.11.0 but neither Rust
# nor GStreamer: the CUDA test, benchmark and soak binaries built here (against the same torch,
# each with the plugin inside), Debian's GStreamer/GLib libraries they load, and the wheels of
# the upstream decoder's and talker's pinned Python packages (qwen-tts and its transformers).
# Output: gpu-bundle/ (git-ignored; carry it to the GPU host with the repository's tools/,
# benches/tools/, python/ and tests/fixtures/). Nothing in it depends
# on where this checkout is: the binaries take their fixtures and model folders from
# QWENCODEC_FIXTURES and their command lines, and find libtorch through LD_LIBRARY_PATH before
# their build-time runpath.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="$root/gpu-bundle"
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/plugins" "$out/wheels"

# The path of the executable cargo built for target NAME, from its JSON messages.
executable() {
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$1"
}
# A failed build stops the script here (set -e, pipefail), with cargo's errors on stderr.
cuda_tests="$(cargo test --release --test cuda --no-run --message-format=json | executable cuda)"
bench="$(cargo bench --bench decode --no-run --message-format=json | executable decode)"
streams="$(cargo bench --bench streams --no-run --message-format=json | executable streams)"
cp "$cuda_tests" "$out/bin/cuda-tests"
cp "$bench" "$out/bin/bench"
cp "$streams" "$out/bin/streams"
cargo build --release --example soak
cp target/release/examples/soak "$out/bin/soak"
# The binaries register the plugin themselves; a copy in plugins/ would be found by the registry
# scan first, and registering the same plugin again fails.
cp /usr/lib/x86_64-linux-gnu/gstreamer-1.0/libgstapp.so "$out/plugins/"

# Every library these load, except torch's (the host's own are used) and the C/C++ runtime.
for file in "$out"/bin/* "$out"/plugins/*; do
  ldd "$file" | awk '/=>/ { print $3 }'
done | grep -v -E '/(libtorch|libc10|libgomp|libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libdl\.so|libpthread|librt\.so|libutil\.so)' \
  | grep -v -E 'site-packages' | sort -u | xargs -r cp -L -t "$out/lib/"

# transformers 4.57.3 checks its pins at import: bring them all (pure Python but tokenizers).
pip_download() { "${QWENCODEC_CACHE:-/var/cache/qwencodec}/venv/bin/python" -m pip download -q --no-deps -d "$out/wheels" "$@"; }
pip_download transformers==4.57.3 huggingface_hub==0.36.2 qwen-tts==0.1.1
pip_download --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 tokenizers==0.22.2
du -sh "$out"
