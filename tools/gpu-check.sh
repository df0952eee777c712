#!/usr/bin/env bash
# The GPU checks in one command, on a GPU host with PyTorch 2.11.0 (Python 3.12) but neither
# Rust nor GStreamer. Run it from the repository root with gpu-bundle/ (make gpu-bundle) beside
# it; what it reads there: gpu-bundle/, tools/, benches/tools/, python/ (the talker) and
# tests/fixtures/ (the binaries find the fixtures through QWENCODEC_FIXTURES, not the build
# machine's paths).
#
# First the bundle on the CPU, so that a bundle that cannot run stops before any GPU step:
#  1. every library of the binaries resolves (the bundle's GStreamer, the host's libtorch);
#  2. the CPU tests of the CUDA test binary: every fixture and the element decoded on the CPU
#     against upstream's expected audio;
#  3. a short soak on the CPU (pipelines made and freed, a decoder reused with flushes);
#  4. the upstream decoder's and talker's Python packages from the bundle's wheels, and the
#     benchmark's model.
# Then whether libtorch sees a GPU: without one the check stops there, failing. Then the GPU
# steps, each run even when one before it failed (GPU time is scarce: one failure should not
# cost the others' figures), the failures listed at the end:
#  5. parity on CUDA (the ignored tests of the CUDA test binary, --ignored): float32 against the
#     upstream expectations, bf16 and f16 against bounds, CUDA graphs against eager steps,
#     streams batched into graphs of padded buckets against their eager solo decodes, and the
#     element replaying graphs;
#  6. a soak on CUDA (GPU memory must not grow as pipelines come and go);
#  7. the benchmark on CUDA (upstream PyTorch on the GPU against ours, f32 and bf16; our core
#     with and without CUDA graphs);
#  8. many streams on CUDA: ms per step for each bucket of rows (1 to 64) and step size, and
#     live streams up to 256, batched (graphs of up to 64 rows; their steps held for one another
#     as the element holds them) and, up to 8 streams, not batched or not held;
#  9. the talker loop on CUDA (tools/bench_talker_loop.py --device cuda): our loop beside
#     upstream's generate on random tiny and 0.6B-shaped talkers, f32 and bf16, first frame and
#     frames a second, the codes checked equal every round; and 1, 4 and 8 texts batched.
# The benchmark's results go to $OUT (else measurements/results/, as <cpu>/<benchmark>); the
# device, parity and soak logs to $LOGS (else measurements/cache/gpu/); PYTHON is the host's
# Python with torch (else python3).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bundle="$root/gpu-bundle"
if [ ! -x "$bundle/bin/cuda-tests" ]; then
  echo "gpu-check: no gpu-bundle/ here: run 'make gpu-bundle' on the build machine and bring it along" >&2
  exit 2
fi
python="${PYTHON:-python3}"
out="${OUT:-$root/measurements/results}"
logs="${LOGS:-$root/measurements/cache/gpu}"
work="${TMPDIR:-/tmp}/qwencodec-gpu"
mkdir -p "$work"
fail() { echo "gpu-check: $*" >&2; exit 1; }

torch_lib="$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')" ||
  fail "$python cannot import torch: set PYTHON to the Python that has PyTorch 2.11.0"
export LD_LIBRARY_PATH="$bundle/lib:$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GST_PLUGIN_SYSTEM_PATH="$bundle/plugins" GST_PLUGIN_PATH="" GST_REGISTRY="$work/registry.bin" \
  GST_REGISTRY_FORK=no
export QWENCODEC_FIXTURES="${QWENCODEC_FIXTURES:-$root/tests/fixtures}"
[ -f "$QWENCODEC_FIXTURES/release-tiny/expected.safetensors" ] ||
  fail "no fixtures in $QWENCODEC_FIXTURES: bring tests/fixtures/ along"

echo "== the bundle on the CPU: libraries"
if command -v ldd > /dev/null; then
  missing="$(for binary in "$bundle"/bin/* "$bundle"/plugins/*; do
    ldd "$binary" | awk -v binary="${binary##*/}" '/not found/ { print binary ": " $1 }'
  done)"
  [ -z "$missing" ] || fail "libraries not found (torch's from $torch_lib):"$'\n'"$missing"
  echo "every library of the binaries found"
