#!/usr/bin/env bash
# Installs the upstream reference decoder (qwen-tts and the transformers it was
# written against) into the venv that tools/setup.sh created, for
# tools/make_fixtures.py, tools/make_talker_fixture.py and the benchmark scripts.
# Idempotent: skips what is already importable. (The talker's package declares
# its own requirements: tools/setup-packages.sh installs it elsewhere.)
# qwen-tts is installed without its dependencies: only its speech-tokenizer
# modules are used, and its full dependency list (gradio, librosa, ...) is not.
set -euo pipefail

cache="${QWENCODEC_CACHE:-/var/cache/qwencodec}"
python="$cache/venv/bin/python"
transformers_version="4.57.3"
qwen_tts_version="0.1.1"

if [ ! -x "$python" ]; then
  echo "setup-reference: no venv at $cache/venv; run tools/setup.sh first" >&2
  exit 1
fi

# transformers brings numpy, safetensors and huggingface-hub, which the
# fixture script and the upstream modeling module also import.
if ! "$python" -c "import transformers, sys; sys.exit(transformers.__version__ != '$transformers_version')" 2>/dev/null; then
  echo "setup-reference: installing transformers==$transformers_version"
  "$python" -m pip install -q "transformers==$transformers_version"
fi

# Checked by distribution metadata, not by import: importing qwen_tts runs its
# __init__, which needs the whole TTS stack that --no-deps leaves out.
if ! "$python" -c "import importlib.metadata as m, sys; sys.exit(m.version('qwen-tts') != '$qwen_tts_version')" 2>/dev/null; then
  echo "setup-reference: installing qwen-tts==$qwen_tts_version (no dependencies)"
  "$python" -m pip install -q --no-deps "qwen-tts==$qwen_tts_version"
fi

# Debian's PyGObject (python3-gi, tools/setup.sh) importable in this venv too, for the scripts
# run with it that drive GStreamer (benches/tools/bench_talker.py's decoder step). Debian's gi
# is built for Debian's python3: this venv's must be the same minor version to load it.
purelib="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if ! "$python" -c "import gi" 2>/dev/null; then
  gi_dir=/usr/lib/python3/dist-packages/gi
  debian="$(/usr/bin/python3 -c 'import sys; print(sys.version_info[:2])')"
  ours="$("$python" -c 'import sys; print(sys.version_info[:2])')"
  if [ ! -d "$gi_dir" ] || [ "$debian" != "$ours" ]; then
    echo "setup-reference: Debian's PyGObject ($gi_dir, python $debian) cannot load in $cache/venv (python $ours)" >&2
    exit 1
  fi
  ln -sfn "$gi_dir" "$purelib/gi"
fi
