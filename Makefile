# Everything a fresh Debian machine needs: `make demo` and `make test` set up what they use.
QWENCODEC_CACHE ?= /var/cache/qwencodec
VENV := $(QWENCODEC_CACHE)/venv
export QWENCODEC_CACHE
# tch builds against the libtorch of the venv's torch wheel, which set-up names in the
# git-ignored .cargo/config.toml (so plain cargo finds it too); the venv's python runs the tools.
export PATH := $(VENV)/bin:$(PATH)
# Our C++ kernels build with -Wall -Wextra; under make a warning is an error (build.rs).
export QWENCODEC_WERROR := 1

PLUGIN := target/release/libgstqwencodec.so

.PHONY: setup setup-reference setup-load setup-packages build install uninstall demo test lint soak kernels-ab fixtures \
	released-fixture bench threads-ab profile gpu-bundle serve load mutants

# make install puts the plugin where GStreamer looks for it: its own plugin folder, or the same
# layout under PREFIX (e.g. PREFIX=/usr/local), below DESTDIR when staging a package. PLUGINDIR
# overrides both. Deferred (?=), so that pkg-config is asked only after setup has installed it.
PREFIX ?= $(shell pkg-config --variable=prefix gstreamer-1.0)
PLUGINDIR ?= $(shell pkg-config --define-variable=prefix=$(PREFIX) --variable=pluginsdir gstreamer-1.0)

setup:
	@bash tools/setup.sh

# The upstream Python decoder, for the fixtures (the released-geometry one included) and the
# benchmark; and upstream's talker, for the scripts that import python/qwencodec_talker.
setup-reference: setup
	@bash tools/setup-reference.sh

# python/'s packages (the talker, the pipecat and LiveKit integrations) pip-installed into a fresh
# venv, one per content of python/, as docs/talker.md tells users; check-talker and check-agents
# test them there.
setup-packages: setup
	@bash tools/setup-packages.sh >/dev/null

build: setup
	cargo build --release --workspace

# The plugin keeps finding libtorch in the venv through its rpath: the venv must stay.
install: build
	@test -n "$(PLUGINDIR)" || { echo "install: no plugin folder (is pkg-config installed?)" >&2; exit 1; }
	install -D -m 0755 $(PLUGIN) "$(DESTDIR)$(PLUGINDIR)/libgstqwencodec.so"

uninstall:
	@test -n "$(PLUGINDIR)" || { echo "uninstall: no plugin folder (is pkg-config installed?)" >&2; exit 1; }
	rm -f "$(DESTDIR)$(PLUGINDIR)/libgstqwencodec.so"

# The main job: a gst-launch pipeline decoding codes to a WAV (bundled test checkpoint unless
# MODEL=<checkpoint> and CODES=<codes.raw> are given).
demo: build setup-reference setup-packages
	@bash tools/demo.sh

# The TTS media server (server/, the binary qwencodec-server) with the bundled test checkpoint; it
# prints the page's URL and the codes ingress's token. SERVE_ARGS: more options, e.g. --bind
# 0.0.0.0:8080 --join-secret-file FILE (or --insecure-open for a demo others reach).
serve: setup
	cargo build --release --workspace
	target/release/qwencodec-server $(SERVE_ARGS)

lint: setup
	cargo fmt --all -- --check
	cargo clippy --release --workspace --all-targets -- -D warnings

