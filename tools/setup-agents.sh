#!/usr/bin/env bash
# The voice-agent frameworks (pipecat, LiveKit Agents) for python/qwencodec_agents, in a venv of
# their own layered on the torch venv: its site-packages are on the agents venv's path (a .pth
# file), so torch, transformers and qwen-tts come from there while the frameworks' own pins
# never touch the reference venv. Idempotent: skips what is installed at its pinned version.
# Also makes Debian's PyGObject (python3-gi, tools/setup.sh) importable from the torch venv,
# for appsrc ! qwencodecdec ! appsink in process (python/qwencodec_talker/speech.py).
set -euo pipefail

cache="${QWENCODEC_CACHE:-/var/cache/qwencodec}"
base="$cache/venv"
venv="$cache/venv-agents"
pipecat_version="1.14.0"
livekit_agents_version="1.8.9"

if [ ! -x "$base/bin/python" ]; then
  echo "setup-agents: no venv at $base; run tools/setup.sh first" >&2
  exit 1
fi

purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
base_site="$(purelib "$base/bin/python")"

# Debian's gi is built for Debian's python3; the venv's must be the same minor version to load it.
if ! "$base/bin/python" -c "import gi" 2>/dev/null; then
  gi_dir=/usr/lib/python3/dist-packages/gi
  debian="$(/usr/bin/python3 -c 'import sys; print(sys.version_info[:2])')"
  ours="$("$base/bin/python" -c 'import sys; print(sys.version_info[:2])')"
  if [ ! -d "$gi_dir" ] || [ "$debian" != "$ours" ]; then
    echo "setup-agents: Debian's PyGObject ($gi_dir, python $debian) cannot load in $base (python $ours)" >&2
    exit 1
  fi
  ln -sfn "$gi_dir" "$base_site/gi"
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "setup-agents: creating $venv on $base"
  "$base/bin/python" -m venv "$venv"
fi
echo "$base_site" > "$(purelib "$venv/bin/python")/qwencodec-base.pth"

installed() {
  "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null
}
wanted=()
installed pipecat-ai "$pipecat_version" || wanted+=("pipecat-ai==$pipecat_version")
installed livekit-agents "$livekit_agents_version" || wanted+=("livekit-agents==$livekit_agents_version")
if [ ${#wanted[@]} -gt 0 ]; then
  echo "setup-agents: installing ${wanted[*]} into $venv"
  "$venv/bin/python" -m pip install -q "${wanted[@]}"
fi
