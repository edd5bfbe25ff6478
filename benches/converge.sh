#!/usr/bin/env bash
# Benchmark (not a test): a no-op `rdeploy up` of the demo stack against `rdeploy plan` of the
# same stack, after one deploy. Both read each tool's preview; `up` then converges (a terraform
# `output -json`, ansible's run, which finds nothing to change, one helm `get metadata`, kubectl's
# outputs) and journals. Runs alternate (plan, up, plan, up, ...) so load drifts hit both alike.
# Prints each run's time, the medians and their ratio.
#
#   benches/converge.sh [RUNS]     (default 5)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
runs="${1:-5}"
cd "$repo"
command -v terraform >/dev/null || { echo "error: terraform is not on PATH" >&2; exit 1; }
command -v kubectl >/dev/null || { echo "error: kubectl is not on PATH" >&2; exit 1; }
./scripts/setup-ansible.sh >/dev/null 2>&1
./scripts/fetch-helm.sh >/dev/null
cargo build --quiet -p rdeploy -p kubesim
target="${CARGO_TARGET_DIR:-$repo/target}/debug"
export PATH="$target:$repo/.venv/bin:$repo/tools/helm4:$PATH"

work="$(mktemp -d -t rdeploy-converge-bench.XXXXXX)"
cp -R fixtures/demo/. "$work/"
cd "$work"
export KUBECONFIG="$work/kubeconfig" KUBECACHEDIR="$work/.kube-cache"
export HELM_CACHE_HOME="$work/.helm/cache" HELM_CONFIG_HOME="$work/.helm/config" HELM_DATA_HOME="$work/.helm/data"
kubesim --listen 127.0.0.1:0 --clusters demo --kubeconfig "$KUBECONFIG" > kubesim.ready 2> kubesim.log &
kubesim_pid=$!
trap 'kill "$kubesim_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 200); do [ -s kubesim.ready ] && break; sleep 0.05; done
[ -s kubesim.ready ] || { echo "error: kubesim did not start" >&2; exit 1; }

rdeploy up stack.yaml --no-progress -q >/dev/null 2>&1 || { echo "error: the first deploy failed" >&2; exit 1; }

ms() { echo $(( $(date +%s%N) / 1000000 )); }
plans=(); ups=()
for i in $(seq "$runs"); do
  t0=$(ms); rdeploy plan stack.yaml --detailed-exitcode -q >/dev/null 2>&1 || { echo "error: plan found changes" >&2; exit 1; }
  t1=$(ms); rdeploy up stack.yaml --no-progress -q >up.out 2>&1 || { cat up.out >&2; exit 1; }
  t2=$(ms)
  grep -q "in place, nothing to do" up.out || { echo "error: up applied something" >&2; cat up.out >&2; exit 1; }
  plans+=($((t1 - t0))); ups+=($((t2 - t1)))
  echo "run $i: plan $((t1 - t0)) ms, no-op up $((t2 - t1)) ms"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
mp=$(median "${plans[@]}"); mu=$(median "${ups[@]}")
echo "median: plan ${mp} ms, no-op up ${mu} ms, ratio $(awk -v u="$mu" -v p="$mp" 'BEGIN {printf "%.2f", u/p}')x"
