#!/usr/bin/env bash
# Benchmark (not a test): `rdeploy inventory` over a kubesim fleet against the kubectl loop an
# SRE would otherwise write,
#   for ctx in $(kubectl config get-contexts -o name); do kubectl --context $ctx get pods -A -o json; done
# side by side in one run, then how the inventory grows from 400 to 4,000 clusters.
#
# Every cluster is seeded with a Deployment (1 pod), a DaemonSet (3 pods) and a CronJob, so the
# inventory reads real objects (6 lists + discovery per cluster) while kubectl reads pods only.
# Goal: >= 20x faster than the loop, 400 clusters in under 2 s.
#
# Measured on the 2-core development machine (kubesim shares the cores), release build:
#   400 clusters: kubectl loop 40.3 s, rdeploy inventory 0.45-0.57 s (best of 3): 70x
#   growth: 400 -> 0.73 s, 1,000 -> 1.56 s, 2,000 -> 3.0 s, 4,000 -> 4.6-5.4 s, every cluster
#   answered (linear, about 1.2-1.8 ms per cluster; peak RSS 81 MB at 400, 236 MB at 4,000).
# Session 35 (issue 29), 4,000 clusters, old (main 9f7e6e9) and new binaries alternated in the
# same minutes on a loaded machine (load average 10-14: four other builds), `inventory --json`,
# /usr/bin/time: wall 12.2/14.3/15.4 s old against 11.1/12.0/13.1 s new (min/median/max of 4);
# rdeploy's CPU (user+sys) 3.84-4.74 s old, 3.24-3.70 s new (-20%); peak RSS 232-237 MiB old,
# 177-181 MiB new (-23%: clusters become tasks only when their turn comes). Still short of the
# goal (4,000 under 1.5 s and 150 MiB, 400 under 0.3 s).
# Session 36 (issue 29): clusters behind one plain-HTTP address (every kubesim cluster) are
# asked 32 at a time over kept-alive connections (rdeploy's own small pool: old rdeploy opened
# 2,801 connections for 400 clusters' 2,800 requests, new 224), kubesim writes lists without
# copying its objects, caches `/apis` and listens with a 4096 accept queue (Go's; 128 dropped
# SYNs of a burst, a second's retry), the kubeconfig is read straight into its types. Old (main
# 105b56c) and new alternated in the same minutes, `inventory --json`, /usr/bin/time for
# rdeploy, /proc/PID/stat for kubesim, min/median/max of 7 each, loaded machine:
#   4,000 (load 11-12): wall 2.88/4.01/5.99 s old, 1.35/1.86/2.35 s new; rdeploy CPU
#   1.42/1.51/1.83 s old, 0.68/0.75/0.84 s new; kubesim CPU 1.48/1.52/1.61 s old,
#   0.54/0.56/0.62 s new; peak RSS 177/188/214 MiB old, 94.0/94.7/95.4 MiB new.
#   400 (load 8): wall 0.42/0.48/0.68 s old, 0.12/0.15/0.18 s new; rdeploy CPU 0.19/0.22/0.27 s
#   old, 0.06/0.07/0.08 s new; kubesim CPU 0.18/0.20/0.24 s old, 0.05/0.06/0.07 s new; peak RSS
#   64/70/78 MiB old, 30/31/31 MiB new.
# Both processes together now need 1.3 s of CPU at 4,000 (3.0 s before).
# Quiet machine, the same session (nothing else running, load average 1-4 from the bench itself),
# `LOOP=0 RUNS=5 benches/fleet.sh 400 "400 4000"`, min/median/max of 5:
#   main 105b56c: 400 -> .272/.276/.298 s, 74 MiB; 4,000 -> 1.549/1.656/2.017 s, 179-196 MiB
#     (rdeploy 1.44-1.53 s CPU, kubesim 1.32-1.45 s);
#   the session's main (s36 merged): 400 -> .068/.079/.083 s, 32 MiB; 4,000 -> .671/.692/.744 s,
#     94.6 MiB (rdeploy .71 s CPU, kubesim .49 s). Goal met: 4,000 under 1.5 s and 150 MiB, 400
#     under 0.3 s.
# Clusters are asked 512 at a time (32 per plain-HTTP address); a cluster's timeout starts when
# its turn comes, and it is only made a task then.
#
# Usage: benches/fleet.sh [N] [SIZES]   (default 400 and "400 1000 2000 4000"); LOOP=0 skips the
# kubectl loop; RDEPLOY=path KUBESIM=path use those binaries instead of building; RUNS=n times
# each inventory is timed (default 5; min/median/max reported).
# Builds the release binaries first (honours CARGO_TARGET_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-400}
SIZES=${2:-"400 1000 2000 4000"}
if [ -z "${RDEPLOY:-}" ] || [ -z "${KUBESIM:-}" ]; then
  cargo build --release --quiet -p rdeploy -p kubesim
  TARGET=${CARGO_TARGET_DIR:-$PWD/target}
  RDEPLOY=$TARGET/release/rdeploy
  KUBESIM=$TARGET/release/kubesim
