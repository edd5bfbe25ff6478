#!/usr/bin/env bash
# Runs the tests on the real-world corpus: popular public charts, CRD bundles, playbooks and
# terraform modules, each as fetched from its repository at a recorded commit with its licence
# and a SOURCE file. Third-party material is kept out of this repository's commits, so the
# corpus lives beside the workspace (../shared/corpus, or $KUBESIM_CORPUS / $RDEPLOY_CORPUS);
# a missing corpus fails these tests loudly. Needs what ./scripts/test.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
corpus="${KUBESIM_CORPUS:-${RDEPLOY_CORPUS:-$(cd .. && pwd)/shared/corpus}}"
[ -d "$corpus/charts" ] || { echo "error: no corpus at $corpus (charts/, bundles/ ...)" >&2; echo "hint: set KUBESIM_CORPUS to the corpus directory" >&2; exit 1; }
export KUBESIM_CORPUS="$corpus" RDEPLOY_CORPUS="$corpus"
scripts/fetch-helm.sh
cargo build --workspace --bins
cargo test -p kubesim --features corpus --test corpus --test corpus_bundles "$@"
cargo test -p rdeploy --features corpus --test corpus "$@"
