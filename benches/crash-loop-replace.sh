#!/usr/bin/env bash
# Benchmark (not a test): kill -9 rdeploy inside terraform provisioners, then inside the
# `recover` that replaces the resource the first kill left tainted (issue 32, point 2), then
# `recover` to the end; check each run converged and that no resource recorded done was applied
# again.
#
# Per run (N, default 25), on the chain fixture (six terraform_data resources in a chain, each
# local-exec appending to runs/aN.starts when it starts and runs/aN.log when it ends), with K a
# random resource:
#   1. `rdeploy up` with aK's provisioner held (`slow-aK`), killed with SIGKILL once it started;
#      terraform gets its SIGINT, kills the provisioner and leaves aK tainted;
#   2. `rdeploy recover`, which replaces aK (delete, then create), killed the same way inside the
#      create's provisioner: aK is tainted again, its delete half done;
#   3. on every second run, one more `recover` killed at a random moment (0-3 s), aK released;
#   4. `rdeploy recover` to the end (a refusal, exit 5, is retried, at most 3 times).
# After each kill the journal's done sub-changes are noted with their provisioner starts so
# far; a resource recorded done whose provisioner starts again later is a double apply, as is a
# recover that says the plan touches a resource "recorded done".
#
# Usage: benches/crash-loop-replace.sh [N]   (RDEPLOY names the binary, default target/debug).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-25}
RDEPLOY=${RDEPLOY:-$PWD/target/debug/rdeploy}
ROOT=$PWD
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

setup() {
  local d=$1
  mkdir -p "$d"
  cp -r "$ROOT/fixtures/terraform/chain" "$d/chain"
  # prov.sh, noting each start (a start of a resource recorded done is a re-apply).
  sed 's/^: > "runs\/\$name.started"$/: > "runs\/$name.started"; echo x >> "runs\/$name.starts"/' \
    "$ROOT/fixtures/terraform/prov.sh" > "$d/chain/prov.sh"
  printf 'name: crash-tf\nsteps:\n  - name: network\n    tool: terraform\n    dir: chain\n' > "$d/stack.yaml"
}

# Waits until no terraform of this run is left (the killed rdeploy's terraform ends on its SIGINT).
wait_terraform() {
  local d=$1 i=0
  while pgrep -f -- "$d/.rdeploy/steps" > /dev/null; do
    sleep 0.1; i=$((i + 1))
    [ "$i" -lt 1200 ] || { echo "terraform of $d never ended" >&2; return 1; }
  done
}

# kill_when_started DIR CMD RESOURCE: starts rdeploy CMD, SIGKILLs it once RESOURCE's provisioner started.
kill_when_started() {
  local d=$1 cmd=$2 res=$3 i=0
  rm -f "$d/chain/runs/$res.started"
  ( cd "$d" && exec "$RDEPLOY" -q --no-progress "$cmd" stack.yaml ) > "$d/$cmd.killed.out" 2>&1 &
  local pid=$!
  while [ ! -f "$d/chain/runs/$res.started" ] && kill -0 "$pid" 2>/dev/null; do
    sleep 0.05; i=$((i + 1)); [ "$i" -lt 2400 ] || break
  done
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  wait_terraform "$d"
}

kill_after() {
  local d=$1 cmd=$2 ms=$((RANDOM % 3000))
  ( cd "$d" && exec "$RDEPLOY" -q --no-progress "$cmd" stack.yaml ) > "$d/$cmd.random.out" 2>&1 &
  local pid=$!
  sleep "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  wait_terraform "$d"
}

# note_done DIR: appends "resource starts" for each sub-change recorded done and not yet noted.
note_done() {
  local d=$1 id name
  ( cd "$d" && "$RDEPLOY" status --json stack.yaml 2>/dev/null ) \
    | jq -r '.steps[]? | .sub_changes[]? | select(.status == "done") | .id' | while read -r id; do
      name=${id#terraform_data.}
      grep -q "^$name " "$d/noted" 2>/dev/null && continue
      echo "$name $(cat "$d/chain/runs/$name.starts" 2>/dev/null | wc -l)" >> "$d/noted"
    done
}

converged=0 doubles=0 refusals=0 tainted_after=0
for r in $(seq 1 "$N"); do
  d=$work/run-$r
  setup "$d"
  k=$((RANDOM % 6 + 1))
  touch "$d/chain/slow-a$k"
  kill_when_started "$d" up "a$k"
  note_done "$d"
  grep -q '"tainted": *true' <(cd "$d/chain" && terraform show -json 2>/dev/null) && tainted_after=$((tainted_after + 1))
  kill_when_started "$d" recover "a$k"
  note_done "$d"
  rm -f "$d/chain/slow-a$k"
  if [ $((r % 2)) -eq 0 ]; then kill_after "$d" recover; note_done "$d"; fi
  code=5 tries=0
  while [ "$code" -eq 5 ] && [ "$tries" -lt 3 ]; do
    code=0
    ( cd "$d" && "$RDEPLOY" -q --no-progress recover stack.yaml ) > "$d/recover.out" 2>&1 || code=$?
    [ "$code" -eq 5 ] && refusals=$((refusals + 1))
    tries=$((tries + 1))
  done
  state=$( cd "$d" && "$RDEPLOY" status --json stack.yaml 2>/dev/null | jq -r .state )
  again=0
  while read -r name starts; do
    now=$(cat "$d/chain/runs/$name.starts" 2>/dev/null | wc -l)
    [ "$now" -eq "$starts" ] || { again=$((again + 1)); echo "run $r: $name recorded done at $starts starts, now $now" >&2; }
  done < <(cat "$d/noted" 2>/dev/null)
  if grep -q "recorded done" "$d"/*.out; then again=$((again + 1)); echo "run $r: a recover said recorded done" >&2; fi
  [ "$again" -gt 0 ] && doubles=$((doubles + 1))
  if [ "$code" -eq 0 ] && [ "$state" = complete ]; then
    converged=$((converged + 1))
  else
    echo "run $r (K=a$k): recover exit $code, state $state" >&2
    KEEP=1
  fi
  echo "run $r: a$k held, recover exit $code, state $state, re-applied $again" >&2
done
printf 'runs %d  converged %d  runs-with-a-re-apply %d  refusals %d  tainted-after-up %d\n' \
  "$N" "$converged" "$doubles" "$refusals" "$tainted_after"
