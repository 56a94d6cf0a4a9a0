#!/usr/bin/env bash
# Runs every benchmark scenario of BENCHMARKS.md, each at the operator's default API budget
# (QPS 50, burst 100) and at the tuned one (1000/2000), one after the other on the dev control
# plane, and writes one JSON report per run plus the Markdown tables (hack/bench-table.py) into
# OUT_DIR. Takes about an hour on 2 cores; run nothing else meanwhile (the figures are the
# machine's).
#
# usage: hack/bench-all.sh OUT_DIR [--quick]    (--quick: 200 jobs per scenario, no density)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:?usage: hack/bench-all.sh OUT_DIR [--quick]}"
quick="${2:-}"
mkdir -p "$out"
cargo build --release --bins
bench=target/release/bench
if [[ -n "${CARGO_TARGET_DIR:-}" ]]; then bench="$CARGO_TARGET_DIR/release/bench"; fi

n() { if [[ "$quick" == "--quick" ]]; then echo 200; else echo "$1"; fi; }

# name | bench arguments
runs=(
  "local|--scenario local --jobs $(n 1000)"
  "steady20|--scenario local --jobs $(n 600) --rate 20"
  "steady35|--scenario local --jobs $(n 1000) --rate 35"
  "steady50|--scenario local --jobs $(n 1000) --rate 50"
  "pod|--scenario pod --jobs $(n 1000)"
  "pod-churn|--scenario pod --jobs $(n 400) --pod-seconds 90 --churn-seconds 30 --churn-outage-seconds 60 --churn-count 2"
  "priorities|--scenario priorities --jobs 200"
  "pipeline|--scenario pipeline --jobs $(n 1000)"
  "queues1|--scenario local --jobs $(n 1000) --queues 1"
  "queues10|--scenario local --jobs $(n 1000) --queues 10"
)
if [[ "$quick" != "--quick" ]]; then
  runs+=("local10k|--scenario local --jobs 10000" "density|--scenario density --jobs 5000")
fi
budgets=("default|--api-qps 50 --api-burst 100" "tuned|--api-qps 1000 --api-burst 2000")

for run in "${runs[@]}"; do
  name="${run%%|*}"
  args="${run#*|}"
  for budget in "${budgets[@]}"; do
    b="${budget%%|*}"
    # shellcheck disable=SC2086 # word splitting of the argument lists is wanted
    if ! "$bench" $args ${budget#*|} --json "$out/$name-$b.json" > "$out/$name-$b.log" 2>&1; then
      echo "[bench-all] $name at the $b budget FAILED (see $out/$name-$b.log)" >&2
    else
      echo "[bench-all] $name at the $b budget done" >&2
    fi
  done
done
for finished in 10000 100000; do
  "$bench" --scenario schedpass --finished "$finished" > "$out/schedpass-$finished.log" 2>&1
  "$bench" --scenario schedpass --finished "$finished" --queues 100 \
    > "$out/schedpass-$finished-queues100.log" 2>&1
done
python3 hack/bench-table.py "$out" > "$out/tables.md"
echo "[bench-all] tables in $out/tables.md" >&2
