#!/usr/bin/env bash
# The risk engine's cost in one run: bench_identity.py's sign-ins (magic-link verify to tokens)
# and refreshes with SERVICE_RISK_ENGINE=on, then off, alternated ROUNDS times against the same
# database, each round with fresh servers (issue 19: the evaluation adds at most 15% to a
# sign-in's server CPU).
#
#   bench/ab_risk.sh [ROUNDS] [CONCURRENCY]
#
# ROUNDS defaults to 3, CONCURRENCY to 16. Extra bench_identity.py options go in
# $AB_IDENTITY_ARGS (e.g. "--server-processes 1 --duration 6"). JSON results go to
# ${AB_OUT:-/tmp/ab_risk}/<on|off>-<round>.json and a line per run to standard output:
# requests/s and server CPU per request for each workload.
set -euo pipefail
rounds=${1:-3}; concurrency=${2:-16}
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-$here/../.venv/bin/python}
out=${AB_OUT:-/tmp/ab_risk}; mkdir -p "$out"
for round in $(seq "$rounds"); do
  for side in on off; do
    # shellcheck disable=SC2086  # the extra options are words
    "$py" "$here/bench_identity.py" --server-env "SERVICE_RISK_ENGINE=$side" \
      --concurrency "$concurrency" --users 20000 ${AB_IDENTITY_ARGS:-} \
      --json "$out/$side-$round.json" >/dev/null 2>"$out/$side-$round.log"
    "$py" - "$out/$side-$round.json" "$side" "$round" <<'EOF'
import json, sys
path, side, rnd = sys.argv[1:]
for r in json.load(open(path))["levels"]:
    print(f"risk {side:3} round {rnd} {r['workload']:7} c={r['concurrency']:>2}: "
          f"{r['requests_per_s']:7,.0f} req/s, server {r.get('server_cpu_us_per_request', 0):6,.0f} us/req, "
          f"PostgreSQL {r.get('pg_cpu_us_per_request', 0):6,.0f} us/req, p99 {r['latency_ms']['p99']:.1f} ms, "
          f"errors {r['errors']}, other {r.get('other_cpu_cores', 0):.2f} cores")
EOF
  done
done
