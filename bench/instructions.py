"""Instructions per request, counted by valgrind (callgrind): A/B figures no busy machine can blur.

    python bench/instructions.py --dataset bench/data/medium [--targets check,auth]
        [--requests 1500] [--root DIR]
    python bench/instructions.py --targets graph-cold,graph-warm   # the check function alone

The same in-memory connections as ``bench_inproc_http.py`` (aiohttp's protocol fed raw request
bytes, every answer checked for 200) serve each target in a process of its own under
``valgrind --tool=callgrind --instr-atstart=no``; instrumentation is switched on only around the
measured requests (callgrind's client requests, from a four-line C library built here with
``cc`` into a temporary directory), so start-up, the store's load and the warm-up cost nothing.
The count is exact for a given binary and input, and the same whatever else the machine runs.

Time-dependent caches would still move it (aiohttp's ``Date`` once a second, the request id's
parts once a millisecond: under valgrind a millisecond passes every few requests), so the
measured process sees a clock advancing 0.1 ms per reading, as at 10k requests/s. Counts repeat
within ±0.3%. Instructions are not time (a cache miss costs more than an add): use them to
compare two versions of the same path, and ``bench_inproc_http.py`` or ``bench_ceiling.py`` for
the ratio to the bare handler.

Targets ``graph-cold`` and ``graph-warm`` count :func:`engine.graph.check` alone, per check, in
process: the dataset's tuples loaded into a ``StoreGraph`` (no database, no HTTP), then every
check of ``checks.jsonl`` once on the fresh graph (cold: walks, memo and answer cache filled as
they go) or a second time (warm: what repeated checks cost). Set iteration order follows the
strings' hashes, so these run with ``PYTHONHASHSEED=0``: the counts repeat exactly.

``--root DIR`` measures another checkout's code (its ``engine``/``common``; the dataset and this
script's harness stay). Environment as ``bench_inproc_http.py``: ``DATABASE_URL``,
``AUTHIO_API_KEY`` (a key of the store's project), ``EDGE_TOKEN`` (``edge_token.py``). Needs
valgrind with its headers (Debian: ``valgrind``) and a C compiler.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
_CLIENT_REQUESTS = """#include <valgrind/callgrind.h>
void start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void stop(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS; }
"""


def _fake_clock() -> None:
    """``time.time``/``time.time_ns`` advancing 0.1 ms per reading (see the module docstring)."""
    start, calls = time.time_ns(), [0]

    def time_ns() -> int:
        calls[0] += 1
        return start + calls[0] * 100_000

    time.time_ns = time_ns
    time.time = lambda: time_ns() / 1e9


def _measure_graph(target: str, dataset: Path, library: str) -> None:
    """In the process under valgrind: ``graph-cold`` or ``graph-warm`` (module docstring)."""
    # The measured checkout's graph first: bench_check puts this checkout on the path.
    from engine.graph import ResolutionTooComplex, StoreGraph, check  # noqa: I001
    from bench_check import iter_tuples, read_checks
    import gc

    graph = StoreGraph()
    graph.load(iter_tuples(dataset / "tuples.jsonl"))
    checks = read_checks(dataset / "checks.jsonl")
    gc.collect()
    gc.freeze()
    counter = ctypes.CDLL(library)
    for measured in ((False, True) if target == "graph-warm" else (True,)):
        if measured:
            counter.start()
        for o, r, u, want in checks:
            try:
                allowed = check(graph, object=o, relation=r, user=u).allowed
            except ResolutionTooComplex:
                allowed = None
            if allowed is not want:
                raise SystemExit(f"{target}: {o}#{r}@{u} answered {allowed}, want {want}")
        if measured:
            counter.stop()


async def _measure(target: str, dataset: Path, requests: int, library: str) -> None:
    """In the process under valgrind: serve ``target``, warm up, count ``requests``."""
    # The measured checkout's code first: bench_inproc_http puts this one's on the path.
    from common.http import EnvelopeRunner  # noqa: I001
    from common.settings import Settings
    from engine.app import create_engine_app
    from engine.appkeys import STORES

    from aiohttp import web
    from bare_server import make_app
    from bench_inproc_http import drive, target_requests

    store_id, check, forward = target_requests(dataset, 20_000)
    reqs = {"check": check, "bare-check": check, "auth": forward, "bare-auth": forward}[target]
    os.environ.setdefault("OTEL_EXPORTER", "none")
    if target.startswith("bare"):
        runner: web.AppRunner = web.AppRunner(make_app(), access_log=None)
        await runner.setup()
    else:
        runner = EnvelopeRunner(create_engine_app(Settings()), access_log=None)
        await runner.setup()
        registry = runner.app[STORES]
        while not registry.ready:  # noqa: ASYNC110 - start-up, not measured
            await asyncio.sleep(0.1)
        await registry.get(store_id)
    assert runner.server is not None
    await drive(runner.server, reqs, 3_000, 16)
    counter = ctypes.CDLL(library)
    _fake_clock()
    counter.start()
    _, errors = await drive(runner.server, reqs, requests, 16)
    counter.stop()
    await runner.cleanup()
    if errors:
        raise SystemExit(f"{target}: {errors} answers were not 200")


def _child(args: argparse.Namespace) -> int:
    sys.path[:0] = [str(Path(args.root).resolve()), str(HERE)]
    if args.child.startswith("graph-"):
        _measure_graph(args.child, args.dataset, args.library)
        return 0
    import uvloop

    uvloop.run(_measure(args.child, args.dataset, args.requests, args.library))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description="instructions per request (callgrind)")
    ap.add_argument("--dataset", type=Path, default=HERE / "data" / "medium")
    ap.add_argument("--targets", default="bare-check,check,bare-auth,auth")
    ap.add_argument("--requests", type=int, default=1_500)
    ap.add_argument("--root", default=str(HERE.parent), help="checkout whose code is measured")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--library", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(args)
    for tool in ("valgrind", "cc"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found (Debian: apt-get install valgrind gcc)")
    with tempfile.TemporaryDirectory(prefix="instructions_") as tmp:
        source, library = Path(tmp) / "counter.c", Path(tmp) / "counter.so"
        source.write_text(_CLIENT_REQUESTS)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", str(source), "-o", str(library)],
                       check=True)
        print(f"{'target':<11} {'instructions/request':>21}   ({args.requests} requests, "
              f"graph targets: per check of the dataset; code of {args.root})")
        checks = sum(1 for line in (args.dataset / "checks.jsonl").open("rb") if line.strip())
        for target in args.targets.split(","):
            out = Path(tmp) / f"{target}.out"
            subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                            f"--callgrind-out-file={out}", sys.executable, __file__,
                            "--child", target, "--library", str(library), "--root", args.root,
                            "--dataset", str(args.dataset), "--requests", str(args.requests)],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env={**os.environ, "PYTHONHASHSEED": "0"})
            total = sum(int(line.split()[1]) for dump in Path(tmp).glob(f"{target}.out*")
                        for line in dump.read_text().splitlines() if line.startswith("totals:"))
            per = checks if target.startswith("graph-") else args.requests
            print(f"{target:<11} {total / per:>21,.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
