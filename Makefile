# Everything a fresh Debian machine needs: `make demo` and `make test` set up what they use.
QWENCODEC_CACHE ?= /var/cache/qwencodec
VENV := $(QWENCODEC_CACHE)/venv
export QWENCODEC_CACHE
# tch builds against the libtorch of the venv's torch wheel.
export LIBTORCH_USE_PYTORCH := 1
export PATH := $(VENV)/bin:$(PATH)

PLUGIN := target/release/libgstqwencodec.so

.PHONY: setup setup-reference build demo test lint fixtures

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
