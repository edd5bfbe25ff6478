#!/usr/bin/env bash
# The README's first command: a real deploy (terraform, ansible, helm, kubectl, shell) that fails part-way
# on purpose, the partial-state report, the fix, and `rdeploy recover` resuming only what is
# left. Runs in a fresh temporary directory (or $DEMO_DIR) each time; helm and kubectl talk to a
# kubesim cluster (an in-memory Kubernetes API) started here and stopped on exit.
set -euo pipefail
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
trap 'kill "$kubesim_pid" 2>/dev/null || true' EXIT
for _ in $(seq 200); do [ -s "$work/kubesim.ready" ] && break; sleep 0.05; done
[ -s "$work/kubesim.ready" ] || { echo "error: kubesim did not start (see $work/kubesim.log)" >&2; exit 1; }

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
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
echo
echo "demo directory: $work"