fi
KUBECTL=${KUBECTL:-kubectl}
work=$(mktemp -d)
sim_pid=
cleanup() { [ -n "$sim_pid" ] && kill "$sim_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
export HOME=$work/home
mkdir -p "$HOME"

now() { date +%s%N; }
secs() { echo "scale=3; ($2 - $1) / 1000000000" | bc; }

# start_fleet N: a kubesim with N clusters, seeded through its API (curl, 4 at a time).
start_fleet() {
  [ -n "$sim_pid" ] && kill "$sim_pid" 2>/dev/null && wait "$sim_pid" 2>/dev/null || true
  rm -f "$work/ready"
  "$KUBESIM" --listen 127.0.0.1:0 --clusters "$1" --kubeconfig "$work/kubeconfig" --pod-startup-ms 10 > "$work/ready" 2>/dev/null &
  sim_pid=$!
  while ! grep -q ready "$work/ready" 2>/dev/null; do sleep 0.05; done
  addr=$(awk '{print $3}' "$work/ready")
  local dep ds cj
  dep='{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"api","labels":{"app":"api"}},"spec":{"selector":{"matchLabels":{"app":"api"}},"template":{"metadata":{"labels":{"app":"api"}},"spec":{"containers":[{"name":"api","image":"registry.example/shop-api:3.1"}]}}}}'
  ds='{"apiVersion":"apps/v1","kind":"DaemonSet","metadata":{"name":"node-agent","labels":{"app":"node-agent"}},"spec":{"selector":{"matchLabels":{"app":"node-agent"}},"template":{"metadata":{"labels":{"app":"node-agent"}},"spec":{"containers":[{"name":"agent","image":"registry.example/node-agent:2.0"}]}}}}'
  cj='{"apiVersion":"batch/v1","kind":"CronJob","metadata":{"name":"report"},"spec":{"schedule":"0 3 * * *","jobTemplate":{"spec":{"template":{"spec":{"restartPolicy":"Never","containers":[{"name":"r","image":"registry.example/report:1.5"}]}}}}}}'
  "$KUBECTL" --kubeconfig "$work/kubeconfig" config get-contexts -o name > "$work/contexts"
  export addr dep ds cj
  xargs -P 4 -I{} sh -c '
    b=http://$addr/clusters/{}
    curl -sf -o /dev/null -H "Content-Type: application/json" -d "$dep" $b/apis/apps/v1/namespaces/default/deployments
    curl -sf -o /dev/null -H "Content-Type: application/json" -d "$ds" $b/apis/apps/v1/namespaces/default/daemonsets
    curl -sf -o /dev/null -H "Content-Type: application/json" -d "$cj" $b/apis/batch/v1/namespaces/default/cronjobs' < "$work/contexts"
  sleep 0.5
}

inventory() { "$RDEPLOY" --state-dir "$work/state" inventory --kubeconfig "$work/kubeconfig" "$@"; }

# min/median/max wall-clock seconds of RUNS (default 5) runs of a command
RUNS=${RUNS:-5}
spread() {
  local t0 t1
  for _ in $(seq 1 "$RUNS"); do
    t0=$(now); "$@" > /dev/null; t1=$(now)
    secs "$t0" "$t1"
  done | sort -n | awk '{v[NR]=$1} END {printf "%s/%s/%s", v[1], v[int((NR+1)/2)], v[NR]}'
}

echo "== side by side, $N clusters"
start_fleet "$N"
inventory --json > "$work/inv.json"
answered=$(grep -m1 '"answered"' "$work/inv.json" | tr -dc 0-9)
echo "inventory answered: $answered of $N clusters"
loop=
if [ "${LOOP:-1}" != 0 ]; then
  t0=$(now)
  while read -r ctx; do "$KUBECTL" --kubeconfig "$work/kubeconfig" --context "$ctx" get pods -A -o json > /dev/null; done < "$work/contexts"
  t1=$(now)
  loop=$(secs "$t0" "$t1")
fi
rd=$(spread inventory)
rdjson=$(spread inventory --json)
[ -n "$loop" ] && echo "kubectl loop (pods only):           ${loop} s"
echo "rdeploy inventory (table, min/median/max of $RUNS): ${rd} s"
echo "rdeploy inventory --json (min/median/max of $RUNS): ${rdjson} s"
[ -n "$loop" ] && echo "speed-up (median): $(echo "scale=1; $loop / $(echo "$rd" | cut -d/ -f2)" | bc)x"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"

echo
echo "== growth (rdeploy inventory --json, min/median/max of $RUNS; then one run's peak RSS and"
echo "   CPU (user+sys) of rdeploy and of kubesim, which shares the cores)"
printf '%8s %22s %16s %8s %8s %8s %9s %16s\n' clusters seconds ms/cluster rss_mb rd_cpu ks_cpu answered load
ticks=$(getconf CLK_TCK)
sim_cpu() { awk '{print $14 + $15}' "/proc/$sim_pid/stat"; }
for n in $SIZES; do
  start_fleet "$n"
  s=$(spread inventory --json)
  median=$(echo "$s" | cut -d/ -f2)
  c0=$(sim_cpu)
  one=$( { /usr/bin/time -f '%M %U %S' "$RDEPLOY" --state-dir "$work/state" inventory --kubeconfig "$work/kubeconfig" --json > "$work/inv.json"; } 2>&1 | tail -1)
  c1=$(sim_cpu)
  read -r rss user sys <<< "$one"
  answered=$(grep -m1 '"answered"' "$work/inv.json" | tr -dc 0-9)
  printf '%8s %22s %16s %8s %8s %8s %9s %16s\n' "$n" "$s" "$(echo "scale=2; $median * 1000 / $n" | bc) (median)" \
    "$(echo "scale=1; $rss / 1024" | bc)" "$(echo "$user + $sys" | bc)" "$(echo "scale=2; ($c1 - $c0) / $ticks" | bc)" \
    "$answered" "$(cut -d' ' -f1-3 /proc/loadavg | tr ' ' /)"
done
