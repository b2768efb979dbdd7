#!/usr/bin/env bash
# A/B of the in-process check benchmark in one run: bench_check.py against the engine.graph of
# checkout A, then of checkout B, alternated ROUNDS times (A and B need only their engine/ and
# common/ directories: `git archive <commit> engine common | tar -x -C DIR` makes one).
#
#   bench/ab_check.sh DIR_A DIR_B [ROUNDS] [DATASET]
#
# Prints one line per run: load seconds, bytes/tuple (tracemalloc, fresh interpreter), checks
# per wall and per CPU second, p50/p99/p99.9 (fastest of 5 timed passes per check, so time the
# scheduler took away is not counted) and the cold first pass.
set -euo pipefail
a=$(cd "$1" && pwd); b=$(cd "$2" && pwd); rounds=${3:-3}
here=$(cd "$(dirname "$0")" && pwd)
dataset=${4:-$here/data/medium}
py=${PYTHON:-$here/../.venv/bin/python}
for round in $(seq "$rounds"); do
  for side in A B; do
    root=$a; [ "$side" = B ] && root=$b
    "$py" "$here/bench_check.py" --dataset "$dataset" --engine-root "$root" --seconds "${AB_SECONDS:-3}" \
      --latency-passes 5 --json | "$py" -c '
import json, sys
d = json.load(sys.stdin)
print("{} round {}: load {load_seconds:.2f} s, {bytes_per_tuple} B/tuple, {checks_per_second:,} "
      "checks/s ({checks_per_cpu_second:,}/CPU s), p50 {p50_us} p99 {p99_us} p99.9 {p999_us} us, "
      "cold {cold_checks_per_second:,}/s p99 {cold_p99_us} us".format(*sys.argv[1:], **d))
' "$side" "$round"
  done
done
