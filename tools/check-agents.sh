#!/usr/bin/env bash
# The framework integrations (pipecat-qwencodec, livekit-plugins-qwencodec) and the speech
# endpoint (qwencodec-speech) with the frameworks' OpenAI clients, against the installed
# packages: runs every tests/agents/test_*.py with the venv that tools/setup-packages.sh
# pip-installs python/'s packages into, each file as its own process from a temp folder (nothing
# of the checkout's python/ on the path), with GLib criticals fatal (G_DEBUG=fatal_warnings).
# Fails if any fails or if none ran. The tiny CustomVoice and VoiceDesign talkers are made once
# into the temp folder (the torch venv's python, tools/setup-reference.sh) and named to the tests
# by $QWENCODEC_TALKER_CV and $QWENCODEC_TALKER_VD; the decoder is tests/fixtures/release-tiny. The plugin reaches the venv
# as docs/talker.md tells users: GST_PLUGIN_PATH (target/release, built by make build).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
fixtures="${QWENCODEC_CACHE:-/var/cache/qwencodec}/venv/bin/python"
python="$(bash tools/setup-packages.sh)/bin/python"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
for kind in custom_voice voice_design; do
  if ! "$fixtures" tools/make_talker_fixture.py --kind "$kind" --out "$tmp/$kind" >"$tmp/log" 2>&1; then
    cat "$tmp/log" >&2
    echo "check-agents: FAILED making the tiny $kind talker" >&2
    exit 1
  fi
done
export QWENCODEC_TALKER_CV="$tmp/custom_voice" QWENCODEC_TALKER_VD="$tmp/voice_design" G_DEBUG=fatal_warnings GST_PLUGIN_PATH="$repo/target/release"
ran=0
failed=()
for test in tests/agents/test_*.py; do
  [ -e "$test" ] || continue
  ran=$((ran + 1))
  t=$SECONDS
  if (cd "$tmp" && "$python" "$repo/$test") >"$tmp/log" 2>&1; then
    echo "check-agents: $test ok ($((SECONDS - t)) s): $(tail -n 1 "$tmp/log")"
  else
    grep -v "pad_token_id\|OrderedVocab\| | DEBUG \| | TRACE " "$tmp/log" | tail -n 60 >&2
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