else
  echo "no ldd here: the next steps show whether the libraries load"
fi

echo "== the bundle on the CPU: the fixtures decoded (the CPU tests of the CUDA test binary)"
"$bundle/bin/cuda-tests" --test-threads 1 --nocapture 2>&1 | tee "$work/cpu-tests.txt" ||
  fail "the CPU tests failed: the bundle does not run here (see above)"

echo "== the bundle on the CPU: a short soak"
"$bundle/bin/soak" --device cpu --streams 8 --warm-up 4 --report-every 4 \
  --model "$QWENCODEC_FIXTURES/release-tiny" 2>&1 | tee "$work/cpu-soak.txt" ||
  fail "the soak on the CPU failed (see above)"

echo "== the upstream decoder and talker (bundled wheels) and the benchmark's model"
# Upstream's decoder and talker want their own transformers, not the host's: install the carried
# wheels aside.
"$python" -m pip install -q --upgrade --no-index --no-deps --no-compile --target "$work/site" "$bundle"/wheels/*.whl
export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
model="$work/full-release"
[ -f "$model/model.safetensors" ] ||
  "$python" tools/make_fixtures.py --preset full-release --frames 100 --no-expected --out "$work" ||
  fail "the benchmark's model could not be made with the upstream decoder (see above)"

echo "== GPU"
if command -v nvidia-smi > /dev/null; then nvidia-smi -L || true; else echo "no nvidia-smi here"; fi
"$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' ||
  fail "libtorch sees no GPU: the bundle passed its CPU checks; the GPU steps need a CUDA device"
mkdir -p "$out" "$logs"
{ date; nvidia-smi -L 2>&1 || true; "$python" -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'; } \
  > "$logs/gpu-device.txt"

failed=()
echo "== parity on CUDA"
"$bundle/bin/cuda-tests" --ignored --test-threads 1 --nocapture 2>&1 | tee "$logs/gpu-parity.txt" ||
  failed+=("parity ($logs/gpu-parity.txt)")

echo "== soak on CUDA: a pipeline per stream, on one model and its CUDA graphs"
"$bundle/bin/soak" --device cuda --streams 400 --model "$QWENCODEC_FIXTURES/release-tiny" 2>&1 \
  | tee "$logs/gpu-soak.txt" || failed+=("soak ($logs/gpu-soak.txt)")

echo "== benchmark on CUDA"
if "$python" benches/tools/bench_upstream.py "$model" --device cuda --out "$work/upstream.json" \
  --reference "$work/reference.f32"; then
  for dtype in f32 bf16; do
    "$bundle/bin/bench" --model "$model" --upstream "$work/upstream.json" --reference "$work/reference.f32" \
      --out "$out" --device cuda --dtype "$dtype" --python "$python" || failed+=("benchmark in $dtype")
  done
else
  failed+=("upstream's benchmark")
fi

echo "== many streams on CUDA: steps per bucket of rows and step size, live streams"
"$bundle/bin/streams" --model "$model" --out "$out" --device cuda --max-batch 64 \
  --streams 1,2,4,8,16,32,64 --step-frames 1,4 --frames 24 --off-up-to 8 --unheld-up-to 8 \
  --live 1,32,128,256 --live-seconds 6 --live-spacing-ms 20 || failed+=("many streams")

echo "== the talker loop on CUDA: ours beside upstream's generate, first frame and frames a second"
# 60 frames a run at 0.6B too (the default 16 spares the CPU): steadier frames a second. The
# script exits 1, its report written, where our codes are not upstream's or the batched part fails.
"$python" tools/bench_talker_loop.py --device cuda --geometry tiny,0.6b --dtypes f32,bf16 \
  --texts 1,4,8 --rounds 3 --large-frames 60 --out "$out" 2>&1 | tee "$logs/gpu-talker-loop.txt" ||
  failed+=("talker loop ($logs/gpu-talker-loop.txt)")

if [ ${#failed[@]} -gt 0 ]; then
  printf 'gpu-check: failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "gpu-check: every GPU step passed; results in $out, logs in $logs"
