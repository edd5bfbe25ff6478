#!/usr/bin/env bash
# Makes sure the PostgreSQL server binaries (initdb, pg_ctl, postgres) and psql are installed for
# the PostgreSQL store's tests (tests/postgres.rs), which start a throwaway server per test on a
# loopback port. Installs Debian's `postgresql` package when they are missing; the package's
# own cluster is not needed and is left alone. Idempotent: returns at once when all are there.
set -euo pipefail

found_bin() {
  if command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
    dirname "$(command -v initdb)"
    return
  fi
  # Debian keeps the server binaries off PATH, one directory per major version.
  local dir
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && [ -x "$dir/postgres" ]; then
      echo "$dir"
      return
    fi
  done
}

bin="$(found_bin || true)"
if [ -n "$bin" ] && command -v psql >/dev/null; then
  echo "setup-postgres: $("$bin/postgres" --version) in $bin" >&2
  exit 0
fi

command -v apt-get >/dev/null || { echo "error: PostgreSQL is not installed and this is not a Debian-like system: install the PostgreSQL server (initdb, pg_ctl) and psql" >&2; exit 1; }
sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "error: installing PostgreSQL needs root: run \`sudo apt-get install postgresql\`" >&2; exit 1; }
  sudo="sudo"
fi
echo "setup-postgres: apt-get install postgresql" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends postgresql postgresql-client >/dev/null

bin="$(found_bin || true)"
[ -n "$bin" ] || { echo "error: postgresql was installed but initdb/pg_ctl were not found under /usr/lib/postgresql/*/bin" >&2; exit 1; }
echo "setup-postgres: $("$bin/postgres" --version) in $bin" >&2
