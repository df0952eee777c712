#!/usr/bin/env bash
# Talker streaming exactness: builds the tiny random talkers with upstream's classes into a
# temp folder, then checks that python/qwencodec_talker streams exactly upstream's
# non-streaming codes, and that its command line's destinations (raw codes, RTP, the media
# server's /codes, SIGINT's cancel) carry exactly its frames.
# Needs the venv with tools/setup-reference.sh, setup-load.sh (websockets) and setup-agents.sh
# (PyGObject) applied, and the plugin built.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${QWENCODEC_CACHE:-/var/cache/qwencodec}/venv/bin/python"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
log="$tmp/log"
start=$SECONDS
if ! "$python" tools/make_talker_fixture.py --kind all --out "$tmp/models" >"$log" 2>&1; then
  cat "$log" >&2
  echo "check-talker: FAILED making the tiny talkers" >&2
  exit 1
fi
if ! "$python" tests/talker/test_exact.py "$tmp/models" >"$log" 2>&1; then
  grep -v "pad_token_id" "$log" >&2
  echo "check-talker: FAILED ($((SECONDS - start)) s)" >&2
  exit 1
fi
exactness="$(grep '^talker exactness' "$log" | sed 's/^talker exactness: //')"
"$python" tests/talker/test_loop.py "$tmp/models" >"$log" 2>&1 || { grep -v "pad_token_id" "$log" >&2; echo "check-talker: loop FAILED ($((SECONDS - start)) s)" >&2; exit 1; }
if ! "$python" tests/talker/test_destinations.py "$tmp/models" >"$log" 2>&1; then
  grep -v "pad_token_id" "$log" >&2
  echo "check-talker: destinations FAILED ($((SECONDS - start)) s)" >&2
  exit 1
fi
echo "check-talker: ok, $exactness; $(grep '^talker destinations' "$log" | sed 's/^talker destinations: //') ($((SECONDS - start)) s)"
