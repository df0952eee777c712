#!/usr/bin/env bash
# make install and make uninstall, staged in a DESTDIR: the installed plugin must load from
# GStreamer's plugin folder with nothing else set (no GST_PLUGIN_PATH, no LD_LIBRARY_PATH:
# libtorch through the rpath alone), and be gone after make uninstall.
set -euo pipefail
cd "$(dirname "$0")/.."

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
stage="$scratch/stage"

fail() {
  echo "check-install: $*" >&2
  exit 1
}

make_target() {
  make --no-print-directory "$@" DESTDIR="$stage" >"$scratch/make.log" 2>&1 ||
    { cat "$scratch/make.log" >&2; fail "make $* failed"; }
}

# gst-inspect-1.0 in an empty environment but for the staged plugin folder and a fresh registry.
inspect() {
  local plugin_dir="$1" feature="$2"
  rm -f "$scratch/registry.bin"
  env -i PATH=/usr/bin:/bin HOME="$scratch" G_DEBUG=fatal_warnings \
    GST_PLUGIN_SYSTEM_PATH_1_0="$plugin_dir" GST_REGISTRY_1_0="$scratch/registry.bin" \
    gst-inspect-1.0 "$feature" >"$scratch/out" 2>"$scratch/err"
}

plugin_dir="$stage$(pkg-config --variable=pluginsdir gstreamer-1.0)"
plugin="$plugin_dir/libgstqwencodec.so"
make_target install
[ -f "$plugin" ] || { find "$stage" -type f >&2; fail "make install did not write $plugin"; }

runpath="$(readelf -d "$plugin" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]$/\1/p')"
ls "$runpath"/libtorch_cpu.so >/dev/null 2>&1 ||
  fail "the installed plugin's RUNPATH '$runpath' does not lead to libtorch_cpu.so"

inspect "$plugin_dir" qwencodecdec || { cat "$scratch/err" >&2; fail "gst-inspect-1.0 qwencodecdec failed"; }
[ -s "$scratch/err" ] && { cat "$scratch/err" >&2; fail "gst-inspect-1.0 qwencodecdec wrote to stderr"; }
grep -q "Filename *$plugin$" "$scratch/out" || { grep Filename "$scratch/out" >&2; fail "not the installed plugin"; }

# PREFIX moves the plugin folder with GStreamer's layout under it.
prefixed="$stage$(pkg-config --define-variable=prefix=/opt/qwencodec --variable=pluginsdir gstreamer-1.0)"
case "$prefixed" in "$stage/opt/qwencodec/"*) ;; *) fail "PREFIX=/opt/qwencodec gives $prefixed" ;; esac
make_target install PREFIX=/opt/qwencodec
[ -f "$prefixed/libgstqwencodec.so" ] || fail "make install PREFIX=/opt/qwencodec did not write $prefixed"
make_target uninstall PREFIX=/opt/qwencodec
[ -e "$prefixed/libgstqwencodec.so" ] && fail "make uninstall PREFIX=/opt/qwencodec left the plugin"

make_target uninstall
[ -e "$plugin" ] && fail "make uninstall left $plugin"
inspect "$plugin_dir" qwencodecdec && fail "gst-inspect-1.0 still finds qwencodecdec after make uninstall"
echo "check-install: make install stages the plugin in GStreamer's plugin folder, it loads from" \
  "there alone (libtorch through its rpath), make uninstall removes it"
