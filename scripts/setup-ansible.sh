#!/usr/bin/env bash
# Installs ansible-core into a project-local virtualenv (<repo>/.venv) for the ansible adapter's
# tests: they run `.venv/bin/ansible-playbook` against local-connection inventories, offline.
# Idempotent: a venv that already has the pinned version is kept and this returns at once.
set -euo pipefail

ANSIBLE_CORE_VERSION="2.19.14"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
python="${PYTHON:-python3}"

installed_version() {
  "$venv/bin/python" -c 'import ansible.release; print(ansible.release.__version__)' 2>/dev/null || true
}

if [ -x "$venv/bin/ansible-playbook" ] && [ "$(installed_version)" = "$ANSIBLE_CORE_VERSION" ]; then
  echo "setup-ansible: ansible-core $ANSIBLE_CORE_VERSION already in .venv" >&2
  exit 0
fi

command -v "$python" >/dev/null || { echo "error: \`$python\` is not installed (ansible-core needs python 3.11+)" >&2; exit 1; }

if [ ! -x "$venv/bin/python" ]; then
  echo "setup-ansible: creating $venv" >&2
  "$python" -m venv "$venv"
fi
echo "setup-ansible: pip install ansible-core==$ANSIBLE_CORE_VERSION" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "ansible-core==$ANSIBLE_CORE_VERSION"

if [ "$(installed_version)" != "$ANSIBLE_CORE_VERSION" ]; then
  echo "error: ansible-core $ANSIBLE_CORE_VERSION did not install into $venv" >&2
  exit 1
fi
echo "setup-ansible: installed ansible-core $(installed_version) into .venv" >&2
