#!/usr/bin/env bash
# Benchmark (not a test): a fleet rollout of a small chart (one ConfigMap, one 1-replica
# Deployment) over N kubesim clusters with `rdeploy up` (waves 1, 10%, 50%, 100%, `parallel`
# clusters at a time, helm --wait and a read of each cluster), reported as time per cluster
# against a plain `helm upgrade --install --wait` per cluster run sequentially (timed on a
# sample of SAMPLE clusters, a second release, so the figure is per cluster either way). Then
# the resume cost: a second rollout (a new value) is killed with SIGKILL once half the clusters
# are done, and `rdeploy recover --dry-run` (which decides from the checkpoint what is left) and
# the real `rdeploy recover` are timed. Goal: recover decides in under 1 s for 400 clusters.
#
# Measured on the shared 2-core machine, release builds, helm 4.1.4:
# - under heavy load (load average 40-78: the test suite and other builds ran meanwhile):
#   400 clusters, parallel 50: rdeploy up 818.7 s, 2.05 s per cluster; sequential helm upgrade
#   --install --wait (40-cluster sample): 134.0 s, 3.35 s per cluster.
# - quiet (nothing else running; the rollout itself drives the load average to 36-43):
#   `benches/rollout.sh 400 50 20`: rdeploy up 536.4 s, 1.34 s per cluster; sequential helm
#   (20-cluster sample) 18.1 s, 0.906 s per cluster. Killed with 200 of 400 clusters done (waves
#   1-3 done, wave 4 at 0/200): `recover --dry-run` decided what was left in 0.234 s (goal < 1 s);
#   the real `recover` finished the rollout in 371.3 s.
# These figures are from before the helm cut: each cluster cost rdeploy 7 helm processes
# (version, history, status, upgrade, history, status, get metadata) and 2 API reads, against 1
# helm for the plain loop. Now it costs 3 (history, upgrade -o json, history: `helm version` is
# asked once per run, the outputs come from the release the upgrade prints). Debug build, 20
# clusters, parallel 5, load average 6-8, four runs each: 0.79/0.49/0.87/0.80 s per cluster
# before, 0.51/0.35/0.52/0.54 s after (sequential helm 0.32-0.59 s per cluster meanwhile).
#
# 2026-12-02, after each cluster's helm got a kubeconfig of its own context only (helm parsed the
# fleet's whole kubeconfig on every start: 1.0-1.1 s of CPU per upgrade at 400 contexts, 0.19 s
# with one), release builds, ratios rdeploy / sequential loop per cluster:
#   40 10 40 (3 runs, load 2-6): wall .46/.48/.58, CPU .82/.87/1.09 (before, quiet: wall
#   .62/.66/.66, CPU 1.09/1.17/1.17); 400 50 40: wall .21, CPU .33, up 46.2 s (before: .83, 1.36,
#   294.9 s); recover --dry-run after kill -9 at 50% 0.21 s; recover 30.6 s (before 161 s).
#
# Usage: benches/rollout.sh [N] [PARALLEL] [SAMPLE]   (default 400, 50, 40).
# Builds the release binaries first (honours CARGO_TARGET_DIR; PROFILE=debug for a smoke run;
# RDEPLOY=path KUBESIM=path use those binaries instead, so a build can go on meanwhile);
# needs helm (HELM, default tools/helm4/helm, else helm on PATH) and bc.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-400}
PARALLEL=${2:-50}
SAMPLE=${3:-40}
PROFILE=${PROFILE:-release}
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
if [ -z "${RDEPLOY:-}" ] || [ -z "${KUBESIM:-}" ]; then
  if [ "$PROFILE" = release ]; then cargo build --release --quiet -p rdeploy -p kubesim; else cargo build --quiet -p rdeploy -p kubesim; fi
  RDEPLOY=$TARGET/$PROFILE/rdeploy
  KUBESIM=$TARGET/$PROFILE/kubesim
