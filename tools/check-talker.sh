#!/usr/bin/env bash
# Talker streaming exactness, against the installed package: builds the tiny random talkers
# with upstream's classes into a temp folder (the torch venv's python, tools/setup-reference.sh),
# then, with the venv that tools/setup-packages.sh pip-installs python/'s packages into, checks
# that qwencodec_talker streams exactly upstream's non-streaming codes, that seeded streams keep
# to their own randomness, that a Base talker clones a reference WAV as upstream's wrapper does,
# that our loop's streams batched make their solo codes, and that the
# qwencodec-talker command's destinations (raw codes, RTP, the media server's /codes, SIGINT's
# cancel) carry exactly its frames. The plugin reaches that venv as docs/talker.md tells users:
# GST_PLUGIN_PATH (target/release, built by make build).
set -euo pipefail
cd "$(dirname "$0")/.."
fixtures="${QWENCODEC_CACHE:-/var/cache/qwencodec}/venv/bin/python"
repo="$PWD"
python="$(bash tools/setup-packages.sh)/bin/python"
export GST_PLUGIN_PATH="$PWD/target/release"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
log="$tmp/log"
start=$SECONDS
if ! "$fixtures" tools/make_talker_fixture.py --kind all --out "$tmp/models" >"$log" 2>&1; then
  cat "$log" >&2
  echo "check-talker: FAILED making the tiny talkers" >&2
  exit 1
fi
# check NAME: tests/talker/test_NAME.py on the tiny talkers, run from the temp folder (nothing
# of the checkout's python/ on the path, only what pip installed); prints its "talker ...: "
# summary, or shows its log and fails.
check() {
  if ! (cd "$tmp" && "$python" "$repo/tests/talker/test_$1.py" "$tmp/models") >"$log" 2>&1; then
    grep -v "pad_token_id\|OrderedVocab" "$log" >&2
    echo "check-talker: $1 FAILED ($((SECONDS - start)) s)" >&2
    exit 1
  fi
  grep "^talker $2: " "$log" | sed "s/^talker $2: //"
}
exactness="$(check exact exactness)"
loop="$(check loop loop)"
seeds="$(check seeds seeds)"
clone="$(check clone clone)"
batch="$(check batch batch)"
destinations="$(check destinations destinations)"
echo "check-talker: ok, $exactness; loop: $loop; seeds: $seeds; clone: $clone; batch: $batch; $destinations ($((SECONDS - start)) s)"
