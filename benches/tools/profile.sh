#!/usr/bin/env bash
# make profile: where one stream's steps spend their time on this machine, in one command.
# benches/profile.rs runs the steps (timed under perf's sampling, then under libtorch's op
# profiler) and benches/tools/profile_report.py writes measurements/results/<cpu>/profile-<device>-
# <dtype>-c<frames>[-s<streams>].md and .json (PROFILE_RESULTS names another folder for
# measurements/results). Arguments go to the benchmark (--chunk-frames, --dtype, --steps,
# --device, --streams). Without perf (or its permission) the report has the op profile only.
set -euo pipefail

model="$1"
shift
raw="measurements/cache/profile"
rm -rf "$raw"
mkdir -p "$raw"

if ! command -v perf >/dev/null; then
  echo "profile: installing linux-perf"
  apt_get() { if [ "$(id -u)" = 0 ]; then apt-get "$@"; else sudo apt-get "$@"; fi; }
  { apt_get update -q && DEBIAN_FRONTEND=noninteractive apt_get install -y -q --no-install-recommends linux-perf; } ||
    echo "profile: no perf; the report will have the op profile only" >&2
fi

cargo bench --bench profile --no-run
bench=(cargo bench --bench profile -- --model "$model" --out "$raw" "$@")
perf_args=()
# Samples stamped with CLOCK_MONOTONIC, the clock the benchmark marks its timed steps with.
if command -v perf >/dev/null &&
  perf record -q -F 999 -k CLOCK_MONOTONIC -o "$raw/perf.data" -- "${bench[@]}"; then
  if perf script -i "$raw/perf.data" -F pid,tid,comm,time,ip,sym,dso 2>/dev/null >"$raw/perf.txt"; then
    perf_args=(--perf "$raw/perf.txt")
  else
    echo "profile: perf script failed; the report will have the op profile only" >&2
  fi
else
  echo "profile: perf record failed; profiling without it" >&2
  "${bench[@]}"
fi
python3 benches/tools/profile_report.py "$raw" "${perf_args[@]}" --out-dir "${PROFILE_RESULTS:-measurements/results}"
