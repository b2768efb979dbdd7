#!/usr/bin/env bash
# A/B of the check paths in one run: the engine of checkout A, then of checkout B, alternated
# ROUNDS times, each measured by bench_http.py (single checks at c=16 and 64, batch checks of 100
# at c=16) against the same store, with the engine's own CPU accounted.
#
#   bench/ab_engine.sh DIR_A DIR_B [ROUNDS]
#
# Each DIR is a checkout with its own .venv (make test makes one). The store comes from the
# dataset's store.json (bench/load.py) in the database of $DATABASE_URL; the key is
# $AUTHIO_API_KEY. JSON results go to ${AB_OUT:-/tmp/ab_engine}/<label>-<round>-<mode>.json and a
# summary line per run to standard output.
set -euo pipefail
a=$(cd "$1" && pwd); b=$(cd "$2" && pwd); rounds=${3:-2}
here=$(cd "$(dirname "$0")" && pwd)
dataset=${AB_DATASET:-$here/data/medium}
out=${AB_OUT:-/tmp/ab_engine}; mkdir -p "$out"
port=${AB_PORT:-8181}
: "${DATABASE_URL:?the benchmark database}" "${AUTHIO_API_KEY:?a key of the project of the store}"

run() {  # label dir round
  local label=$1 dir=$2 round=$3
  # SERVICE_ENGINE_WORKERS=1: one engine process as before issue 24 (a checkout before it
  # ignores the variable), so --server-pid measures the whole server.
  SERVICE_ENGINE_PORT=$port OTEL_EXPORTER=none SERVICE_LOG_LEVEL=WARNING SERVICE_ENGINE_WORKERS=1 \
    "$dir/.venv/bin/authio" serve engine >"$out/$label-$round.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do
    curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.2
  done
  for mode in single batch; do
    local extra=(--concurrency 16,64)
    [ "$mode" = batch ] && extra=(--batch-size 100 --concurrency 16)
    "$here/../.venv/bin/python" "$here/bench_http.py" --mode "$mode" --dataset "$dataset" \
      --base-url "http://127.0.0.1:$port" --server-pid "$pid" --duration "${AB_DURATION:-8}" --warmup 2 \
      "${extra[@]}" --json "$out/$label-$round-$mode.json" >/dev/null
    "$here/../.venv/bin/python" - "$out/$label-$round-$mode.json" "$label" "$round" "$mode" <<'EOF'
import json, sys
path, label, rnd, mode = sys.argv[1:]
for lv in json.load(open(path))["levels"]:
    lat = lv["latency_ms"]
    print(f"{label} round {rnd} {mode:6} c={lv['concurrency']:>2}: "
          f"{lv['requests_per_s']:8,.0f} req/s {lv['checks_per_s']:9,.0f} checks/s  "
          f"p50 {lat['p50']:.2f} p99 {lat['p99']:.2f} ms  server {lv['server_cpu_cores']:.2f} "
          f"other {lv['other_cpu_cores']:.2f} cores  errors {lv['errors']} "
          f"mismatches {lv['mismatches']}")
EOF
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

for round in $(seq "$rounds"); do
  run A "$a" "$round"
  run B "$b" "$round"
done
