#!/usr/bin/env bash
# Wraps raw codec frames (Q little-endian int16 codes each) in a .npy header, as np.save would
# write an int16 array of shape [T, Q].
#   examples/pipelines/raw-to-npy.sh CODES.raw CODEBOOKS OUT.npy
set -euo pipefail
raw="$1" codebooks="$2" out="$3"
frames=$(( $(stat -c %s "$raw") / (2 * codebooks) ))
dict="{'descr': '<i2', 'fortran_order': False, 'shape': ($frames, $codebooks), }"
# Magic, version 1.0, a 16-bit header length; the header padded with spaces and a newline so
# that the data starts at a multiple of 64 bytes.
pad=$(( (64 - (10 + ${#dict} + 1) % 64) % 64 ))
length=$(( ${#dict} + pad + 1 ))
{
  printf '\x93NUMPY\x01\x00'
  printf "\\x$(printf %02x $((length & 255)))\\x$(printf %02x $((length >> 8)))"
  printf '%s%*s\n' "$dict" "$pad" ''
  head -c $((frames * 2 * codebooks)) "$raw"
} > "$out"
