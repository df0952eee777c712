#!/usr/bin/env bash
# make profile end to end on the bundled release-tiny checkpoint, its report in a scratch
# folder, named as in measurements/results (<cpu>/profile-cpu-f32-c1): the op profile must hold
# every stage of the network and the ops of every step, and perf's part its samples where perf
# may sample here. Then of two streams' batched steps: one step scope per batch, batches of more
# than one row.
set -euo pipefail
cd "$(dirname "$0")/../.."

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
steps=12

# make profile of `steps` steps into folder $1, with the benchmark's options that follow.
profile() {
  local into=$1
  shift
  PROFILE_RESULTS="$into" bash benches/tools/profile.sh tests/fixtures/release-tiny --steps "$steps" "$@" \
    >"$scratch/log" 2>&1 || { cat "$scratch/log" >&2; echo "check-profile: make profile $* failed" >&2; exit 1; }
}

profile "$scratch"

python3 - "$scratch" "$steps" <<'PY'
import json, sys
from pathlib import Path

scratch, steps = Path(sys.argv[1]), int(sys.argv[2])
reports = list(scratch.glob("*/profile-cpu-f32-c1.json"))
assert len(reports) == 1, f"one report, not {list(scratch.rglob('*.json'))}"
report = json.loads(reports[0].read_text())
# Its folder is the CPU's name as the Python tools give it too (benches/tools/results.py).
sys.path.insert(0, "benches/tools")
from results import cpu_slug
machine = report["run"]["machine"]
assert reports[0].parent.name == cpu_slug(machine["cpu"], machine["avx512"], machine["limits"]), reports[0]
ops = report["op_profile"]
assert ops["steps"] == steps, f"{ops['steps']} steps profiled, not {steps}"
expected = ["quantizer + pre_conv", "pre_transformer", "upsample.0", "upsample.1", "decoder.0",
            "decoder.1", "decoder.2", "decoder.3", "decoder.4", "decoder.5"]
assert list(ops["stages_ms"]) == expected, f"stages {list(ops['stages_ms'])}"
assert all(ms > 0 for ms in ops["stages_ms"].values()), ops["stages_ms"]
assert sum(ops["stages_ms"].values()) <= ops["step_ms"], "stages within their step"
assert ops["top_level_ops_per_step"] > 100, ops["top_level_ops_per_step"]
assert "aten::cat" in ops["top_level_ops"], list(ops["top_level_ops"])
assert reports[0].with_suffix(".md").read_text().count("| decoder.") == 6
perf = report["perf"]
print("check-profile: ok;", "perf samples:", perf["samples"] if perf else "none (perf may not sample here)")
PY

batched="$scratch/batched"
profile "$batched" --streams 2

python3 - "$batched" "$steps" <<'PY'
import json, sys
from pathlib import Path

batched, steps = Path(sys.argv[1]), int(sys.argv[2])
reports = list(batched.glob("*/profile-cpu-f32-c1-s2.json"))
assert len(reports) == 1, f"one report of two streams, not {list(batched.rglob('*.json'))}"
report = json.loads(reports[0].read_text())
run, ops = report["run"], report["op_profile"]
assert run["streams"] == 2, run
# Each stream pushed `steps` steps: as many batches if every one held both, twice as many if none.
assert steps <= ops["steps"] < 2 * steps, f"{ops['steps']} step scopes for two streams' {steps} steps each"
rows = 2 * steps / ops["steps"]
assert f"batched by the engine ({rows:.2f} rows per batch" in reports[0].with_suffix(".md").read_text()
print(f"check-profile: two streams ok; {rows:.2f} rows a batch")
PY