# CI (.ci/run) runs this. GLib warnings and criticals abort the tests (G_DEBUG). The tests run
# several decoding processes at once: short OpenMP spinning keeps them from starving each
# other (see "Threads" in docs/element.md). measurements/README.md must be what the result
# files give, and every result file must be named as benches/tools/results.py says. A fuzz
# target takes one core: the talker's check runs beside the fuzz targets and the agents' check.
# The library's and parity tests run again with our CPU kernels held to AVX2 (the path of CPUs
# without AVX-512, at the released widths too) and then off (libtorch's ops everywhere, the
# path CUDA takes, batched and at the released widths too); then kernels held back by name;
# last, one line says which instruction sets' kernel tests ran on this CPU and which it lacks.
# Each rerun takes only the tests whose paths it changes (the whole suite twice more would be
# nearly half of make test's time): RERUN_SKIPS leaves out the tests of one instruction set
# named in the test (alike whatever the environment holds back) and the element's at the
# released widths (it computes nothing of its own: the library's paths, as the core's test
# there). Every cargo test names --workspace, so that its features are the build's and
# nothing is built again.
RERUN_SKIPS := --skip matches_a_float64_convolution_in_ --skip element_matches_upstream_at_released_widths
test: build lint released-fixture setup-load setup-packages
	python3 benches/tools/bench_summary.py --check
	python3 tools/check-links.py
	python3 tools/mutants_record.py --check
	bash tools/check-inspect.sh
	bash tools/check-install.sh
	bash benches/tools/check-profile.sh
	bash tools/check-plain-cargo.sh
	bash tools/check-load.sh
	bash tools/together.sh "bash tools/fuzz-short.sh && bash tools/check-agents.sh" "bash tools/check-talker.sh"
	G_DEBUG=fatal_warnings GOMP_SPINCOUNT=$${GOMP_SPINCOUNT:-1000} cargo test --release --workspace
	QWENCODEC_CPU_KERNELS=avx2 G_DEBUG=fatal_warnings GOMP_SPINCOUNT=$${GOMP_SPINCOUNT:-1000} \
	  cargo test --release --workspace --lib --test model_parity --test released_geometry -- $(RERUN_SKIPS)
	QWENCODEC_CPU_KERNELS=off G_DEBUG=fatal_warnings GOMP_SPINCOUNT=$${GOMP_SPINCOUNT:-1000} \
	  cargo test --release --workspace --lib --test model_parity --test batching --test released_geometry -- $(RERUN_SKIPS)
	QWENCODEC_CPU_KERNELS=on,-attention,-snake_beta,-pointwise G_DEBUG=fatal_warnings \
	  bash tools/test-named.sh model_parity the_cpu_kernels_run_as_the_cpu_and_environment_allow
	@cargo test --release --workspace --lib the_build_announced_the_instruction_sets_of_this_cpu -- --nocapture 2>/dev/null \
	  | grep '^kernel tests:' || { echo "make test: no kernel tests line" >&2; exit 1; }

# Thousands of streams opened, fed and closed in one process; memory must stay flat
# (make test runs a short one). SOAK_ARGS: see examples/soak.rs, e.g. --device cuda.
SOAK_STREAMS ?= 10000
soak: build
	cargo run --release --example soak -- --streams $(SOAK_STREAMS) $(SOAK_ARGS)

# Do the tests notice a broken line? cargo-mutants on the files where a mistake would be
# silent (not a test: hours on two cores; docs/mutants.md). MUTANTS_FILES="src/model/engine/arena.rs"
# narrows it.
mutants: build released-fixture
	bash tools/mutants.sh

# The WebRTC load generator's packages (aiortc, websockets) in the venv, for tools/webrtc_load.py.
setup-load: setup
	@bash tools/setup-load.sh

# A load test of the server (qwencodec-server) with real WebRTC peers (not a test; docs/load-test.md).
# LOAD_ARGS: options of tools/webrtc_load.py, e.g. --find-capacity --model
# $(QWENCODEC_CACHE)/fixtures/full-release-80 --dtype f16 --seconds 10 --json capacity.json
# (--out measurements/results: the result to keep, <cpu>/server-capacity-<dtype>.{md,json}).
LOAD_ARGS ?= --sessions 4
load: setup-load
	cargo build --release --workspace
	$(VENV)/bin/python tools/webrtc_load.py $(LOAD_ARGS)

fixtures: setup-reference
	$(VENV)/bin/python tools/make_fixtures.py --out tests/fixtures

# The released geometry at full widths with random weights and upstream's float64 decode, for
# tests/released_geometry.rs: too large to commit, made once per machine in
# $(QWENCODEC_CACHE)/fixtures/.
released-fixture: setup-reference
	@bash tools/released-fixture.sh

