#!/usr/bin/env bash
# Benchmark (not a test): a no-op `rdeploy up` of the demo stack against `rdeploy plan` of the
# same stack, after one deploy. Both read each tool's preview; `up` first checks the tools (one
# `ansible-playbook -vv --syntax-check`), then converges (a terraform `output -json`, ansible's
# run, which finds nothing to change, one helm `get metadata`, kubectl's outputs) and journals.
# Runs go in pairs, plan and up back to back, the order swapped every pair, so load drifts hit
# both alike; each pair gives one ratio. Prints each pair, then min/median/max of the ratios,
# the medians of the times and the load average before and after.
#
#   benches/converge.sh [RUNS]     (default 7 pairs)
#
# Quiet machine (nothing else running), session 36, ratio up/plan min/median/max:
#   main 105b56c (every early preview awaited before the run):  1.22 / 1.24 / 1.31 (6 pairs);
#   up starting while its previews go on, each step awaiting its own: 1.11 / 1.145 / 1.19
#   (8 pairs; medians plan 1139 ms, no-op up 1308 ms). Goal (at most 1.2x) met in every pair.
#
# The release build of this checkout (`cargo build --release`) unless RDEPLOY_BIN names another
# rdeploy binary (main's, to compare); kubesim comes from beside it, else from this checkout.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
runs="${1:-7}"
cd "$repo"
command -v terraform >/dev/null || { echo "error: terraform is not on PATH" >&2; exit 1; }
command -v kubectl >/dev/null || { echo "error: kubectl is not on PATH" >&2; exit 1; }
./scripts/setup-ansible.sh >/dev/null 2>&1
./scripts/fetch-helm.sh >/dev/null
target="${CARGO_TARGET_DIR:-$repo/target}/release"
if [ -z "${RDEPLOY_BIN:-}" ]; then
  cargo build --quiet --release -p rdeploy -p kubesim
  RDEPLOY_BIN="$target/rdeploy"
fi
bin_dir="$(cd "$(dirname "$RDEPLOY_BIN")" && pwd)"
kubesim_bin="$bin_dir/kubesim"
if [ ! -x "$kubesim_bin" ]; then
  cargo build --quiet --release -p kubesim
  kubesim_bin="$target/kubesim"
fi
rdeploy() { "$RDEPLOY_BIN" "$@"; }
export PATH="$repo/.venv/bin:$repo/tools/helm4:$PATH"

work="$(mktemp -d -t rdeploy-converge-bench.XXXXXX)"
cp -R fixtures/demo/. "$work/"
cd "$work"
export KUBECONFIG="$work/kubeconfig" KUBECACHEDIR="$work/.kube-cache"
export HELM_CACHE_HOME="$work/.helm/cache" HELM_CONFIG_HOME="$work/.helm/config" HELM_DATA_HOME="$work/.helm/data"
"$kubesim_bin" --listen 127.0.0.1:0 --clusters demo --kubeconfig "$KUBECONFIG" > kubesim.ready 2> kubesim.log &
kubesim_pid=$!
trap 'kill "$kubesim_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 200); do [ -s kubesim.ready ] && break; sleep 0.05; done
[ -s kubesim.ready ] || { echo "error: kubesim did not start" >&2; exit 1; }

rdeploy up stack.yaml --no-progress -q >/dev/null 2>&1 || { echo "error: the first deploy failed" >&2; exit 1; }

echo "rdeploy: $RDEPLOY_BIN ($(rdeploy --version 2>/dev/null | head -1))"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
ms() { echo $(( $(date +%s%N) / 1000000 )); }
time_plan() {
  local t0; t0=$(ms)
  rdeploy plan stack.yaml --detailed-exitcode -q >/dev/null 2>&1 || { echo "error: plan found changes" >&2; exit 1; }
  echo $(( $(ms) - t0 ))
}
time_up() {
  local t0; t0=$(ms)
  rdeploy up stack.yaml --no-progress -q >up.out 2>&1 || { cat up.out >&2; exit 1; }
  local took=$(( $(ms) - t0 ))
  grep -q "in place, nothing to do" up.out || { echo "error: up applied something" >&2; cat up.out >&2; exit 1; }
  echo "$took"
}
plans=(); ups=(); ratios=()
for i in $(seq "$runs"); do
  if (( i % 2 )); then p=$(time_plan); u=$(time_up); else u=$(time_up); p=$(time_plan); fi
  r=$(awk -v u="$u" -v p="$p" 'BEGIN {printf "%.2f", u/p}')
  plans+=("$p"); ups+=("$u"); ratios+=("$r")
  echo "pair $i: plan $p ms, no-op up $u ms, ratio ${r}x"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
sorted=$(printf '%s\n' "${ratios[@]}" | sort -g)
echo "ratio up/plan: min $(echo "$sorted" | head -1)x, median $(median "${ratios[@]}")x, max $(echo "$sorted" | tail -1)x over $runs pairs"
echo "median: plan $(median "${plans[@]}") ms, no-op up $(median "${ups[@]}") ms"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
