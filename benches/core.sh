#!/usr/bin/env bash
# Benchmark (not a test): rdeploy's per-sub-change overhead.
#
# 1. Side by side in one run: N sub-changes through `rdeploy up` (journal fsynced twice per
#    sub-change start, group commit for its end) against the naive resumable shell loop
#      grep -q done:$i state || { ./apply-$i; echo done:$i >> state; }
#    where every ./apply-$i runs `sh -c true`. Reported as a ratio (goal <= 1.0).
# 2. rdeploy's own cost beyond spawning the child, per sub-change, for 10..10,000 records:
#    (time of `rdeploy up` with N sub-changes `true`) minus (time of N `sh -c true` spawns), / N.
#    Goal: under 0.2 ms and flat.
#
# Usage: benches/core.sh [N]   (default 1000). Builds the release binary first.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin rdeploy
BIN=$PWD/target/release/rdeploy
N=${1:-1000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

now() { date +%s%N; }
ms() { echo "scale=1; ($2 - $1) / 1000000" | bc; }

# --- 1. side by side ---------------------------------------------------------------
mkdir -p "$work/loop" "$work/rd"
for i in $(seq 1 "$N"); do
  printf '#!/bin/sh\nsh -c true\n' > "$work/loop/apply-$i"
  chmod +x "$work/loop/apply-$i"
  cp "$work/loop/apply-$i" "$work/rd/apply-$i"
done
{
  echo "name: bench"; echo "steps:"; echo "  - name: many"; echo "    tool: shell"; echo "    sub_changes:"
  for i in $(seq 1 "$N"); do echo "      - { name: s$i, run: ./apply-$i }"; done
} > "$work/rd/stack.yaml"

t0=$(now)
( cd "$work/loop" && : > state && for i in $(seq 1 "$N"); do grep -q "done:$i\$" state || { ./apply-$i; echo "done:$i" >> state; }; done )
t1=$(now)
( cd "$work/rd" && "$BIN" -q --no-progress up stack.yaml > /dev/null )
t2=$(now)
loop_ms=$(ms "$t0" "$t1"); rd_ms=$(ms "$t1" "$t2")
echo "side by side, $N sub-changes running sh -c true:"
echo "  shell loop (no fsync):      ${loop_ms} ms"
echo "  rdeploy up (fsynced journal): ${rd_ms} ms"
echo "  ratio rdeploy / loop:       $(echo "scale=3; $rd_ms / $loop_ms" | bc)"

# --- 2. own cost per sub-change ---------------------------------------------------
echo
echo "rdeploy's own cost per sub-change (beyond spawning sh -c true):"
for n in 10 100 1000 10000; do
  d="$work/own-$n"; mkdir -p "$d"
  { echo "name: own"; echo "steps:"; echo "  - name: many"; echo "    tool: shell"; echo "    sub_changes:"
    for i in $(seq 1 "$n"); do echo "      - { name: s$i, run: 'true' }"; done; } > "$d/stack.yaml"
  t0=$(now); for i in $(seq 1 "$n"); do sh -c true; done; t1=$(now)
  ( cd "$d" && "$BIN" -q --no-progress up stack.yaml > /dev/null ); t2=$(now)
  spawn_ns=$((t1 - t0)); rd_ns=$((t2 - t1))
  echo "  n=$n: spawn only $(ms 0 $spawn_ns) ms, rdeploy $(ms 0 $rd_ns) ms, own cost $(echo "scale=3; ($rd_ns - $spawn_ns) / $n / 1000000" | bc) ms/sub-change"
done
