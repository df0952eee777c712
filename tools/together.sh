#!/usr/bin/env bash
# Runs each argument (a shell command line) at the same time as the others, for make test's
# checks that leave a core idle (a fuzz target takes one); each one's output is shown whole once
# all have ended, in the order given. Fails, naming them, if any failed.
#   bash tools/together.sh "bash tools/fuzz-short.sh" "bash tools/check-talker.sh"
set -uo pipefail
cd "$(dirname "$0")/.."
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
pids=()
for index in $(seq 1 $#); do
  bash -c "${!index}" >"$scratch/$index" 2>&1 &
  pids+=("$!")
done
failed=()
for index in $(seq 1 $#); do
  status=0
  wait "${pids[index - 1]}" || status=$?
  echo "+ ${!index}"
  cat "$scratch/$index"
  [ "$status" -eq 0 ] || failed+=("${!index} (status $status)")
done
if [ ${#failed[@]} -gt 0 ]; then
  printf 'together: failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