# The benchmark (not a test): upstream Python decoder and ours on the released geometry with
# random weights, side by side, each decode timed BENCH_REPEATS times after a warm-up; writes
# measurements/results/<cpu>/decode-<device>-<dtype>.{md,json}, <cpu> this machine's CPU.
# The element as users run it too: a gst-launch-1.0 process per run, in f32, f16 and bf16, at
# chunk-frames 1 and 4 (--launch-dtypes, --launch-chunks).
# BENCH_ARGS: more options of benches/decode/main.rs (--chunks, --dtype, --steady-frames). Then many
# streams on one model, batched and not (benches/streams.rs, STREAMS_ARGS: --streams, --live, ...;
# streams-<device>-<dtype>), and the time a seek or a stop takes during playback (benches/effect.rs,
# EFFECT_ARGS: --runs, ...; effect-<device>-<dtype>). A run replaces the result of the same name
# (git keeps the one before); measurements/README.md, the table of every result, follows.
BENCH_MODEL := measurements/cache/full-release
BENCH_FRAMES ?= 100
BENCH_REPEATS ?= 5
bench: build setup-reference $(BENCH_MODEL)/model.safetensors
	$(VENV)/bin/python benches/tools/bench_upstream.py $(BENCH_MODEL) --out measurements/cache/upstream.json \
	  --reference measurements/cache/reference.f32 --repeats $(BENCH_REPEATS)
	cargo bench --bench decode -- --model $(BENCH_MODEL) --upstream measurements/cache/upstream.json \
	  --reference measurements/cache/reference.f32 --out measurements/results --repeats $(BENCH_REPEATS) $(BENCH_ARGS)
	cargo bench --bench streams -- --model $(BENCH_MODEL) --out measurements/results $(STREAMS_ARGS)
	cargo bench --bench effect -- --model $(BENCH_MODEL) --out measurements/results $(EFFECT_ARGS)
	$(VENV)/bin/python benches/tools/bench_neighbours.py $(BENCH_MODEL) --out measurements/results
	python3 benches/tools/bench_summary.py

# The benchmark's checkpoint: the released geometry with random weights and BENCH_FRAMES frames of
# codes.
$(BENCH_MODEL)/model.safetensors:
	$(MAKE) setup-reference
	$(VENV)/bin/python tools/make_fixtures.py --preset full-release --frames $(BENCH_FRAMES) \
	  --no-expected --out measurements/cache

# Each CPU kernel of ours with and without it, alternated in processes of their own, on the
# benchmark's checkpoint (not a test); writes measurements/results/<cpu>/kernels-ab-cpu-<dtype>-
# c<frames>[-s<streams>].{md,json} and measurements/README.md. KERNELS_AB_ARGS: options of
# benches/kernels_ab.rs (--dtype, --kernels, --streams, --rounds, --chunk-frames).
# QWENCODEC_CPU_KERNELS=avx2 (with libtorch's libraries held alike, see docs/performance.md)
# measures the AVX2 kernels, under a <cpu> of their own.
kernels-ab: build $(BENCH_MODEL)/model.safetensors
	cargo bench --bench kernels_ab -- --model $(BENCH_MODEL) --out measurements/results $(KERNELS_AB_ARGS)
	python3 benches/tools/bench_summary.py

# The element's thread policy against threads pinned at every core, on a quiet machine: make
# bench's one-frame and batched figures, the two alternated (not a test); writes
# measurements/results/<cpu>/threads-ab.{md,json}. THREADS_AB_ARGS: --rounds.
threads-ab: build $(BENCH_MODEL)/model.safetensors measurements/cache/upstream.json
	$(VENV)/bin/python benches/tools/threads_ab.py $(BENCH_MODEL) --upstream measurements/cache/upstream.json \
	  --reference measurements/cache/reference.f32 --out measurements/results $(THREADS_AB_ARGS)
	python3 benches/tools/bench_summary.py

# Upstream's errors and windowed decode, which benches/decode reads (make bench measures it anew).
measurements/cache/upstream.json: | $(BENCH_MODEL)/model.safetensors
	$(MAKE) setup-reference
	$(VENV)/bin/python benches/tools/bench_upstream.py $(BENCH_MODEL) --out $@ \
	  --reference measurements/cache/reference.f32 --repeats $(BENCH_REPEATS)

# Where one stream's steps spend their time on this machine (not a test): per stage, per op,
# ops per step and time outside them (libtorch's op profiler), per thread and library (perf),
# on the benchmark's checkpoint; writes measurements/results/<cpu>/profile-<device>-<dtype>-
# c<frames>[-s<streams>].{md,json} and measurements/README.md. PROFILE_ARGS: options of
# benches/profile.rs (--chunk-frames 1, --dtype, --steps, --device, --streams).
profile: build $(BENCH_MODEL)/model.safetensors
	bash benches/tools/profile.sh $(BENCH_MODEL) $(PROFILE_ARGS)
	python3 benches/tools/bench_summary.py

# What tools/gpu-check.sh needs on a GPU host without Rust or GStreamer (see that script).
gpu-bundle: build setup-reference
	bash tools/gpu-bundle.sh
