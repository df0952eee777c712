#!/bin/bash
# The mutation check (not a test; docs/mutants.md): cargo-mutants breaks one line at a time in
# the files where a mistake would be silent and runs the tests that cover them; a mutant that
# no test notices is a line no test checks. MUTANTS_FILES narrows it (a list of paths);
# MUTANTS_OUT says where the reports go; MUTANTS_ARGS passes more options to cargo-mutants (e.g.
# --re 'fn_name' to run only the mutants whose names match).
set -euo pipefail
cd "$(dirname "$0")/.."
# --stale: the files whose code changed after their last run (docs/mutants.md, "Last runs").
[[ ${1:-} == --stale ]] && exec python3 tools/mutants_record.py --stale
# --changed: of each stale file (or each of MUTANTS_FILES), only the mutants in the functions
# changed since its last run (cargo-mutants' --in-diff of git's diff from that commit), which
# brings the file current; a file never run runs whole.
changed=false
if [[ ${1:-} == --changed ]]; then
  changed=true
  MUTANTS_FILES=${MUTANTS_FILES:-$(python3 tools/mutants_record.py --stale | cut -d' ' -f1)}
fi
out=${MUTANTS_OUT:-target/mutants}
command -v cargo-mutants >/dev/null || cargo install --locked cargo-mutants
# cargo-mutants builds a copy of the tree without the git-ignored cargo config that names
# libtorch (tools/setup.sh writes it): torch-sys gets it from the environment instead.
libtorch="$(sed -n 's/^LIBTORCH = "\(.*\)"$/\1/p' .cargo/config.toml 2>/dev/null)"
[ -n "$libtorch" ] && export LIBTORCH="$libtorch"

# Each file with the tests that cover it: the model's with the library's, batching, parity and
# error tests; the element's with the element's own.
model_tests=(--cargo-test-arg=--lib --cargo-test-arg=--test=batching --cargo-test-arg=--test=model_parity
  --cargo-test-arg=--test=model_errors)
# The two element tests that run the built plugin through gst-launch are left out: cargo test
# builds no cdylib, so they cannot find one in the mutants profile.
gst_launch_skips=(--cargo-test-arg=-- --cargo-test-arg=--skip=gst_launch_decodes_a_file_to_wav
  --cargo-test-arg=--skip=pipeline_scripts_run)
element_tests=(--cargo-test-arg=--test=element --cargo-test-arg=--test=seeking
  --cargo-test-arg=--test=timestamps --cargo-test-arg=--test=max_errors)
# The element's subclass and its model's load: the element's tests with the lifecycle's
# (progress messages, the model kept through state changes, properties read at NULL→READY),
# the live latency's and the GAP events' (the subclass hands both on).
lifecycle_tests=("${element_tests[@]}" --cargo-test-arg=--test=lifecycle --cargo-test-arg=--test=latency
  --cargo-test-arg=--test=gaps "${gst_launch_skips[@]}")
