#!/usr/bin/env bash
# The README's first command: a real deploy (terraform, ansible, helm, kubectl, shell) that fails part-way
# on purpose, the partial-state report, the fix, and `rdeploy recover` resuming only what is
# left. Runs in a fresh temporary directory (or $DEMO_DIR) each time; helm and kubectl talk to a
# kubesim cluster (an in-memory Kubernetes API) started here and stopped on exit; with `--keep`
# it stays up so `helm` and `kubectl` can look at what the deploy left (the demo says how to
# stop it). Colour only on a terminal, and never with NO_COLOR set.
set -euo pipefail
keep=false
for arg in "$@"; do
  case "$arg" in
    --keep) keep=true ;;
    -h|--help) echo "usage: scripts/demo.sh [--keep]   (--keep: leave the kubesim cluster running)"; exit 0 ;;
    *) echo "error: unknown argument \`$arg\`" >&2; echo "  hint: scripts/demo.sh [--keep]" >&2; exit 2 ;;
  esac
done
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

command -v terraform >/dev/null || { echo "error: the demo needs terraform on PATH" >&2; exit 1; }
./scripts/setup-ansible.sh
command -v kubectl >/dev/null || { echo "error: the demo needs kubectl on PATH" >&2; exit 1; }
./scripts/fetch-helm.sh 4 >/dev/null
cargo build --quiet -p rdeploy -p kubesim
target="${CARGO_TARGET_DIR:-$repo/target}/debug"
export PATH="$target:$repo/.venv/bin:$repo/tools/helm4:$PATH"

work="${DEMO_DIR:-$(mktemp -d -t rdeploy-demo.XXXXXX)}"
cp -R fixtures/demo/. "$work/"
cd "$work"
touch markers/fail-web3

# One cluster named `demo`; its kubeconfig and kubectl's cache stay inside the demo directory.
export KUBECONFIG="$work/kubeconfig" KUBECACHEDIR="$work/.kube-cache"
export HELM_CACHE_HOME="$work/.helm/cache" HELM_CONFIG_HOME="$work/.helm/config" HELM_DATA_HOME="$work/.helm/data"
kubesim --listen 127.0.0.1:0 --clusters demo --kubeconfig "$KUBECONFIG" > "$work/kubesim.ready" 2> "$work/kubesim.log" &
kubesim_pid=$!
# Said at once, so whoever runs the demo can stop kubesim whatever happens next.
echo "kubesim (pid $kubesim_pid) serves the demo cluster"
if $keep; then
  # Kept only for a demo that got to the end: one that failed stops it as it exits.
  trap 'rc=$?; if [ "$rc" -ne 0 ]; then kill "$kubesim_pid" 2>/dev/null || true; fi' EXIT
else
  trap 'kill "$kubesim_pid" 2>/dev/null || true' EXIT
fi
for _ in $(seq 200); do [ -s "$work/kubesim.ready" ] && break; sleep 0.05; done
[ -s "$work/kubesim.ready" ] || { echo "error: kubesim did not start (see $work/kubesim.log)" >&2; exit 1; }

if [ -t 1 ] && [ -z "${NO_COLOR:-}" ]; then bold=$'\033[1m' plain=$'\033[0m'; else bold='' plain=''; fi
say() { printf '\n%s== %s%s\n' "$bold" "$*" "$plain"; }
run() { printf '$ %s\n' "$*"; "$@"; }

say "1. deploy: web3's disk is full, so the ansible step fails on that host"
set +e; run rdeploy up stack.yaml; code=$?; set -e
echo "(exit code $code: stopped part-way, checkpoint kept)"

say "2. a retry from the top is refused: it would re-apply what is done"
set +e; run rdeploy up stack.yaml; echo "(exit code $?)"; set -e

say "3. the fix: free the disk on web3, then look before leaping"
run rm markers/fail-web3
run rdeploy recover --dry-run stack.yaml

say "4. recover: ansible runs again with --limit web3 only, then helm, kubectl and the rest"
run rdeploy recover stack.yaml

say "5. proof: every host ran the release once, terraform applied each resource once"
for f in out/web*.log out/terraform.log out/seed.log out/schema; do printf '%-22s %s\n' "$f" "$(tr '\n' ' ' < "$f")"; done
run helm history shop -n shop --kube-context demo
run kubectl --context demo -n shop get deploy,cm

say "6. the outputs that flowed between the steps, as the checkpoint recorded them"
run rdeploy output stack.yaml
run rdeploy output stack.yaml network lb_address

say "7. look around: the deploy is yours to poke at"
echo "demo directory: $work"
echo
echo "  cd $work"
echo "  export PATH=\"$target:\$PATH\"   # rdeploy (or: cargo install --locked --path $repo)"
echo "  rdeploy status stack.yaml          # what the checkpoint records, step by step"
echo "  rdeploy runbook stack.yaml         # the runbook: how to inspect, recover and revert each step"
echo "  rdeploy output stack.yaml          # the outputs that flowed between the steps"
if $keep; then
  echo "  export KUBECONFIG=$KUBECONFIG PATH=\"$repo/tools/helm4:\$PATH\""
  echo "  rdeploy plan stack.yaml            # what another \`up\` would change: nothing"
  echo "  helm history shop -n shop --kube-context demo"
  echo "  kubectl --context demo -n shop get deploy,cm"
  echo
  echo "kubesim (pid $kubesim_pid) keeps running for helm and kubectl; stop it with: kill $kubesim_pid"
else
  echo
  echo "kubesim has stopped; run \`scripts/demo.sh --keep\` to keep it up for helm and kubectl"
fi
