#!/usr/bin/env bash
# Runs tests of one cargo test target by their exact names, and fails unless each of them ran
# and passed: a name filter that matches nothing (a test renamed) runs nothing, and passes.
# Usage: tools/test-named.sh TARGET NAME... (the environment passes through to the tests).
# --workspace: the build of make test's cargo test --workspace (features of the whole
# workspace), not one of the root package's alone.
set -euo pipefail
target=$1
shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --release --workspace --test "$target" -- --exact "$@" 2>&1 | tee "$log"
if ! grep -q "^test result: ok\. $# passed; 0 failed; 0 ignored" "$log"; then
    echo "tools/test-named.sh: $target did not run and pass all of: $*" >&2
    exit 1
fi
