#!/usr/bin/env bash
# Broadcasts through Janus under load (tools/webrtc_load.py --janus-listeners, docs/load-test.md,
# "Broadcasts through Janus"), in a network namespace of its own: Janus gathers no ICE candidates
# on loopback, so the namespace has a veth pair with a documentation address (198.51.100.1/24) for
# Janus's and the listeners' ICE; the server and Janus's API stay on 127.0.0.1. Nothing leaves the
# machine: the namespace has no route out. Needs root (unshare, ip).
#
#     bash tools/janus-load.sh --janus-listeners 1,10,50 --seconds 10 [other webrtc_load.py options]
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${QWENCODEC_CACHE:-/var/cache/qwencodec}"
python="$cache/venv/bin/python"

if [ "${QWENCODEC_JANUS_LOAD_NETNS:-}" != 1 ]; then
  exec env QWENCODEC_JANUS_LOAD_NETNS=1 unshare --net bash "$0" "$@"
fi

ip link set lo up
ip link add qwload0 type veth peer name qwload1
ip link set qwload0 addrgenmode none
ip link set qwload1 addrgenmode none
ip addr add 198.51.100.1/24 dev qwload0
ip link set qwload1 up
ip link set qwload0 up
exec "$python" tools/webrtc_load.py --janus-ice-interface qwload0 "$@"
