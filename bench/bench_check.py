"""In-process micro-benchmark of ``engine.graph.check`` on one core.

    python bench/bench_check.py --dataset bench/data/medium [--json] [--seconds 2] [--cpu 0]

Reads ``tuples.jsonl`` (``{"object","relation","user"}`` per line) and ``checks.jsonl``
(``{"object","relation","user","allowed"}`` per line) from the dataset directory (written by
``bench/dataset.py``) and reports:

* tuples, parse and load seconds (``StoreGraph.load`` over parsed rows, pure Python time);
* bytes per tuple: memory the built index keeps, measured with ``tracemalloc`` (in a fresh
  interpreter) while the file is streamed into the graph (so the object/relation/user strings the index retains are
  counted; transient parsing garbage is not), divided by the tuple count; peak too;
* checks/s: every check of the file, repeated until at least ``--seconds`` have passed,
  timed with ``time.perf_counter`` around whole passes;
* p50 / p99 / p99.9 / max latency per check in microseconds, each check timed on its own
  with ``time.perf_counter_ns`` (timer overhead shown separately, not subtracted);
* the same figures for the cold pass: the first run over the checks on a freshly loaded
  graph, before the per-node walk memo (see ``engine/graph/search.py``) has been filled;
* allowed ratio, resolution mix, mean nodes visited, memo size.

The loaded graph is moved out of the collected generations with ``gc.freeze()`` before the
timed runs (``--no-gc-freeze`` to skip), as a long-running engine should do after loading.

Every result is compared with the file's ``allowed``; any mismatch (or a
``ResolutionTooComplex``) is printed and the script exits with status 1.
Targets (issue): >= 200,000 checks/s, p99 < 50 us, < 300 bytes per tuple.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _engine_root(argv: list[str]) -> str:
    """``--engine-root DIR`` (read before the import below): whose ``engine.graph`` to measure,
    so an old checkout and a new one can be compared A/B in the same run."""
    for i, a in enumerate(argv):
        if a == "--engine-root" and i + 1 < len(argv):
            return str(Path(argv[i + 1]).resolve())
        if a.startswith("--engine-root="):
            return str(Path(a.split("=", 1)[1]).resolve())
    return str(Path(__file__).resolve().parents[1])


sys.path.insert(0, _engine_root(sys.argv))

from engine.graph import CheckResult, ResolutionTooComplex, StoreGraph, check  # noqa: E402

try:
    import orjson

    _loads: Any = orjson.loads
except ImportError:  # pragma: no cover - orjson is a project dependency
    _loads = json.loads

TARGET_CHECKS_PER_S = 200_000
TARGET_P99_US = 50.0
TARGET_BYTES_PER_TUPLE = 300.0

Row = tuple[str, str, str]
Check = tuple[str, str, str, bool]


def iter_tuples(path: Path) -> Iterator[Row]:
    """Stream ``(object, relation, user)`` rows from a JSON-lines file."""
    loads = _loads
    with open(path, "rb") as fh:
        for line in fh:
            if line.strip():
                d = loads(line)
                yield d["object"], d["relation"], d["user"]


def read_checks(path: Path) -> list[Check]:
    loads = _loads
    out: list[Check] = []
    with open(path, "rb") as fh:
        for line in fh:
            if line.strip():
                d = loads(line)
                out.append((d["object"], d["relation"], d["user"], bool(d["allowed"])))
    return out


def measure_memory(path: Path) -> tuple[int, int, int]:
    """(tuples, bytes retained by the built graph, peak bytes while building)."""
    gc.collect()
    tracemalloc.start()
    graph = StoreGraph()
    graph.load(iter_tuples(path))
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return len(graph), current, peak


def verify(
    graph: StoreGraph, checks: list[Check]
) -> tuple[list[CheckResult], list[str], list[float]]:
    """Run every check once on the fresh graph (the cold pass), timing each one (us)."""
    results: list[CheckResult] = []
    errors: list[str] = []
    lat: list[float] = []
    ns = time.perf_counter_ns
    for o, r, u, want in checks:
        t0 = ns()
        try:
            res = check(graph, object=o, relation=r, user=u)
        except ResolutionTooComplex as exc:
            errors.append(f"{o}#{r}@{u}: ResolutionTooComplex({exc.max_depth}), want {want}")
            continue
        lat.append((ns() - t0) / 1000)
        results.append(res)
        if res.allowed is not want:
            errors.append(f"{o}#{r}@{u}: allowed={res.allowed}, want {want} ({res})")
    return results, errors, lat


def throughput(
    graph: StoreGraph, checks: list[Check], seconds: float
) -> tuple[float, float, int]:
    """(checks per wall second, checks per CPU second, checks done) over whole passes of the
    check list, repeated >= ``seconds`` of CPU time. CPU time (``time.process_time``) is the
    steadier figure on a shared machine: time spent preempted is not counted."""
    args = [(o, r, u) for o, r, u, _ in checks]
    chk = check
    g = graph
    done = 0
    elapsed = cpu = 0.0
    perf = time.perf_counter
    proc = time.process_time
    while cpu < seconds:
        t0, c0 = perf(), proc()
        for o, r, u in args:
            chk(g, object=o, relation=r, user=u)
        cpu += proc() - c0
        elapsed += perf() - t0
        done += len(args)
    return done / elapsed, done / cpu, done


def latencies(
    graph: StoreGraph, checks: list[Check], sample: int, passes: int = 1
) -> tuple[list[float], float]:
    """Per-check latency in microseconds over up to ``sample`` checks: a warm-up pass, then
    ``passes`` timed passes; each check keeps its fastest pass (with ``passes`` > 1 this drops
    the time a shared machine's scheduler took away, which one pass would count)."""
    args = [(o, r, u) for o, r, u, _ in checks[:sample]]
    chk = check
    g = graph
    ns = time.perf_counter_ns
    for o, r, u in args:  # warms caches
        chk(g, object=o, relation=r, user=u)
    out: list[int] = [1 << 62] * len(args)
    for _ in range(max(1, passes)):
        i = 0
        for o, r, u in args:
            t0 = ns()
            chk(g, object=o, relation=r, user=u)
            t = ns() - t0
            if t < out[i]:
                out[i] = t
            i += 1
    overhead = []
    for _ in range(10_000):
        t0 = ns()
        overhead.append(ns() - t0)
    return [x / 1000 for x in out], statistics.median(overhead) / 1000


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", type=Path, required=True, help="directory with the .jsonl files")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    ap.add_argument("--seconds", type=float, default=2.0, help="minimum throughput run time")
    ap.add_argument("--sample", type=int, default=20_000, help="checks timed one by one")
    ap.add_argument("--latency-passes", type=int, default=1,
                    help="timed passes per check for the latencies; each check keeps its fastest")
    ap.add_argument("--engine-root", type=Path, default=None,
                    help="checkout whose engine.graph is measured (default: this one)")
    ap.add_argument("--cpu", type=int, default=None, help="pin the process to this CPU")
    ap.add_argument("--skip-memory", action="store_true", help="skip the tracemalloc pass")
    ap.add_argument("--no-gc-freeze", action="store_true",
                    help="leave the loaded graph in the collected generations")
    ap.add_argument("--memory-only", action="store_true",
                    help="print [tuples, bytes retained, peak bytes] as JSON and stop")
    args = ap.parse_args(argv)
    if args.memory_only:
        print(json.dumps(measure_memory(args.dataset / "tuples.jsonl")))
        return 0

    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    tuples_path = args.dataset / "tuples.jsonl"
    checks_path = args.dataset / "checks.jsonl"

    t0 = time.perf_counter()
    rows = list(iter_tuples(tuples_path))
    t1 = time.perf_counter()
    graph = StoreGraph()
    graph.load(rows)
    t2 = time.perf_counter()
    n_rows = len(rows)
    del rows
    checks = read_checks(checks_path)

    results, errors, cold = verify(graph, checks)
    if errors:
        for line in errors[:20]:
            print("MISMATCH", line, file=sys.stderr)
        print(f"{len(errors)} of {len(checks)} checks disagree with {checks_path}",
              file=sys.stderr)
        return 1

    if not args.no_gc_freeze:
        gc.collect()
        gc.freeze()  # what the engine should do after loading: the index is long-lived
    rate, cpu_rate, done = throughput(graph, checks, args.seconds)
    lat, timer_us = latencies(graph, checks, args.sample, args.latency_passes)
    memo_walks = len(graph._memo)
    memo_nodes = sum(len(nodes) for nodes, _ in graph._memo.values())
    memo_bytes = sys.getsizeof(graph._memo) + sum(
        sys.getsizeof(entry) + sys.getsizeof(entry[0]) for entry in graph._memo.values())

    mem_tuples = mem_bytes = mem_peak = 0
    if not args.skip_memory:
        # In a fresh interpreter: the index interns its strings in the interpreter's table, so
        # a second build in this process would find that table grown (and count less) or
        # dotted with the first build's deleted entries (and count more).
        cmd = [sys.executable, __file__, "--dataset", str(args.dataset), "--memory-only"]
        if args.engine_root is not None:
            cmd += ["--engine-root", str(args.engine_root)]
        mem_tuples, mem_bytes, mem_peak = json.loads(subprocess.check_output(cmd))

    n_allowed = sum(1 for r in results if r.allowed)
    mix: dict[str, int] = {}
    for r in results:
        mix[r.resolution] = mix.get(r.resolution, 0) + 1
    report: dict[str, Any] = {
        "dataset": str(args.dataset),
        "python": sys.version.split()[0],
        "rows_in_file": n_rows,
        "tuples": mem_tuples or n_rows,
        "parse_seconds": round(t1 - t0, 3),
        "load_seconds": round(t2 - t1, 3),
        "bytes_per_tuple": round(mem_bytes / mem_tuples, 1) if mem_tuples else None,
        "peak_bytes_per_tuple": round(mem_peak / mem_tuples, 1) if mem_tuples else None,
        "checks": len(checks),
        "checks_timed": done,
        "checks_per_second": round(rate),
        "checks_per_cpu_second": round(cpu_rate),
        "latency_passes": args.latency_passes,
        "p50_us": round(pct(lat, 0.50), 2),
        "p99_us": round(pct(lat, 0.99), 2),
        "p999_us": round(pct(lat, 0.999), 2),
        "max_us": round(max(lat), 2),
        "timer_overhead_us": round(timer_us, 3),
        "cold_checks_per_second": round(len(cold) / (sum(cold) / 1e6)) if cold else 0,
        "cold_p50_us": round(pct(cold, 0.50), 2),
        "cold_p99_us": round(pct(cold, 0.99), 2),
        "memo_walks": memo_walks,
        "memo_nodes": memo_nodes,
        "memo_bytes_per_tuple": round(memo_bytes / n_rows, 1) if n_rows else 0.0,
        "gc_frozen": not args.no_gc_freeze,
        "allowed_ratio": round(n_allowed / len(results), 4) if results else 0.0,
        "resolutions": mix,
        "mean_dispatch_count": round(statistics.fmean(r.dispatch_count for r in results), 2),
        "max_dispatch_count": max(r.dispatch_count for r in results),
        "mismatches": 0,
    }
    if args.json:
        print(json.dumps(report, sort_keys=False))
        return 0

    def row(name: str, value: object, target: str = "") -> None:
        print(f"  {name:<24} {value!s:>14}  {target}")

    def ok(cond: bool) -> str:
        return "ok" if cond else "MISSED"

    print(f"check benchmark: {report['dataset']} (python {report['python']}, one core)")
    row("tuples", f"{report['tuples']:,}")
    row("parse s", report["parse_seconds"])
    row("load s (Python)", report["load_seconds"])
    if report["bytes_per_tuple"] is not None:
        bpt = report["bytes_per_tuple"]
        row("bytes/tuple", bpt, f"target < {TARGET_BYTES_PER_TUPLE:.0f}: "
            f"{ok(bpt < TARGET_BYTES_PER_TUPLE)}")
        row("peak bytes/tuple", report["peak_bytes_per_tuple"])
    row("checks", f"{report['checks']:,}")
    row("checks/s", f"{report['checks_per_second']:,}",
        f"target >= {TARGET_CHECKS_PER_S:,}: {ok(rate >= TARGET_CHECKS_PER_S)}")
    row("checks/CPU s", f"{report['checks_per_cpu_second']:,}", "(process CPU time)")
    row("p50 us", report["p50_us"], f"(fastest of {args.latency_passes} pass(es) per check)")
    row("p99 us", report["p99_us"],
        f"target < {TARGET_P99_US:.0f}: {ok(report['p99_us'] < TARGET_P99_US)}")
    row("p99.9 us", report["p999_us"])
    row("max us", report["max_us"])
    row("timer overhead us", report["timer_overhead_us"], "(included in the latencies)")
    row("cold pass checks/s", f"{report['cold_checks_per_second']:,}",
        "(first pass, fresh graph, empty memo)")
    row("cold pass p50/p99 us", f"{report['cold_p50_us']}/{report['cold_p99_us']}")
    row("memo walks/nodes", f"{memo_walks}/{memo_nodes}",
        f"(~{report['memo_bytes_per_tuple']} bytes/tuple at run time, not in bytes/tuple)")
    row("allowed ratio", report["allowed_ratio"])
    row("resolutions", ", ".join(f"{k}={v}" for k, v in sorted(mix.items())))
    row("mean/max nodes visited",
        f"{report['mean_dispatch_count']}/{report['max_dispatch_count']}")
    row("mismatches", 0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
