#!/usr/bin/env bash
# After the set-up, plain cargo works in a fresh shell, as the README and docs show it: no venv
# on PATH, no torch-sys variable set (the set-up's .cargo/config.toml names libtorch). The one
# variable kept is QWENCODEC_WERROR, which make sets for the build: with it the check reuses
# make's build instead of compiling the C++ kernels again.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo_dir="$(dirname "$(command -v cargo)")"
plain() {
  env -i HOME="$HOME" PATH="$cargo_dir:/usr/local/bin:/usr/bin:/bin" QWENCODEC_WERROR=1 "$@"
}

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
if ! plain cargo build --release --workspace >"$scratch/log" 2>&1; then
  cat "$scratch/log" >&2
  echo "check-plain-cargo: cargo build --release --workspace fails in a plain shell" >&2
  exit 1
fi
# The server runs, finding libtorch by the rpath alone.
if ! plain cargo run --release -p qwencodec-server -- --help >"$scratch/help" 2>&1; then
  cat "$scratch/help" >&2
  echo "check-plain-cargo: cargo run --release -p qwencodec-server -- --help fails in a plain shell" >&2
  exit 1
fi
grep -q -- "--bind" "$scratch/help" ||
  { cat "$scratch/help" >&2; echo "check-plain-cargo: qwencodec-server --help printed no usage" >&2; exit 1; }
echo "check-plain-cargo: cargo build and cargo run work in a plain shell"
