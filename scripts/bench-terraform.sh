#!/usr/bin/env bash
# Benchmark, not a test: `rdeploy up` of a stack whose one terraform step creates N (200)
# terraform_data resources, against `terraform plan -out p && terraform apply p` run directly on
# the same configuration, side by side in one run. Each round starts both from an empty state;
# the order alternates so neither side always runs on a warm cache. Prints per-round times, the
# medians and the ratios rdeploy/direct of wall and CPU time (goal: <= 1.05).
#
#   scripts/bench-terraform.sh            # 7 rounds of 200 resources
#   ROUNDS=3 N=50 scripts/bench-terraform.sh
#   RDEPLOY=/tmp/rdeploy-old scripts/bench-terraform.sh
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-7}
N=${N:-200}
command -v terraform >/dev/null || { echo "error: terraform is not installed" >&2; exit 1; }
# RDEPLOY=path measures that binary instead of building one (two builds in the same minutes).
if [[ -z ${RDEPLOY:-} ]]; then
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target/tf-dev}
  cargo build --release --quiet --bin rdeploy
  RDEPLOY="$CARGO_TARGET_DIR/release/rdeploy"
fi
export TF_IN_AUTOMATION=1 TF_INPUT=0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for side in direct rdeploy; do
  mkdir -p "$work/$side/cfg"
  cat > "$work/$side/cfg/main.tf" <<TF
variable "rev" {
  type    = string
  default = "1"
}

resource "terraform_data" "r" {
  count = $N
  input = "\${var.rev}-\${count.index}"
}
TF
done
cat > "$work/rdeploy/stack.yaml" <<YAML
name: bench
steps:
  - name: infra
    tool: terraform
    dir: cfg
YAML

reset() { rm -rf "$1/cfg/terraform.tfstate" "$1/cfg/terraform.tfstate.backup" "$1/cfg/p" "$1/.rdeploy"; }
run_direct() {
  (cd "$work/direct/cfg" && terraform plan -input=false -out=p >/dev/null 2>&1 && terraform apply -input=false p >/dev/null 2>&1)
}
run_rdeploy() {
  (cd "$work/rdeploy" && "$RDEPLOY" up stack.yaml --no-progress >/dev/null 2>&1)
}
# Prints "wall cpu" in seconds; cpu is user+sys of the whole process tree (terraform included),
# which other work on a shared machine disturbs far less than wall time.
time_it() {
  reset "$work/$1"
  local TIMEFORMAT='%R %U %S' t
  t=$( { time "run_$1" || { echo "error: the $1 run failed" >&2; exit 1; }; } 2>&1 )
  echo "$t" | awk '{ printf "%.3f %.3f\n", $1, $2 + $3 }'
}

# One warm-up of each, not counted: the first terraform start reads its plugins from disk.
time_it direct >/dev/null
time_it rdeploy >/dev/null

dw=(); dc=(); rw=(); rc=()
printf '%-6s %12s %12s %12s %12s\n' round direct-wall rdeploy-wall direct-cpu rdeploy-cpu
for round in $(seq "$ROUNDS"); do
  if (( round % 2 )); then
    d=$(time_it direct); r=$(time_it rdeploy)
  else
    r=$(time_it rdeploy); d=$(time_it direct)
  fi
  read -r d_wall d_cpu <<<"$d"; read -r r_wall r_cpu <<<"$r"
  dw+=("$d_wall"); dc+=("$d_cpu"); rw+=("$r_wall"); rc+=("$r_cpu")
  printf '%-6s %11ss %11ss %11ss %11ss\n' "$round" "$d_wall" "$r_wall" "$d_cpu" "$r_cpu"
done

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
mdw=$(median "${dw[@]}"); mrw=$(median "${rw[@]}"); mdc=$(median "${dc[@]}"); mrc=$(median "${rc[@]}")
printf '%-6s %11ss %11ss %11ss %11ss\n' median "$mdw" "$mrw" "$mdc" "$mrc"
printf 'ratio rdeploy/direct, %s resources: wall %.3f, cpu %.3f (goal <= 1.05)\n' "$N" \
  "$(echo "$mrw / $mdw" | bc -l)" "$(echo "$mrc / $mdc" | bc -l)"
