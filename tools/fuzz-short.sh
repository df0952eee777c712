#!/usr/bin/env bash
# A short run of each fuzz target (fuzz/), as CI does: the .npy header reader (FUZZ_SECONDS, 30
# by default) and what the server takes from anyone (FUZZ_MESSAGE_SECONDS, 15 each): the
# signalling and codes messages, the SDP answers and ICE candidates that go on to webrtcbin, and
# the join tokens; and what a codes-over-RTP receiver takes from anyone (FUZZ_MESSAGE_SECONDS):
# the payload and the depayloader's packet path. A target with seeds (fuzz/seeds/TARGET) starts
# from them. cargo-fuzz is installed once per machine into the cache folder. Its sanitizer flags
# need a nightly rustc: RUSTC_BOOTSTRAP lets the stable one take them.
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${QWENCODEC_CACHE:-/var/cache/qwencodec}"
cargo_fuzz_version="0.13.2"
export PATH="$cache/cargo/bin:$PATH"

if ! cargo fuzz --version 2>/dev/null | grep -q "$cargo_fuzz_version"; then
  echo "fuzz: installing cargo-fuzz $cargo_fuzz_version into $cache/cargo (once per machine)"
  cargo install --quiet --locked --root "$cache/cargo" --version "$cargo_fuzz_version" cargo-fuzz
fi

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cd fuzz

# fuzz TARGET SECONDS [libFuzzer options...]
fuzz() {
  local target="$1" seconds="$2"
  shift 2
  local status=0
  mkdir -p "$scratch/$target"
  local corpora=("$scratch/$target")
  if [ -d "seeds/$target" ]; then corpora+=("seeds/$target"); fi
  RUSTC_BOOTSTRAP=1 cargo fuzz run "$target" "${corpora[@]}" -- \
    "$@" -max_total_time="$seconds" -print_final_stats=1 >"$scratch/$target.log" 2>&1 || status=$?
  if [ "$status" -ne 0 ]; then
    tail -n 60 "$scratch/$target.log" >&2
    echo "fuzz: $target failed (status $status)" >&2
    exit "$status"
  fi
  local runs
  runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$scratch/$target.log" | grep -o '[0-9]*$')"
  echo "fuzz: $target ran ${runs:-?} inputs in ${seconds} s without a failure"
}

fuzz npy_header "${FUZZ_SECONDS:-30}" -dict=npy.dict
fuzz signalling_message "${FUZZ_MESSAGE_SECONDS:-15}" -dict=messages.dict
fuzz codes_message "${FUZZ_MESSAGE_SECONDS:-15}" -dict=messages.dict
fuzz webrtc_text "${FUZZ_MESSAGE_SECONDS:-15}" -dict=webrtc.dict
fuzz join_token "${FUZZ_MESSAGE_SECONDS:-15}"
fuzz rtp_codes "${FUZZ_MESSAGE_SECONDS:-15}"
