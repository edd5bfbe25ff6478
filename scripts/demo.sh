#!/usr/bin/env bash
# The README's first command: a real deploy (terraform, ansible, shell) that fails part-way
# on purpose, the partial-state report, the fix, and `rdeploy recover` resuming only what is
# left. Runs in a fresh temporary directory (or $DEMO_DIR) each time.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

command -v terraform >/dev/null || { echo "error: the demo needs terraform on PATH" >&2; exit 1; }
./scripts/setup-ansible.sh
cargo build --quiet --bin rdeploy
export PATH="$repo/target/debug:$repo/.venv/bin:$PATH"

work="${DEMO_DIR:-$(mktemp -d -t rdeploy-demo.XXXXXX)}"
cp -R fixtures/demo/. "$work/"
cd "$work"
touch markers/fail-web3

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

say "4. recover: ansible runs again with --limit web3 only, then the rest"
run rdeploy recover stack.yaml

say "5. proof: every host ran the release once, terraform applied each resource once"
for f in out/web*.log out/terraform.log out/seed.log; do printf '%-22s %s\n' "$f" "$(tr '\n' ' ' < "$f")"; done
echo
echo "demo directory: $work"
