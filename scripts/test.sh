#!/usr/bin/env bash
# Runs every test of the workspace on a fresh machine: installs what the tests need first
# (helm 3 and 4 from npm, ansible-core in a project-local virtualenv, PostgreSQL, Prometheus and Chromium from Debian), builds every binary the
# integration tests spawn (rdeploy, kubesim), then runs the suite. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v terraform >/dev/null || { echo "error: terraform is not installed (the tests need terraform v1.11)" >&2; exit 1; }
command -v kubectl >/dev/null || { echo "error: kubectl is not installed (the tests need kubectl v1.32)" >&2; exit 1; }

for setup in scripts/fetch-helm.sh scripts/setup-ansible.sh scripts/setup-postgres.sh scripts/setup-observability.sh; do
  if [ -x "$setup" ]; then "$setup"; fi
done

# House checks first: formatting and lints are part of the suite.
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo build --workspace --bins
cargo test --workspace "$@"
