#!/usr/bin/env bash
# Benchmark (not a test): kill -9 rdeploy at random moments during `up` and during `recover`,
# then `recover` until it finishes, and check each run converged with no completed sub-change
# applied twice and no human step (no `kill`, no edit: only `rdeploy recover`).
#
# Per tool, N runs (default 25); each run:
#   1. `rdeploy up` killed with SIGKILL after a random 0-1.5 s (shell) or 0-4 s (terraform);
#   2. on every second run, a `recover` killed the same way;
#   3. `rdeploy recover` to the end (a refusal, exit 5, is counted and retried, at most 3 times);
# converged = the last recover exits 0 and `status --json` says complete; a double apply = a
# side effect recorded more than once (each sub-change appends its name to a file in one
# write, and its `check`, or terraform's state, says whether it landed). A run killed before
# the deploy was recorded leaves nothing to recover: `up` again, counted as up-again.
#
# Tools: shell (10 sub-changes of 50-150 ms, each with a check) and terraform (the chain fixture:
# six terraform_data resources in a chain, each local-exec appending to runs/aN.log), and
# ansible, kubectl and helm (below).
#
# ansible (five local hosts, each appending its name after a moment; a host's play is its
# sub-change, so a name appended twice is an applied-twice count, an upper bound: a host left
# uncertain by the kill is run again by design, as ansible plays are meant to be idempotent).
#
# HARD=1 kills the tools' process groups too (from the survivor notes in .rdeploy/running/),
# stopped first so the dying rdeploy's SIGINT never reaches them: a container or cgroup killed
# whole, or the OOM killer. helm then leaves its revision pending-* instead of marking it failed
# (as one SIGINT does), which is what `recover` must get out of with no flag (issue 14).
#
# Columns: converged (the last recover exits 0 and status says complete), double applies,
# refusals (exit 5, retried), up-again, pending (a run that ended refused over a pending-*
# release), human steps (runs that did not converge: someone would have to step in), and for
# helm, abandoned (runs whose journal shows a revision a dead run left pending-*, which recover
# rolled back or uninstalled).
#
# Usage: benches/crash-loop.sh [N] [TOOLS]   (default 25 and "shell terraform").
# Builds the release binary first (honours CARGO_TARGET_DIR), unless RDEPLOY names a binary.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-25}
TOOLS=${2:-"shell terraform"}
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
if [ -z "${RDEPLOY:-}" ]; then
  cargo build --release --quiet -p rdeploy
  RDEPLOY=$TARGET/release/rdeploy
fi
ROOT=$PWD
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

# rand_delay MAX: a random delay in seconds, up to MAX milliseconds.
rand_delay() { local ms=$((RANDOM % $1)); printf '%d.%03d' $((ms / 1000)) $((ms % 1000)); }

setup_shell() {
  local d=$1
  {
    echo "name: crash-shell"; echo "steps:"; echo "  - name: seed"; echo "    tool: shell"; echo "    sub_changes:"
    for i in $(seq 1 10); do
      echo "      - { name: s$i, run: \"sleep 0.$((RANDOM % 10 + 5)); echo s$i >> effects\", check: \"grep -qx s$i effects\" }"
    done
  } > "$d/stack.yaml"
}
effects_shell() { sort "$1/effects" 2>/dev/null | uniq -c | awk '$1 > 1 {n++} END {print n+0}'; }
max_kill_ms_shell=1500

