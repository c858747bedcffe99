#!/usr/bin/env bash
# read_weights.sh: print parameters of a blkps model with dd and od, no
# library: one line "INDEX VALUE" per parameter.
#
#   read_weights.sh FILE [FIRST [COUNT]]    (default: FIRST 0, COUNT 10)
#
# FILE is the model as a file: a learner slot's or the control LUN's disk
# from a kernel initiator (scripts/blkps login), a file on the blkps FUSE
# mount, or a regular file. Parameter i is the little-endian float32 at byte
# 4*i, so parameters [FIRST, FIRST+COUNT) are bytes [4*FIRST, 4*(FIRST+COUNT)):
#   dd if=FILE bs=4 skip=FIRST count=COUNT | od -A n -t f4 -w4
# On the control LUN the weights start at byte W (`blkps control-layout --get
# weights_offset`): parameter i is at W + 4*i (FIRST + W/4).
#
# A block device is read with iflag=direct: the page cache would return
# weights it read earlier, not the server's current ones. Direct I/O moves
# whole 512-byte blocks, so dd reads the blocks that cover the range and od
# cuts the parameters out (-j skips into the first block, -N stops after them).
set -euo pipefail
file=${1:?usage: read_weights.sh FILE [FIRST [COUNT]]}
first=${2:-0} count=${3:-10}
for n in "$first" "$count"; do
  case "$n" in ''|*[!0-9]*) echo "read_weights.sh: FIRST and COUNT must be integers, got '$n'" >&2; exit 1 ;; esac
done
[ -e "$file" ] || { echo "read_weights.sh: no such file: $file" >&2; exit 1; }
start=$((4 * first)) end=$((4 * (first + count)))
if [ -b "$file" ]; then
  block_first=$((start / 512)) block_end=$(((end + 511) / 512))
  dd if="$file" bs=512 skip="$block_first" count=$((block_end - block_first)) iflag=direct status=none |
    od -A n -t f4 -w4 -v -j $((start % 512)) -N $((end - start))
else
  dd if="$file" bs=4 skip="$first" count="$count" status=none | od -A n -t f4 -w4 -v
fi | awk -v i="$first" '{ print i++, $1 }'
