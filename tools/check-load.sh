#!/usr/bin/env bash
# A short WebRTC load run for make test: the server (built already, by cargo build
# --release -p qwencodec-server) on the bundled release-tiny checkpoint, two aiortc peers at once
# with 3 s of speech each. Fails when a session does not connect, underruns, receives under 90 % of
# the audio sent, hears its first audio later than 400 ms, or the server keeps a session or a
# pipeline after they closed (tools/webrtc_load.py --expect-clean; docs/load-test.md).
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${QWENCODEC_CACHE:-/var/cache/qwencodec}"
python="$cache/venv/bin/python"
server="${CARGO_TARGET_DIR:-target}/release/qwencodec-server"

fail() {
  echo "check-load: $*" >&2
  exit 1
}

[ -x "$server" ] || fail "no $server: build it first (make build)"
bash tools/setup-load.sh

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

# Whether every problem the run reports is a failed DTLS handshake.
only_dtls_failures() {
  "$python" - "$1" <<'PY'
import json, sys

try:
    problems = json.load(open(sys.argv[1]))["problems"]
except (OSError, ValueError, KeyError):
    sys.exit(1)
sys.exit(0 if problems and all("DTLS failed" in problem for problem in problems) else 1)
PY
}

# Short OpenMP spinning, as make test runs everything else: the peers share the cores with it.
run() {
  GOMP_SPINCOUNT="${GOMP_SPINCOUNT:-1000}" "$python" tools/webrtc_load.py --sessions 2 --seconds 3 \
    --expect-clean --server-binary "$server" --model tests/fixtures/release-tiny \
    --json "$scratch/load.json" --markdown "$scratch/load.md" --server-log "$scratch/server.log" \
    >"$scratch/out" 2>&1
}

# One known fault is not ours to fix: about 3 in 1,000 aiortc sessions fail their DTLS
# handshake ("Fatal SSL error" in GStreamer 1.22's dtlsdec, with the right certificate; never
# seen with Chromium; docs/load-test.md). A run whose only problem is that runs once more, and
# says so; any other problem, or that one twice, fails.
reruns=0
if ! run; then
  if only_dtls_failures "$scratch/load.json"; then
    echo "check-load: a DTLS handshake failed (a known GStreamer 1.22 fault with aiortc); running again" >&2
    run_status=0
    reruns=1
    run || run_status=$?
  else
    run_status=1
  fi
  if [ "$run_status" -ne 0 ]; then
    cat "$scratch/out" >&2
    echo "--- the server's log, last lines:" >&2
    tail -n 30 "$scratch/server.log" >&2 || true
    fail "the load run was not clean"
  fi
fi

"$python" - "$scratch/load.json" "$reruns" <<'PY'
import json, sys

report = json.load(open(sys.argv[1]))
results = report["run"]["results"]
assert len(results) == 2, f"{len(results)} sessions ran, not 2"
assert all(len(r["first_audio_ms"]) == 1 and r["first_audio_ms"][0] is not None for r in results), results
summary = report["run"]["summary"]
print(
    "check-load: ok; first audio",
    ", ".join(f"{r['first_audio_ms'][0]:.0f} ms" for r in results) + ";",
    f"received at least {min(r['received_fraction'] for r in results):.0%} of the audio;",
    f"largest lateness {summary['max_lateness_ms']} ms;",
    f"reruns after a DTLS fault: {sys.argv[2]} of at most 1",
)
PY
