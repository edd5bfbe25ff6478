#!/usr/bin/env bash
# Benchmark (not a test): the cost of a journal record in the PostgreSQL store against the local
# state directory, reported as a ratio.
#
# 1. Per record, through the real checkpoint path (`rdeploy state bench`, hidden): N sub-changes,
#    two records each, as a deploy writes them (a sub-change's start is durable before it runs,
#    its end group-committed).
#      local:      write + fdatasync of journal.jsonl for the start, a write for the end
#      postgres:   one INSERT per record (fenced by the lease, committed asynchronously) plus,
#                  for the start, a lease renewal committed synchronously (flushes the WAL)
# 2. End to end: `rdeploy up` of N shell sub-changes `true`, local vs `--state postgres://`.
#
# The server is a throwaway one on a loopback port with PostgreSQL's defaults (fsync on,
# synchronous_commit on), its data directory on the same disk as the local store.
#
# Usage: benches/store.sh [N]   (default 500). Builds the release binary first (or set RDEPLOY_BIN).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-500}
if [ -n "${RDEPLOY_BIN:-}" ]; then
  BIN=$RDEPLOY_BIN   # a binary built already
else
  cargo build --release --quiet --bin rdeploy
  BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/rdeploy
fi

pgbin=$(dirname "$(command -v initdb || ls -d /usr/lib/postgresql/*/bin/initdb | sort -V | tail -1)")
[ -x "$pgbin/pg_ctl" ] || { echo "error: PostgreSQL is not installed: run \`scripts/setup-postgres.sh\`" >&2; exit 1; }
work=$(mktemp -d /var/tmp/rdeploy-bench.XXXXXX)
as_server=()
if [ "$(id -u)" = 0 ]; then
  # PostgreSQL refuses to run as root.
  chown postgres "$work" 2>/dev/null || chown nobody "$work"
  as_server=(runuser -u "$(stat -c %U "$work")" --)
  chmod 755 "$work"
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"${as_server[@]}" "$pgbin/initdb" -D "$work/data" -U postgres --auth=trust -E UTF8 --locale=C >/dev/null
"${as_server[@]}" "$pgbin/pg_ctl" start -w -D "$work/data" -l "$work/server.log" -o "-p $port -k $work -c listen_addresses=127.0.0.1" >/dev/null
trap '"${as_server[@]}" "$pgbin/pg_ctl" stop -w -m fast -D "$work/data" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
URL="postgres://postgres@127.0.0.1:$port/postgres"
mkdir -p "$work/local" "$work/e2e"

us_per_record() {
  "$BIN" state bench --to "$1" --sub-changes "$N" | python3 -c 'import json,sys; print(json.load(sys.stdin)["us_per_record"])'
}
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# The two stores alternate, so a change of load on the machine hits both alike.
echo "== 1. per journal record, $N sub-changes ($((2 * N)) records), median of 5"
"$BIN" state bench --to "$URL" --sub-changes 10 >/dev/null   # schema on first use, not measured
: > "$work/local.us"; : > "$work/pg.us"
for _ in 1 2 3 4 5; do
  us_per_record "$work/local" >> "$work/local.us"
  us_per_record "$URL" >> "$work/pg.us"
done
local_us=$(median < "$work/local.us")
pg_us=$(median < "$work/pg.us")
printf '  local dir:  %8.1f us/record\n' "$local_us"
printf '  postgres:   %8.1f us/record\n' "$pg_us"
printf '  ratio postgres/local: %.2f\n' "$(echo "$pg_us / $local_us" | bc -l)"

echo "== 2. end to end: rdeploy up, $N shell sub-changes \`true\`"
{
  echo "name: bench"
  echo "steps:"
  echo "  - name: seed"
  echo "    tool: shell"
  echo "    sub_changes:"
  for i in $(seq 1 "$N"); do echo "      - { name: s$i, run: 'true' }"; done
} > "$work/e2e/stack.yaml"
wall() {
  local start end
  start=$(date +%s%N)
  "$BIN" up "$work/e2e/stack.yaml" --no-progress -q "$@" >/dev/null
  end=$(date +%s%N)
  echo "scale=3; ($end - $start) / 1000000000" | bc
}
local_s=$(wall --state-dir "$work/e2e/.rdeploy")
pg_s=$(wall --state "$URL")
printf '  local dir:  %6.2f s (%.2f ms/sub-change)\n' "$local_s" "$(echo "$local_s * 1000 / $N" | bc -l)"
printf '  postgres:   %6.2f s (%.2f ms/sub-change)\n' "$pg_s" "$(echo "$pg_s * 1000 / $N" | bc -l)"
printf '  ratio postgres/local: %.2f\n' "$(echo "$pg_s / $local_s" | bc -l)"