element_tests+=("${gst_launch_skips[@]}")
# Files whose code takes another path with our CPU kernels off (the path CUDA takes): their
# mutants run a second time under QWENCODEC_CPU_KERNELS=off (reports in <name>-off), but those
# of the functions named here, which call no kernel (the engine's queue and bookkeeping) and
# take the same path whatever the kernels.
kernels_off_too=(src/model/kernels/shim.rs src/model/engine/mod.rs)
declare -A same_path_off=(
  [src/model/engine/mod.rs]='take_batch|Engine::(new|enqueue|run|rows|lock|steps_waiting|state_rows|row_bytes|new_row|release_row|graph_report|observe|set_rejoin_grace|replay_graphs_eagerly|warm_step_time)\b'
)
# The element's latency figures with their unit tests and the live-latency tests.
latency_tests=(--cargo-test-arg=--lib --cargo-test-arg=--test=latency)
# Codes over RTP: the payloader and depayloader with the library's and the RTP tests.
rtp_tests=(--cargo-test-arg=--lib --cargo-test-arg=--test=rtp_codes)
# When a new segment ends the stream: its unit tests and the seeking tests.
segment_tests=(--cargo-test-arg=--lib --cargo-test-arg=--test=seeking)
# The server's own logic (access, admission, liveness, the caps): its unit tests. Its pipelines,
# signalling and ingress are the browser tests' (network namespaces and a browser, minutes a
# run: not run per mutant). What it takes from anyone (messages, join tokens): its crate's tests.
server_tests=(-p qwencodec-server --cargo-test-arg=--lib)
protocol_tests=(-p qwencodec-protocol --cargo-test-arg=--lib)
# Codes over RTP without GStreamer (the payload, a receiver's bookkeeping): its crate's tests.
rtp_codes_tests=(-p qwencodec-rtp-codes --cargo-test-arg=--lib)
declare -A tests_of=(
  [src/model/engine/arena.rs]=model [src/model/engine/mod.rs]=model [src/model/stream_decoder.rs]=model
  [src/model/kernels/shim.rs]=model [src/model/engine/batch_graphs.rs]=model
  [src/qwencodecdec/step_thread.rs]=element [src/qwencodecdec/flow.rs]=element
  [src/qwencodecdec/imp.rs]=lifecycle [src/qwencodecdec/load.rs]=lifecycle
  [src/qwencodecdec/latency.rs]=latency
  [src/qwencodecdec/segment.rs]=segment
  [src/rtpqwencodespay/imp.rs]=rtp [src/rtpqwencodesdepay/imp.rs]=rtp
  [crates/rtp-codes/src/payload.rs]=rtp_codes [crates/rtp-codes/src/receiver.rs]=rtp_codes
  [crates/protocol/src/token.rs]=protocol [crates/protocol/src/messages.rs]=protocol
  [server/src/access.rs]=server [server/src/admission.rs]=server
  [server/src/liveness.rs]=server [server/src/connections.rs]=server
  [server/src/ice.rs]=server [server/src/rtp_ingress.rs]=server [server/src/opus.rs]=server
  [server/src/janus.rs]=server [server/src/metrics.rs]=server [server/src/random.rs]=server
)
read -ra extra <<< "${MUTANTS_ARGS:-}"
# A report's mutants of one outcome (none where the run had no mutants to test).
count() { cat "$out/$report/mutants.out/$1.txt" 2>/dev/null | wc -l; }
for file in ${MUTANTS_FILES:-${!tests_of[@]}}; do
  case ${tests_of[$file]:-} in
    model) tests=("${model_tests[@]}") ;;
    element) tests=("${element_tests[@]}") ;;
    lifecycle) tests=("${lifecycle_tests[@]}") ;;
    latency) tests=("${latency_tests[@]}") ;;
    rtp) tests=("${rtp_tests[@]}") ;;
    segment) tests=("${segment_tests[@]}") ;;
    server) tests=("${server_tests[@]}") ;;
    protocol) tests=("${protocol_tests[@]}") ;;
    rtp_codes) tests=("${rtp_codes_tests[@]}") ;;
    *) echo "mutants: no tests listed for $file" >&2; exit 2 ;;
  esac
  name=$(basename "$(dirname "$file")")-$(basename "$file" .rs)
  [[ $file == server/* ]] && name=server-$(basename "$file" .rs)
  [[ $file == crates/protocol/* ]] && name=protocol-$(basename "$file" .rs)
  [[ $file == crates/rtp-codes/* ]] && name=rtp-codes-$(basename "$file" .rs)
  # cargo-mutants makes its output folder but not the folder above it.
  runs=("$name:")
  [[ " ${kernels_off_too[*]} " == *" $file "* ]] && runs+=("$name-off:off")
  for run in "${runs[@]}"; do
    report=${run%%:*}
    mkdir -p "$out/$report"
    since=()
    if $changed && last=$(python3 tools/mutants_record.py --last "$file") && [[ $last != never ]]; then
      git diff "$last" -- "$file" > "$out/$report/changed.diff"
      since=(--in-diff "$out/$report/changed.diff")
    fi
    # The mutants profile (Cargo.toml): release speed, incremental rebuilds.
    kernels=${run#*:}
    skip=()
    [[ -n $kernels && -n ${same_path_off[$file]:-} ]] && skip=(--exclude-re "${same_path_off[$file]}")
    env ${kernels:+QWENCODEC_CPU_KERNELS=$kernels} G_DEBUG=fatal_warnings GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-1000} \
      cargo mutants --profile mutants --no-shuffle -f "$file" --output "$out/$report" "${skip[@]}" "${since[@]}" "${extra[@]}" \
      "${tests[@]}" || true
    echo "mutants: $file (kernels ${kernels:-as the environment says}): $(count caught) caught," \
      "$(count missed) missed, $(count timeout) timed out, $(count unviable) unviable"
  done
done
