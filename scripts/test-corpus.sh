#!/usr/bin/env bash
# A shortcut while working on the corpus tests: runs only the tests on the real-world corpus
# (public charts, CRD bundles, a playbook, a terraform module, a manifest bundle; see
# ../shared/corpus/README.md). ./scripts/test.sh runs them too, with everything else.
# The corpus lives beside the workspace (../shared/corpus, or $KUBESIM_CORPUS); a missing corpus
# fails loudly. Needs what ./scripts/test.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
corpus="${KUBESIM_CORPUS:-${RDEPLOY_CORPUS:-$(cd .. && pwd)/shared/corpus}}"
[ -d "$corpus/charts" ] || { echo "error: no corpus at $corpus (charts/, bundles/ ...)" >&2; echo "  hint: set KUBESIM_CORPUS to the corpus directory" >&2; exit 1; }
export KUBESIM_CORPUS="$corpus"
scripts/fetch-helm.sh
cargo build --workspace --bins
status=0
cargo test --no-fail-fast -p kubesim --test corpus --test corpus_bundles "$@" || status=$?
cargo test --no-fail-fast -p rdeploy --test corpus "$@" || status=$?
exit "$status"
