#!/usr/bin/env bash
# Runs every test of the workspace on a fresh machine: installs what the tests need first
# (helm 3 and 4 from npm, ansible-core in a project-local virtualenv, PostgreSQL, Prometheus and Chromium from Debian), builds every binary the
# integration tests spawn (rdeploy, kubesim), then runs the whole suite, the tests on the
# real-world corpus included (it lives beside the checkout in ../shared/corpus, or
# $KUBESIM_CORPUS; a missing corpus fails the run before any test). Every test binary runs even
# when one fails, and the run ends with one total line: `N passed, N failed`. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v terraform >/dev/null || { echo "error: terraform is not installed (the tests need terraform v1.11)" >&2; exit 1; }
command -v kubectl >/dev/null || { echo "error: kubectl is not installed (the tests need kubectl v1.32)" >&2; exit 1; }
corpus="${KUBESIM_CORPUS:-${RDEPLOY_CORPUS:-$(cd .. && pwd)/shared/corpus}}"
[ -d "$corpus/charts" ] || {
  echo "error: no real-world corpus at $corpus (charts/, bundles/, manifests/, ansible/, terraform/)" >&2
  echo "  hint: put the corpus beside the checkout in ../shared/corpus, or set KUBESIM_CORPUS to it" >&2
  exit 1
}
export KUBESIM_CORPUS="$corpus"

for setup in scripts/fetch-helm.sh scripts/setup-ansible.sh scripts/setup-postgres.sh scripts/setup-observability.sh; do
  if [ -x "$setup" ]; then "$setup"; fi
done

# House checks first: formatting and lints are part of the suite.
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo build --workspace --bins

# Every binary runs even when one fails; the output is kept to count the results.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
set +e
cargo test --workspace --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# Each binary ends with `test result: ok. 12 passed; 0 failed; 1 ignored; ...`; a binary that
# crashed prints none, so cargo's own list of failed targets is kept too.
read -r passed failed ignored < <(awk '/^test result: / {
    for (i = 1; i <= NF; i++) {
      if ($(i + 1) ~ /^passed;?$/) p += $i; if ($(i + 1) ~ /^failed;?$/) f += $i; if ($(i + 1) ~ /^ignored;?$/) g += $i
    } } END { print p + 0, f + 0, g + 0 }' "$log")
failed_targets=$(grep -cE '^error: test failed, to rerun pass' "$log" || true)
red_results=$(grep -cE '^test result: FAILED' "$log" || true)
summary="$passed passed, $failed failed"
if [ "$ignored" -gt 0 ]; then summary="$summary, $ignored ignored"; fi
if [ "$failed_targets" -gt "$red_results" ]; then
  summary="$summary, $((failed_targets - red_results)) test binaries ended without a result (see above)"
elif [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  summary="$summary, and cargo failed (see above)"
fi
echo "$summary"
exit "$status"
