#!/usr/bin/env bash
# A short run of the .npy header fuzz target (fuzz/), as CI does; FUZZ_SECONDS sets its length.
# cargo-fuzz is installed once per machine into the cache folder. Its sanitizer flags need a
# nightly rustc: RUSTC_BOOTSTRAP lets the stable one take them.
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${QWENCODEC_CACHE:-/var/cache/qwencodec}"
seconds="${FUZZ_SECONDS:-30}"
cargo_fuzz_version="0.13.2"
export PATH="$cache/cargo/bin:$PATH"

if ! cargo fuzz --version 2>/dev/null | grep -q "$cargo_fuzz_version"; then
  echo "fuzz: installing cargo-fuzz $cargo_fuzz_version into $cache/cargo (once per machine)"
  cargo install --quiet --locked --root "$cache/cargo" --version "$cargo_fuzz_version" cargo-fuzz
fi

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cd fuzz
status=0
mkdir "$scratch/corpus"
RUSTC_BOOTSTRAP=1 cargo fuzz run npy_header "$scratch/corpus" -- \
  -dict=npy.dict -max_total_time="$seconds" -print_final_stats=1 >"$scratch/log" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then
  tail -n 60 "$scratch/log" >&2
  echo "fuzz: npy_header failed (status $status)" >&2
  exit "$status"
fi
runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$scratch/log" | grep -o '[0-9]*$')"
echo "fuzz: npy_header ran ${runs:-?} inputs in ${seconds} s without a failure"