setup_terraform() {
  local d=$1
  cp -r "$ROOT/fixtures/terraform/chain" "$d/chain"
  cp "$ROOT/fixtures/terraform/prov.sh" "$d/chain/prov.sh"
  # Each resource takes a moment, so kills land inside the apply too.
  sed -i 's/^echo "\$name" >> "runs\/\$name.log"/sleep 0.3\necho "$name" >> "runs\/$name.log"/' "$d/chain/prov.sh"
  printf 'name: crash-tf\nsteps:\n  - name: network\n    tool: terraform\n    dir: chain\n' > "$d/stack.yaml"
}
effects_terraform() { cat "$1"/chain/runs/*.log 2>/dev/null | sort | uniq -c | awk '$1 > 1 {n++} END {print n+0}'; }
max_kill_ms_terraform=4000

setup_ansible() {
  local d=$1
  mkdir -p "$d/ansible"
  cp "$ROOT/fixtures/ansible/inventory.ini" "$d/ansible/"
  # Each host appends its name once, after a moment; the end of the play is what rdeploy
  # records per host, so a host appended twice is a host's play applied twice.
  cat > "$d/ansible/site.yml" <<'YML'
- name: crash loop
  hosts: all
  gather_facts: false
  tasks:
    - name: take a moment
      ansible.builtin.command: sleep 0.5
    - name: record the effect
      ansible.builtin.shell: echo "{{ inventory_hostname }}" >> "{{ playbook_dir }}/../effects"
YML
  printf 'name: crash-ansible\nsteps:\n  - name: hosts\n    tool: ansible\n    playbook: ansible/site.yml\n    inventory: ansible/inventory.ini\n    binary: %s\n    env: { ANSIBLE_NOCOLOR: "1" }\n' \
    "$ROOT/.venv/bin/ansible-playbook" > "$d/stack.yaml"
}
effects_ansible() { effects_shell "$1"; }
max_kill_ms_ansible=6000

# kubectl: one kubesim for the whole loop (started on first use), a namespace per run with
# eight ConfigMaps. kubectl apply is idempotent, so an object applied twice leaves no trace in
# the cluster: double applies are not measured for kubectl (the column always says 0).
kubesim_up() {
  [ -n "${KUBECONFIG:-}" ] && return
  export KUBECONFIG=$work/kubeconfig
  # Pods take 1.5 s to be ready, so helm --wait is at work long enough for kills to land in it.
  "$TARGET/debug/kubesim" --clusters c1 --kubeconfig "$KUBECONFIG" --pod-startup-ms 1500 > "$work/kubesim.out" 2>&1 &
  KUBESIM_PID=$!
  trap 'kill $KUBESIM_PID 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
  while ! kubectl get namespaces > /dev/null 2>&1; do sleep 0.1; done
}
setup_kubectl() {
  local d=$1 ns
  kubesim_up
  ns=crash-$(basename "$d")
  mkdir -p "$d/k8s"
  { printf 'apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n' "$ns"
    for i in $(seq 1 8); do printf -- '---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c%d, namespace: %s}\ndata: {i: "%d"}\n' "$i" "$ns" "$i"; done
  } > "$d/k8s/app.yaml"
  printf 'name: crash-kubectl\nsteps:\n  - name: objects\n    tool: kubectl\n    manifests: [k8s/app.yaml]\n    context: c1\n' > "$d/stack.yaml"
}
effects_kubectl() { echo 0; }
max_kill_ms_kubectl=3000

# helm (helm 3, HELM=tools/helm4/helm for helm 4): the demo's webapp chart, a release per run
# (`--wait`). A revision is one sub-change and helm keeps its revisions. The stack never
# changes, so once the journal records a revision done, any later install or upgrade revision
# applied the release again: that is a double apply. Revisions before the first one recorded
# done are the intended retries of an install the kill left unfinished (failed by helm's
# SIGINT, or pending-* and rolled back or uninstalled), and rollbacks are not applies of the
# step's chart. A kill may leave the release pending-*; a recover refused for that is counted
# apart (pending column).
HELM=${HELM:-$ROOT/tools/helm3/helm}
setup_helm() {
  local d=$1 r
  kubesim_up
  r=crash-$(basename "$d")
  cp -r "$ROOT/fixtures/demo/charts" "$d/charts"
  printf 'name: crash-helm\nsteps:\n  - name: app\n    tool: helm\n    release: %s\n    chart: charts/webapp\n    namespace: %s\n    context: c1\n    binary: %s\n    wait: true\n    timeout: 60s\n' \
    "$r" "$r" "$HELM" > "$d/stack.yaml"
}
effects_helm() {
  local r
  r=crash-$(basename "$1")
  # The revisions the journal records done (the last deploy, finished or not), then helm's own
  # history: a non-rollback revision after the first recorded done is a double apply.
  ( cd "$1" && "$RDEPLOY" status --json stack.yaml 2>/dev/null ) > "$1/status.json"
  # A revision a dead run abandoned pending-* and recover rolled back or uninstalled.
  if jq -e '[.steps[].warnings[]? | select(test("abandoned revision"))] | length > 0' "$1/status.json" > /dev/null; then
    abandoned=$((abandoned + 1))
  fi
  jq -r --arg r "$r" \
    '[.steps[] | select(.name == "app") | .sub_changes[] | select(.status == "done") | .id
      | select(startswith($r + "@")) | ltrimstr($r + "@") | tonumber] | min // empty' "$1/status.json" > "$1/first-done"
  "$HELM" --kube-context c1 history "$r" -n "$r" -o json 2>/dev/null > "$1/history.json" || echo '[]' > "$1/history.json"
  jq -r --argjson first "$(cat "$1/first-done" | grep . || echo 1000000)" \
    '[.[] | select(.revision > $first) | select(.description | startswith("Rollback to") | not)] | length' \
    "$1/history.json"
}
max_kill_ms_helm=4000

# killed CMD MAX_MS: runs rdeploy CMD in the background and SIGKILLs it after a random delay
# (with HARD=1, the tool groups it noted as well).
killed() {
  local d=$1 cmd=$2 max=$3 groups=""
  ( cd "$d" && exec "$RDEPLOY" -q --no-progress "$cmd" stack.yaml ) > /dev/null 2>&1 &
  local pid=$!
  sleep "$(rand_delay "$max")"
  if [ "${HARD:-0}" = 1 ]; then
    groups=$(cut -f1 "$d/.rdeploy/running/$pid" 2>/dev/null || true)
    for g in $groups; do kill -STOP -- "-$g" 2>/dev/null || true; done
  fi
  kill -9 "$pid" 2>/dev/null || true
  for g in $groups; do kill -KILL -- "-$g" 2>/dev/null || true; done
  [ -n "${KEEP:-}" ] && echo "  killed $cmd (pid $pid) with tool groups: ${groups:-none}" >&2
  wait "$pid" 2>/dev/null || true
}

printf '%-10s %5s %10s %14s %9s %9s %8s %7s %10s\n' tool runs converged double-applies refusals up-again pending human abandoned
for tool in $TOOLS; do
  runs=0 converged=0 doubles=0 refusals=0 restarts=0 pending=0 abandoned=0
  for r in $(seq 1 "$N"); do
    d=$work/$tool-$r
    mkdir -p "$d"
    "setup_$tool" "$d"
    max_var=max_kill_ms_$tool
    killed "$d" up "${!max_var}"
    if [ $((r % 2)) -eq 0 ]; then killed "$d" recover "${!max_var}"; fi
    code=5 tries=0
    while [ "$code" -eq 5 ] && [ "$tries" -lt 3 ]; do
      code=0
      ( cd "$d" && "$RDEPLOY" -q --no-progress recover stack.yaml ) > "$d/recover.out" 2>&1 || code=$?
      [ "$code" -eq 5 ] && refusals=$((refusals + 1))
      tries=$((tries + 1))
    done
    state=$( cd "$d" && "$RDEPLOY" status --json stack.yaml 2>/dev/null | sed -n 's/.*"state": *"\([a-z_]*\)".*/\1/p' | head -1 )
    if [ "$state" = none ]; then
      # Killed before the deploy was recorded: nothing to recover, `up` again.
      restarts=$((restarts + 1))
      code=0
      ( cd "$d" && "$RDEPLOY" -q --no-progress up stack.yaml ) > "$d/recover.out" 2>&1 || code=$?
      state=$( cd "$d" && "$RDEPLOY" status --json stack.yaml 2>/dev/null | sed -n 's/.*"state": *"\([a-z_]*\)".*/\1/p' | head -1 )
    fi
    runs=$((runs + 1))
    if grep -q 'pending-' "$d/recover.out" 2>/dev/null && [ "$code" -ne 0 ]; then pending=$((pending + 1)); fi
    if [ "$code" -eq 0 ] && [ "$state" = complete ]; then converged=$((converged + 1)); else
      echo "  $tool run $r: recover exit $code, state ${state:-?}: $(tail -3 "$d/recover.out" | tr '\n' ' ')" >&2
    fi
    "effects_$tool" "$d" > "$d/dup"
    dup=$(cat "$d/dup")
    if [ "$dup" -gt 0 ]; then doubles=$((doubles + 1)); echo "  $tool run $r: $dup side effects applied twice" >&2; fi
  done
  printf '%-10s %5d %10d %14d %9d %9d %8d %7d %10d\n' "$tool" "$runs" "$converged" "$doubles" "$refusals" "$restarts" "$pending" $((runs - converged)) "$abandoned"
done
