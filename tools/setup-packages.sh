#!/usr/bin/env bash
# python/'s packages (qwencodec-talker with its server and serve extras, pipecat-qwencodec and
# livekit-plugins-qwencodec with their openai extras) pip-installed into a fresh venv made as
# docs/talker.md tells users: Debian's python3 with --system-site-packages, for GStreamer's
# Python bindings (python3-gi).
# The plugin reaches it through GST_PLUGIN_PATH, which the check scripts set.
# One venv per content of python/ and of this script, in $QWENCODEC_CACHE/python-packages/<key>:
# a re-run with nothing changed only hashes. Torch is not downloaded again (4.6 GB): the torch
# venv's torch and the distributions it requires (tools/setup.sh) are linked into a folder that a
# .pth file puts on the new venv's path, so pip counts torch==2.11.0 as installed; everything
# else comes from pip resolving the packages' declared requirements.
# Prints the venv's folder on standard output; progress goes to standard error.
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${QWENCODEC_CACHE:-/var/cache/qwencodec}"
base="$cache/venv"
python=/usr/bin/python3
root="$cache/python-packages"

if [ ! -x "$base/bin/python" ]; then
  echo "setup-packages: no torch venv at $base; run tools/setup.sh first" >&2
  exit 1
fi
# Debian's gi is built for Debian's python3, and the torch venv's compiled modules for its own
# Python: both must be the same minor version.
minor() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }
if [ "$(minor "$python")" != "$(minor "$base/bin/python")" ]; then
  echo "setup-packages: $python is Python $(minor "$python"), the torch venv $(minor "$base/bin/python")" >&2
  exit 1
fi
if ! "$python" -c "import gi, ensurepip" 2>/dev/null; then
  echo "setup-packages: $python lacks python3-gi or python3-venv (apt-get install python3-gi python3-venv)" >&2
  exit 1
fi

key="$( {
  cat tools/setup-packages.sh
  find python -type f ! -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum
  "$python" --version
  echo "$base"
} | sha256sum | cut -c1-16)"
venv="$root/$key"
mkdir -p "$root"
# Checkouts sharing the cache may set up at once: one at a time, the others then reuse its venv.
exec 9>"$root/.lock"
flock 9
if [ ! -f "$venv/.complete" ]; then
  rm -rf "$venv"
  echo "setup-packages: installing python/'s packages into $venv" >&2
  "$python" -m venv --system-site-packages "$venv"
  "$base/bin/python" - "$venv/torch" <<'PY'
import importlib.metadata as metadata
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# torch and what it requires on this platform (with the extras it asks for, such as
# cuda-toolkit[cublas,...]), as installed in the torch venv, linked by top-level name.
out = Path(sys.argv[1])
out.mkdir()
seen, todo = set(), [("torch", frozenset())]
while todo:
    name, extras = todo.pop()
    if (canonicalize_name(name), extras) in seen:
        continue
    seen.add((canonicalize_name(name), extras))
    dist = metadata.distribution(name)
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras | {""}):
            todo.append((req.name, frozenset(req.extras)))
    for top in {f.parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
        if not (out / top).exists():
            (out / top).symlink_to(dist.locate_file(top))
PY
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$venv/torch" > "$site/qwencodec-torch.pth"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    "./python[server,serve]" "./python/pipecat-qwencodec[openai]" \
    "./python/livekit-plugins-qwencodec[openai]" >&2
  touch "$venv/.complete"
  # Keep the three newest: another checkout may still be testing an older content.
  ls -1dt "$root"/*/ | tail -n +4 | xargs -r rm -rf
fi
echo "$venv"
