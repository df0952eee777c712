#!/usr/bin/env bash
# The voice-agent adapters (python/qwencodec_agents): runs every
# tests/agents/test_*.py with the agents venv (tools/setup-agents.sh), each file as its own
# process, with GLib criticals fatal (G_DEBUG=fatal_warnings). Fails if any fails or if none ran.
# The tiny CustomVoice talker is made once into a temp folder and named to the tests by
# $QWENCODEC_TALKER_CV; the decoder is tests/fixtures/release-tiny. Needs the plugin built
# (target/release/libgstqwencodec.so, or $QWENCODEC_PLUGIN_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${QWENCODEC_CACHE:-/var/cache/qwencodec}/venv-agents/bin/python"
if [ ! -x "$python" ]; then
  echo "check-agents: no agents venv ($python); run tools/setup-agents.sh" >&2
  exit 1
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
if ! "$python" tools/make_talker_fixture.py --kind custom_voice --out "$tmp/cv" >"$tmp/log" 2>&1; then
  cat "$tmp/log" >&2
  echo "check-agents: FAILED making the tiny talker" >&2
  exit 1
fi
export QWENCODEC_TALKER_CV="$tmp/cv" G_DEBUG=fatal_warnings GST_PLUGIN_PATH="$PWD/target/release"
export PYTHONPATH="$PWD/python:$PWD/python/pipecat-qwencodec:$PWD/python/livekit-plugins-qwencodec"
ran=0
failed=()
for test in tests/agents/test_*.py; do
  [ -e "$test" ] || continue
  ran=$((ran + 1))
  t=$SECONDS
  if "$python" "$test" >"$tmp/log" 2>&1; then
    echo "check-agents: $test ok ($((SECONDS - t)) s): $(tail -n 1 "$tmp/log")"
  else
    grep -v "pad_token_id\| | DEBUG \| | TRACE " "$tmp/log" | tail -n 60 >&2
    echo "check-agents: $test FAILED ($((SECONDS - t)) s)" >&2
    failed+=("$test")
  fi
done
if [ "$ran" -eq 0 ]; then
  echo "check-agents: FAILED, no tests/agents/test_*.py ran" >&2
  exit 1
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "check-agents: FAILED ${failed[*]} ($((SECONDS - start)) s)" >&2
  exit 1
fi
echo "check-agents: ok, $ran test files ($((SECONDS - start)) s)"
