# Everything a fresh Debian machine needs: `make demo` and `make test` set up what they use.
QWENCODEC_CACHE ?= /var/cache/qwencodec
VENV := $(QWENCODEC_CACHE)/venv
export QWENCODEC_CACHE
# tch builds against the libtorch of the venv's torch wheel.
export LIBTORCH_USE_PYTORCH := 1
export PATH := $(VENV)/bin:$(PATH)

PLUGIN := target/release/libgstqwencodec.so

.PHONY: setup setup-reference build demo test lint fixtures bench gpu-bundle

setup:
	@bash tools/setup.sh

# The upstream Python decoder, only for regenerating fixtures and benchmarking.
setup-reference: setup
	@bash tools/setup-reference.sh

build: setup
	cargo build --release

# The main job: a gst-launch pipeline decoding codes to a WAV (bundled test checkpoint unless
# MODEL=<checkpoint> and CODES=<codes.raw> are given).
demo: build
	@bash tools/demo.sh

lint: setup
	cargo fmt --all -- --check
	cargo clippy --release --all-targets -- -D warnings

test: build lint
	cargo test --release

fixtures: setup-reference
	$(VENV)/bin/python tools/make_fixtures.py --out tests/fixtures

# The benchmark (not a test): upstream Python decoder and ours on the released geometry with
# random weights, side by side; writes bench/results/<date>-<device>-<dtype>.{md,json}.
BENCH_MODEL := bench/cache/full-release
BENCH_FRAMES ?= 100
bench: build setup-reference
	@test -f $(BENCH_MODEL)/model.safetensors || \
	  $(VENV)/bin/python tools/make_fixtures.py --preset full-release --frames $(BENCH_FRAMES) \
	    --no-expected --out bench/cache
	$(VENV)/bin/python tools/bench_upstream.py $(BENCH_MODEL) --out bench/cache/upstream.json \
	  --reference bench/cache/reference.f32
	cargo bench --bench decode -- --model $(BENCH_MODEL) --upstream bench/cache/upstream.json \
	  --reference bench/cache/reference.f32 --out bench/results $(BENCH_ARGS)

# What scripts/gpu-check.sh needs on a GPU host without Rust or GStreamer (see that script).
gpu-bundle: build setup-reference
	bash tools/gpu-bundle.sh
