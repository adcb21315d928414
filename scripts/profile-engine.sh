#!/usr/bin/env bash
# Where the engine's time goes, as a flame graph: perf (cpu-clock, DWARF
# call graphs) over the engine benchmark's replays, drawn by inferno.
#
#   scripts/profile-engine.sh BENCH_BINARY TITLE OUT.svg
#
# BENCH_BINARY: the engine benchmark with line tables, e.g. built by
#   CARGO_TARGET_DIR=target/prof CARGO_PROFILE_BENCH_DEBUG=line-tables-only \
#     cargo bench -p gpumem-agent --bench engine --no-run
# (run it in an older revision's tree, as `cargo xtask bench-engine` unpacks
# it under target/baseline, for the "before" picture). Only the replays are
# drawn: the recording's synthesis and the memory measurement are left out.
set -euo pipefail
if [ $# -ne 3 ]; then
  echo "usage: $0 BENCH_BINARY TITLE OUT.svg" >&2
  exit 2
fi
bench=$1 title=$2 out=$3
for tool in perf inferno-collapse-perf inferno-flamegraph; do
  command -v "$tool" > /dev/null || { echo "$0: $tool not found (perf: apt install linux-perf; inferno: cargo install inferno)" >&2; exit 1; }
done
data=$(mktemp --suffix=.perf)
trap 'rm -f "$data"' EXIT
perf record -q -F 1999 -e cpu-clock --call-graph dwarf,16384 -o "$data" -- \
  "$bench" engine --events 1000000 --rounds 3 --live 1000 --live-processes 10
perf script -i "$data" 2> /dev/null | inferno-collapse-perf | grep 'runtime::replay::replay' \
  | inferno-flamegraph --title "$title" --minwidth 0.5 > "$out"
echo "$out"