fi
REAL_HELM=${HELM:-$(ls "$PWD"/tools/helm4/helm 2>/dev/null || command -v helm)}
work=$(mktemp -d)
sim_pid=
run_pid=
cleanup() {
  [ -n "$run_pid" ] && kill -9 "$run_pid" 2>/dev/null
  [ -n "$sim_pid" ] && kill "$sim_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
export HOME=$work/home HELM_CACHE_HOME=$work/home/.cache/helm HELM_CONFIG_HOME=$work/home/.config/helm
export HELM_DATA_HOME=$work/home/.local/share/helm NO_COLOR=1
mkdir -p "$HOME"
# The counter: every helm run (rdeploy's and the loop's alike) goes through this wrapper, which
# logs its subcommand; CPU is user+sys of the run and its children (/usr/bin/time).
HELM=$work/helm
printf '#!/bin/sh\necho "$1" >> "%s"\nexec "%s" "$@"\n' "$work/helm-calls" "$REAL_HELM" > "$HELM"
chmod +x "$HELM"
calls() { sort "$work/helm-calls" 2>/dev/null | uniq -c | awk '{printf "%s %s, ", $1, $2}' | sed 's/, $//'; : > "$work/helm-calls"; }
timed() { /usr/bin/time -f '%e %U %S' -o "$work/time" "$@"; }
wall_of() { awk '{print $1}' "$work/time"; }
cpu_of() { awk '{print $2 + $3}' "$work/time"; }

now() { date +%s%N; }
secs() { echo "scale=3; ($2 - $1) / 1000000000" | bc; }
per() { echo "scale=3; $1 / $2" | bc; }

"$KUBESIM" --listen 127.0.0.1:0 --clusters "$N" --kubeconfig "$work/kubeconfig" --pod-startup-ms 50 > "$work/ready" 2>/dev/null &
sim_pid=$!
while ! grep -q ready "$work/ready" 2>/dev/null; do sleep 0.05; done
export KUBECONFIG=$work/kubeconfig

mkdir -p "$work/p/chart/templates"
cd "$work/p"
printf 'apiVersion: v2\nname: agent\nversion: 0.1.0\n' > chart/Chart.yaml
printf 'image: nginx:1.27\nlevel: info\n' > chart/values.yaml
cat > chart/templates/agent.yaml <<'EOF'
apiVersion: v1
kind: ConfigMap
metadata:
  name: agent
data:
  level: {{ .Values.level | quote }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: agent
spec:
  replicas: 1
  selector:
    matchLabels: { app: agent }
  template:
    metadata:
      labels: { app: agent }
    spec:
      containers:
        - name: agent
          image: {{ .Values.image | quote }}
EOF
stack() {
  cat > stack.yaml <<EOF
name: agents
steps:
  - name: agent
    tool: helm
    release: agent
    chart: chart
    namespace: monitoring
    binary: $HELM
    contexts: ["cluster-*"]
    timeout: 2m
    set: { level: "$1" }
    rollout: { waves: [1, "10%", "50%", "100%"], parallel: $PARALLEL, inventory_timeout: 30s }
EOF
}

echo "== $N clusters, parallel $PARALLEL, helm $("$REAL_HELM" version --short), load average $(cut -d' ' -f1-3 /proc/loadavg)"
stack info
timed "$RDEPLOY" -q --no-progress up > "$work/up.out" 2> "$work/up.err" || { tail -n 20 "$work/up.out" "$work/up.err"; exit 1; }
total=$(wall_of); rd_cpu=$(cpu_of)
echo "rdeploy up (first install):   ${total} s, $(per "$total" "$N") s per cluster; CPU $(per "$rd_cpu" "$N") s per cluster"
echo "  helm processes: $(calls) (for $N clusters)"

mapfile -t contexts < <(grep -o 'name: cluster-[0-9]*' "$KUBECONFIG" | awk '{print $2}' | sort -u | head -n "$SAMPLE")
printf '%s\n' "${contexts[@]}" > "$work/sample"
timed sh -c 'while read -r ctx; do "$0" upgrade --install plain chart -n plain --create-namespace --kube-context "$ctx" --wait=watcher --timeout 2m > /dev/null || exit 1; done < "$1"' "$HELM" "$work/sample"
plain=$(wall_of); plain_cpu=$(cpu_of)
echo "sequential helm upgrade:      ${plain} s for ${#contexts[@]} clusters, $(per "$plain" "${#contexts[@]}") s per cluster; CPU $(per "$plain_cpu" "${#contexts[@]}") s per cluster"
echo "  helm processes: $(calls) (for ${#contexts[@]} clusters)"
echo "ratios, rdeploy over the loop, per cluster: wall $(echo "scale=2; ($total / $N) / ($plain / ${#contexts[@]})" | bc), CPU $(echo "scale=2; ($rd_cpu / $N) / ($plain_cpu / ${#contexts[@]})" | bc)"

echo "== resume after kill -9 at 50%"
first=$("$RDEPLOY" status --json | grep -m1 '"deploy_id"' | cut -d'"' -f4)
stack debug
"$RDEPLOY" -q --no-progress up > /dev/null 2>&1 &
run_pid=$!
half=$((N / 2))
while :; do
  "$RDEPLOY" status --json > "$work/status.json" 2>/dev/null || true
  id=$(grep -m1 '"deploy_id"' "$work/status.json" | cut -d'"' -f4 || true)
  done_now=$(grep -c '"status": "done"' "$work/status.json" || true)
  [ -n "$id" ] && [ "$id" != "$first" ] && [ "$done_now" -ge "$half" ] && break
  sleep 0.2
done
kill -9 "$run_pid"; wait "$run_pid" 2>/dev/null || true; run_pid=
done_at_kill=$("$RDEPLOY" status --json | grep -c '"status": "done"' || true)
echo "killed with $done_at_kill of $N clusters done"
t0=$(now); "$RDEPLOY" recover --dry-run > "$work/dry.out" 2>&1; t1=$(now)
echo "recover --dry-run (decides what is left): $(secs "$t0" "$t1") s"
grep -E 'wave [0-9]+ of' "$work/dry.out" | sed 's/^ */  /' | head -5 || true
t0=$(now); "$RDEPLOY" -q --no-progress recover > /dev/null 2>&1 || { echo "recover failed"; exit 1; }; t1=$(now)
echo "recover (finishes the rollout): $(secs "$t0" "$t1") s"
