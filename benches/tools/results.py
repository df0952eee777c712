"""Where a benchmark's result goes: measurements/results/<cpu>/<benchmark>.{md,json}.

One file per benchmark and CPU, no date in the name (the date is inside): a re-run
replaces the file, and git keeps the ones before. <cpu> is the machine's CPU as
crates/testing/src/bench.rs's `slug` names it, mirrored here by `cpu_slug` for the Python
tools; <benchmark> is one of KINDS. Standard library only: `make test` runs
bench_summary.py --check with the system's python3.
"""

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "measurements" / "results"

# Each kind of result's name, and what writes it.
KINDS = {
    "decode": "decode-<device>-<dtype>",  # make bench (benches/decode)
    "streams": "streams-<device>-<dtype>",  # make bench (benches/streams.rs)
    "effect": "effect-<device>-<dtype>",  # make bench (benches/effect.rs)
    "kernels-ab": "kernels-ab-cpu-<dtype>-c<frames>[-s<streams>]",  # make kernels-ab (benches/kernels_ab.rs)
    "profile": "profile-<device>-<dtype>-c<frames>[-s<streams>]",  # make profile (benches/profile.rs)
    "rtp-codes": "rtp-codes",  # benches/rtp_codes.rs
    "talker-speed": "talker-speed",  # benches/tools/bench_talker.py
    "neighbours": "neighbours",  # benches/tools/bench_neighbours.py
    "threads-ab": "threads-ab",  # make threads-ab (benches/tools/threads_ab.py)
    "talker-loop": "talker-loop[-<device>]",  # tools/bench_talker_loop.py (a GPU's named, the CPU's not)
    "text-to-audio": "text-to-audio",  # tools/bench_text_to_audio.py
    "server-capacity": "server-capacity-<dtype>",  # tools/webrtc_load.py --find-capacity --out
    "janus-broadcast": "janus-broadcast-<dtype>",  # tools/janus-load.sh --janus-listeners --out
}
FIELDS = {"device": r"cpu|cuda\d*", "dtype": "f32|f16|bf16", "frames": r"\d+", "streams": r"\d+"}
PATTERNS = {
    kind: re.compile(re.sub(r"<(\w+)>", lambda field: f"(?P<{field[1]}>{FIELDS[field[1]]})",
                            template.replace("[", "(?:").replace("]", ")?")))
    for kind, template in KINDS.items()
}
SCHEME = ("measurements/results/<cpu>/<benchmark>.md and .json, <cpu> a CPU's name in lower-case words "
          "and dashes, <benchmark> one of " + ", ".join(KINDS.values()))
CPU = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


def kind_of(benchmark: str):
    """The kind a benchmark's name is and the fields it names, or None."""
    for kind, pattern in PATTERNS.items():
        match = pattern.fullmatch(benchmark)
        if match:
            return kind, match.groupdict()
    return None


LIMITING_ENV = ("QWENCODEC_CPU_KERNELS", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def cpu_slug(model: str, avx512, limits) -> str:
    """crates/testing/src/bench.rs's `slug` of a machine: its CPU model's words, then `avx512`,
    or `as-<capability>` where ATEN_CPU_CAPABILITY held it, and `no-kernels` or
    `avx2-kernels` where QWENCODEC_CPU_KERNELS did."""
    model = model.split(" @ ")[0].lower().replace("(r)", " ").replace("(tm)", " ")
    words = [word for word in re.split(r"[^a-z0-9]", model) if word and word not in ("cpu", "processor")]
    limited = dict(limit.split("=", 1) for limit in limits)
    if "ATEN_CPU_CAPABILITY" in limited:
        words.append("as-" + limited["ATEN_CPU_CAPABILITY"].lower())
    elif avx512:
        words.append("avx512")
    words += {"off": ["no-kernels"], "avx2": ["avx2-kernels"]}.get(limited.get("QWENCODEC_CPU_KERNELS"), [])
    return "-".join(words)


def this_machine() -> dict:
    """This machine as crates/testing/src/bench.rs's `machine` records the fields `cpu_slug` reads."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    field = lambda name: next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                               if line.split(":", 1)[0].strip() == name), "")
    return {
        "cpu": field("model name") or "unknown CPU",
        "avx512": "avx512f" in field("flags").split(),
        "limits": [f"{name}={os.environ[name]}" for name in LIMITING_ENV if name in os.environ],
    }


def result_path(results: Path, machine: dict, benchmark: str) -> Path:
    """results/<cpu>/<benchmark> (add .md or .json), its folder made."""
    assert kind_of(benchmark), f"{benchmark}: not a benchmark of the scheme ({SCHEME})"
    folder = Path(results) / cpu_slug(machine["cpu"], machine["avx512"], machine["limits"])
    folder.mkdir(parents=True, exist_ok=True)
    return folder / benchmark


def commit() -> str:
    """The short hash of the checkout's HEAD, which a report names as the code it measured."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"
