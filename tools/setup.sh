#!/usr/bin/env bash
# One-time machine set-up, idempotent: Debian's GStreamer packages and a venv
# with torch (whose libtorch the plugin links) in a cache folder that every
# checkout on this machine shares.
set -euo pipefail

cache="${QWENCODEC_CACHE:-/var/cache/qwencodec}"

# A Rust toolchain at least as new as Cargo.toml's rust-version; Debian 12's own rustc (1.63)
# is far older. Said plainly here rather than as a build failure later.
rust_needed="$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' "$(dirname "$0")/../Cargo.toml")"
rust_have="$(rustc --version 2>/dev/null | sed -n 's/^rustc \([0-9.]*\).*/\1/p')"
if [ -z "$rust_have" ] || [ "$(printf '%s\n%s\n' "$rust_needed" "$rust_have" | sort -V | head -1)" != "$rust_needed" ]; then
  echo "setup: qwencodec needs Rust $rust_needed or newer; this machine has ${rust_have:-no rustc}." >&2
  echo "setup: install it with rustup (https://rustup.rs):" >&2
  echo "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --default-toolchain $rust_needed" >&2
  echo "  . \"\$HOME/.cargo/env\"" >&2
  exit 1
fi
venv="$cache/venv"
torch_version="2.11.0"

apt_packages=(
  pkg-config
  libgstreamer1.0-dev
  libgstreamer-plugins-base1.0-dev
  gstreamer1.0-tools
  gstreamer1.0-plugins-base
  gstreamer1.0-plugins-good
  # RTP and WebRTC: Opus is in -base, RTP and UDP in -good, webrtcbin in -bad, ICE (libnice)
  # in -nice. examples/webrtc.rs drives webrtcbin through its signals, so it needs no -dev
  # package (libgstreamer-plugins-bad1.0-dev would pull in OpenCV).
  gstreamer1.0-plugins-bad
  gstreamer1.0-nice
  # examples/appsrc.py runs on Debian's python3 with PyGObject.
  python3-gi
  gir1.2-gstreamer-1.0
  gir1.2-gst-plugins-base-1.0
  # gst-play-1.0, which the .npy tests run as users would.
  gstreamer1.0-plugins-base-apps
  # the server's browser test: a real headless Chromium driven over WebDriver, in a
  # network namespace of its own (unshare, ip); examples/send_codes.py's WebSocket client.
  chromium
  chromium-driver
  iproute2
  util-linux
  # The two-host browser tests: a TURN server and a TLS proxy on the server's host; a firewall,
  # loss (nftables) and delay (an NFQUEUE, through iptables) on the listener's.
  coturn
  nginx-light
  nftables
  iptables
  python3-websocket
  # Broadcasts through an SFU (--janus): Janus (its Streaming plugin), and janus.js for the
  # listener page.
  janus
  libjs-janus-gateway
)

missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  apt_get() { if [ "$(id -u)" = 0 ]; then apt-get "$@"; else sudo apt-get "$@"; fi; }
  apt_get update -q
  DEBIAN_FRONTEND=noninteractive apt_get install -y -q --no-install-recommends "${missing[@]}"
fi

if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  echo "setup: installing torch==$torch_version into $venv (about 4.6 GB, once per machine)"
  mkdir -p "$cache"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "torch==$torch_version"
fi

# The CUDA graph shim (build.rs) compiles against the CUDA runtime headers; the torch wheel's
# nvidia-cuda-runtime has them but for crt/, which comes in a package of its own.
site_packages="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ -d "$site_packages/nvidia/cu13/include" ] && [ ! -f "$site_packages/nvidia/cu13/include/crt/host_config.h" ]; then
  echo "setup: installing the CUDA runtime's crt headers into $venv"
  "$venv/bin/python" -m pip install -q --no-deps "nvidia-cuda-crt~=13.0.0"
fi

# Plain cargo (cargo build, cargo test, cargo run --example ...) in any shell finds libtorch as
# make does: torch-sys reads LIBTORCH from this checkout's git-ignored cargo config.
config="$(cd "$(dirname "$0")/.." && pwd)/.cargo/config.toml"
libtorch="$site_packages/torch"
wanted="# Written by tools/setup.sh: the libtorch of $venv, for torch-sys.
[env]
LIBTORCH = \"$libtorch\""
if [ "$(cat "$config" 2>/dev/null)" != "$wanted" ]; then
  mkdir -p "$(dirname "$config")"
  printf '%s\n' "$wanted" > "$config"
  echo "setup: wrote $config"
fi
