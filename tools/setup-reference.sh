#!/usr/bin/env bash
# Installs the upstream reference decoder (qwen-tts and the transformers it was
# written against) into the venv that tools/setup.sh created, for
# tools/make_fixtures.py. Idempotent: skips what is already importable.
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
