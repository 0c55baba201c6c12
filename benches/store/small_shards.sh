#!/usr/bin/env bash
# `store add` of a dataset of many small shards, then `verify STORE/NAME`, for one or more
# hspack binaries run interleaved (A, B, A, B...), ROUNDS rounds (default 5); prints every run,
# the min and median of each, and the load average before and after.
#
#   benches/store/small_shards.sh DATASET BIN [BIN...]
#
# DATASET: a plain dataset (e.g. 3000 samples converted with `--shard-samples 1`). Each run
# adds it into a fresh store under a scratch folder (SCRATCH, default a temp folder).
set -euo pipefail
ds=$1; shift
rounds=${ROUNDS:-5}
work=${SCRATCH:-$(mktemp -d)}
declare -A add_s verify_s
uptime
for r in $(seq 1 "$rounds"); do
  for bin in "$@"; do
    rm -rf "$work/st"
    "$bin" store init "$work/st" >/dev/null
    s=$(date +%s.%N); "$bin" store add "$work/st" "$ds" --name d >/dev/null; e=$(date +%s.%N)
    packs=$(ls "$work/st/packs" | wc -l)
    s2=$(date +%s.%N); "$bin" verify "$work/st/d" >/dev/null; e2=$(date +%s.%N)
    a=$(echo "$e - $s" | bc); v=$(echo "$e2 - $s2" | bc)
    add_s[$bin]+="$a "; verify_s[$bin]+="$v "
    echo "round $r  $bin  add $a s  ($packs packs)  verify $v s"
  done
done
uptime
stats() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {printf "min %.3f s, median %.3f s", v[1], v[int((NR+1)/2)]}'; }
for bin in "$@"; do
  echo "$bin: add $(echo "${add_s[$bin]}" | stats); verify $(echo "${verify_s[$bin]}" | stats)"
done
rm -rf "$work/st"
