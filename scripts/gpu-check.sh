#!/usr/bin/env bash
# The GPU checks in one command, on a GPU host with PyTorch 2.11.0 (Python 3.12) but neither
# Rust nor GStreamer, from the repository root with gpu-bundle/ (make gpu-bundle) beside it:
#  1. parity on CUDA: float32 against the upstream expectations, bf16 and f16 against bounds,
#     CUDA graphs against eager steps, and the element replaying a graph;
#  2. a short soak on CUDA (GPU memory must not grow as graphs are captured and freed);
#  3. the benchmark on CUDA (upstream PyTorch on the GPU against ours, f32 and bf16; our core
#     with and without a CUDA graph).
# Results go to $OUT (else bench/results/).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bundle="$root/gpu-bundle"
if [ ! -x "$bundle/bin/cuda-tests" ]; then
  echo "gpu-check: no gpu-bundle/ here: run 'make gpu-bundle' on the build machine and bring it along" >&2
  exit 2
fi
python="${PYTHON:-python3}"
out="${OUT:-$root/bench/results}"
work="${TMPDIR:-/tmp}/qwencodec-gpu"
mkdir -p "$out" "$work"
day="$(date +%Y-%m-%d)"

torch_lib="$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
export LD_LIBRARY_PATH="$bundle/lib:$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GST_PLUGIN_SYSTEM_PATH="$bundle/plugins" GST_PLUGIN_PATH="" GST_REGISTRY="$work/registry.bin" \
  GST_REGISTRY_FORK=no
export QWENCODEC_FIXTURES="$root/tests/fixtures"
{ date; nvidia-smi -L 2>&1 || true; "$python" -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))' 2>&1 || true; } \
  | tee "$out/$day-gpu-device.txt"

echo "== parity on CUDA"
"$bundle/bin/cuda-tests" --test-threads 1 --nocapture 2>&1 | tee "$out/$day-gpu-parity.txt"
grep -q "skipped" "$out/$day-gpu-parity.txt" && { echo "gpu-check: libtorch sees no GPU" >&2; exit 1; }

echo "== soak on CUDA: a pipeline per stream, each capturing and freeing its CUDA graph"
"$bundle/bin/soak" --device cuda --streams 400 --model "$QWENCODEC_FIXTURES/release-tiny" 2>&1 \
  | tee "$out/$day-gpu-soak.txt"

echo "== benchmark on CUDA"
# The upstream decoder wants its own transformers, not the host's: install the carried wheels aside.
"$python" -m pip install -q --upgrade --no-index --no-deps --no-compile --target "$work/site" "$bundle"/wheels/*.whl
export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
model="$work/full-release"
[ -f "$model/model.safetensors" ] ||
  "$python" tools/make_fixtures.py --preset full-release --frames 100 --no-expected --out "$work"
"$python" tools/bench_upstream.py "$model" --device cuda --out "$work/upstream.json" --reference "$work/reference.f32"
for dtype in f32 bf16; do
  "$bundle/bin/bench" --model "$model" --upstream "$work/upstream.json" --reference "$work/reference.f32" \
    --out "$out" --device cuda --dtype "$dtype"
done
