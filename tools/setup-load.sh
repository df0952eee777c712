#!/usr/bin/env bash
# Installs what tools/webrtc_load.py needs (aiortc, a WebRTC peer in Python, websockets, and numpy
# for the audio's level) into the venv that tools/setup.sh created. Idempotent: skips what is
# already installed at its pinned version. aiortc brings its own dependencies as wheels (PyAV with
# libopus, aioice, pylibsrtp, cryptography): no Debian package is needed.
set -euo pipefail

cache="${QWENCODEC_CACHE:-/var/cache/qwencodec}"
python="$cache/venv/bin/python"
aiortc_version="1.16.0"
websockets_version="17.4"
numpy_version="2.4.6"

if [ ! -x "$python" ]; then
  echo "setup-load: no venv at $cache/venv; run tools/setup.sh first" >&2
  exit 1
fi

# Checked by distribution metadata: a version pin, whatever the import does.
installed() {
  "$python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null
}

if ! installed aiortc "$aiortc_version"; then
  echo "setup-load: installing aiortc==$aiortc_version"
  "$python" -m pip install -q "aiortc==$aiortc_version"
fi

if ! installed websockets "$websockets_version"; then
  echo "setup-load: installing websockets==$websockets_version"
  "$python" -m pip install -q "websockets==$websockets_version"
fi

# numpy may be there already, at the version another tool's packages chose (transformers, for
# tools/setup-reference.sh): any version does here, so it is installed only where it is missing.
if ! "$python" -c "import numpy" 2>/dev/null; then
  echo "setup-load: installing numpy==$numpy_version"
  "$python" -m pip install -q "numpy==$numpy_version"
fi
