"""Edge session validation figures (issue 12): revocation lag, validate + check against a check
alone, forward auth against the bare aiohttp ceiling, all over HTTP against real processes.

    .venv/bin/python bench/bench_edge.py                  # ~2 min: 1 control plane, 1 engine
    .venv/bin/python bench/bench_edge.py --rounds 3 --duration 8 --json /tmp/edge.json

What it does:

1. **Set-up.** Database ``authio_bench_edge`` (re-created) on ``--database-url`` (default
   ``$DATABASE_URL``, else the local server), migrated; one ``authio serve control-plane`` and
   one ``authio serve engine`` on free ports, as in production (two processes, the engine hears
   revocations only through Redis); the bare aiohttp server of ``bench/bare_server.py``. A
   project, ``--sessions`` users signed in through the magic-link verify call (their access
   tokens), a store where every one of them may ``viewer`` ``document:plan`` through
   ``group:staff#member`` (one userset hop).
2. **Throughput** (closed loop, ``--concurrency`` workers on keep-alive connections in forked
   client processes, ``bench_http``'s raw client; ``--rounds`` rounds, the paths alternated in
   each): ``bare`` (the ceiling), ``check`` (``POST /v1/stores/{id}/check`` with the API key,
   the same question), ``validate`` (``GET /v1/edge/validate``), ``validate_check``
   (``GET /v1/edge/validate?store_id&object&relation``), ``forward_auth``
   (``GET /v1/edge/auth/app/page`` with ``X-Forwarded-*`` headers), each token repeated (cycled
   over the signed-in sessions, so every one is a cache hit after the first pass). Requests/s,
   p50/p99 and server CPU µs per request (``/proc`` of the server process), and the ratios the
   issue sets targets for: forward auth ≥ 70 % of the ceiling with p99 < 2 ms at c=16, validate +
   check ≤ 1.2 times a check (compared by server CPU per request and by throughput).
3. **Revocation lag** (``--revocations`` sessions, one at a time): the session is validated
   once at the engine (so its token is cached as verified), revoked through the control plane
   (``POST /v1/sessions/revoke``), and the engine asked again and again on one connection until
   it refuses with reason ``revoked``; the lag is from the revoke call's response to that first
   refusal (p50/p99/max). Target p99 < 100 ms.

4. **In process** (``--inprocess-seconds``; no HTTP): ``engine.sessions.SessionJudge`` with every
   project's keys read from the database (``common.jwks.PublishedKeys``) and a revocation
   mirror of ``--revoked`` sessions, judging the signed-in tokens one after another: ``fresh``
   (the verified-token cache emptied before each, so a signature verification each time) and
   ``repeated`` (the cache warm: a lookup, the key's publication test, the revocation test).
   Validations per CPU second and per-call p50/p99.

The client, servers, PostgreSQL and Redis share the machine; the report says how busy the rest
of the machine was (``other-cpu``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import multiprocessing as mp
import os
import secrets
import subprocess
import sys
import time
from array import array
from collections import Counter
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode, urlsplit

import orjson

HERE: Final = Path(__file__).resolve().parent
ROOT: Final = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from bench_audit import _die_with_parent, _free_port, stop_process  # noqa: E402
from bench_http import (  # noqa: E402
    RawConnection,
    latency_summary,
    pids_cpu_seconds,
    system_cpu,
)
from bench_identity import (  # noqa: E402
    DEFAULT_PG,
    DEFAULT_REDIS,
    Server,
    ensure_database,
    make_tokens,
    migrate,
    server_env,
    wait_ready,
    with_db,
)

from control_plane.magic_links.service import VERIFY_PATH  # noqa: E402

BENCH_DB: Final = "authio_bench_edge"
TAG: Final = "bench-edge"
OBJECT, RELATION, GROUP = "document:plan", "viewer", "group:staff"
PATHS: Final = ("bare", "check", "validate", "validate_check", "forward_auth")
TARGETS: Final = {"forward_auth_share": 0.70, "forward_auth_p99_ms": 2.0,
                  "validate_check_cost": 1.2, "revocation_lag_p99_ms": 100.0}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- set-up


def start(command: list[str], env: dict[str, str], name: str, port: int | None = None) -> Server:
    port = port or _free_port()
    log_path = Path(f"/tmp/{TAG}-{name}.log")
    env = {**env, "PORT": str(port)} if name == "control" else {
        **env, "SERVICE_ENGINE_PORT": str(port)}
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    return Server(proc, f"http://127.0.0.1:{port}", proc.pid, log_path)


async def call(http: Any, method: str, url: str, *, expect: int = 200, **kw: Any) -> Any:
    async with http.request(method, url, **kw) as r:
        doc = await r.json(content_type=None)
        if r.status != expect:
            raise RuntimeError(f"{method} {url}: {r.status} {doc}")
        return doc


def _claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return dict(orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


async def prepare(control: str, db_url: str, bootstrap_token: str,
                  n_sessions: int) -> dict[str, Any]:
    """Project, API key, ``n_sessions`` signed-in sessions, and the store they may view."""
    import aiohttp

    async with aiohttp.ClientSession() as http:
        doc = await call(http, "POST", control + "/v1/bootstrap", expect=201,
                         headers={"X-Service-Bootstrap-Token": bootstrap_token},
                         json={"tenant_name": "bench edge", "project_name": "bench edge",
                               "environment": "bench"})
        project_id, key = doc["project"]["id"], doc["api_key"]["secret"]
        auth = {"Authorization": f"Bearer {key}"}
        tokens = await make_tokens(db_url, project_id, n_sessions, TAG)
        q = urlencode({"project_id": project_id})
        sessions: list[dict[str, str]] = []
        sem = asyncio.Semaphore(8)

        async def sign_in(t: str) -> None:
            async with sem:
                d = await call(http, "POST", f"{control}{VERIFY_PATH}?{q}", json={"token": t})
                sessions.append({"access_token": d["access_token"],
                                 "user_id": _claims(d["access_token"])["sub"]})

        await asyncio.gather(*(sign_in(t) for t in tokens))
        store = await call(http, "POST", control + "/v1/stores", expect=201, headers=auth,
                           json={"name": "bench edge"})
        store_id = store["id"]
        writes = [{"object": OBJECT, "relation": RELATION, "user": f"{GROUP}#member"}]
        writes += [{"object": GROUP, "relation": "member", "user": f"user:{s['user_id']}"}
                   for s in sessions]
        revision = None
        for i in range(0, len(writes), 1000):
            w = await call(http, "POST", f"{control}/v1/stores/{store_id}/write", headers=auth,
                           json={"writes": writes[i:i + 1000]})
            revision = w.get("revision")
    return {"project_id": project_id, "api_key": key, "store_id": store_id,
            "sessions": sessions, "revision": revision}


def payloads(path: str, base: str, ctx: dict[str, Any], sessions: list[dict[str, str]]
             ) -> list[bytes]:
    """Pre-serialized HTTP/1.1 requests for one measured path."""
    host = urlsplit(base).netloc
    head = f"Host: {host}\r\nUser-Agent: authio-bench-edge/1\r\nAccept: application/json\r\n"
    if path == "bare":
        body = b'{"tuple_key":{"object":"document:1","relation":"viewer","user":"user:1"}}'
        return [(f"POST /v1/stores/store_bench/check HTTP/1.1\r\n{head}"
                 f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                 ).encode() + body]
    out: list[bytes] = []
    permission = urlencode({"store_id": ctx["store_id"], "object": OBJECT, "relation": RELATION})
    for s in sessions:
        bearer = f"Authorization: Bearer {s['access_token']}\r\n"
        if path == "check":
            body = orjson.dumps({"tuple_key": {"object": OBJECT, "relation": RELATION,
                                               "user": f"user:{s['user_id']}"}})
            out.append((f"POST /v1/stores/{ctx['store_id']}/check HTTP/1.1\r\n{head}"
                        f"Authorization: Bearer {ctx['api_key']}\r\n"
                        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                        ).encode() + body)
        elif path == "validate":
            out.append(f"GET /v1/edge/validate HTTP/1.1\r\n{head}{bearer}\r\n".encode())
        elif path == "validate_check":
            out.append(f"GET /v1/edge/validate?{permission} HTTP/1.1\r\n{head}{bearer}\r\n"
                       .encode())
        elif path == "forward_auth":
            out.append(("GET /v1/edge/auth/app/page HTTP/1.1\r\n"
                        f"{head}{bearer}X-Forwarded-Method: GET\r\n"
                        "X-Forwarded-Uri: /app/page?tab=1\r\nX-Forwarded-Host: app.example\r\n"
                        "X-Forwarded-Proto: https\r\n\r\n").encode())
    return out


# --------------------------------------------------------------------------- closed loop


async def _workers(host: str, port: int, reqs: list[bytes], n: int, base: int, total: int,
                   warmup: float, duration: float, barrier: Any) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    conns = [(await loop.create_connection(RawConnection, host, port))[1] for _ in range(n)]
    await loop.run_in_executor(None, barrier.wait)
    t_measure = time.perf_counter() + warmup
    t_end = t_measure + duration
    lat = array("d")
    statuses: Counter[int] = Counter()
    stride = max(1, len(reqs) // max(1, total))
    cpu0 = time.process_time()

    async def worker(w: int) -> None:
        conn, i, perf = conns[w], ((base + w) * stride) % len(reqs), time.perf_counter
        while (t0 := perf()) < t_end:
            status, _ = await conn.request(reqs[i])
            if t0 >= t_measure:
                lat.append(perf() - t0)
                statuses[status] += 1
            i = (i + 1) % len(reqs)

    await asyncio.gather(*(worker(w) for w in range(n)))
    for c in conns:
        if c.transport is not None:
            c.transport.close()
    return {"lat": lat.tobytes(), "statuses": dict(statuses),
            "cpu": time.process_time() - cpu0}


def _child(args: tuple[Any, ...], queue: Any) -> None:
    import uvloop

    barrier = args[-1]
    try:
        queue.put(uvloop.run(_workers(*args)))
    except BaseException as exc:
        barrier.abort()
        queue.put({"error": repr(exc)})


def closed_loop(base: str, reqs: list[bytes], concurrency: int, warmup: float, duration: float,
                server_pid: int, processes: int) -> dict[str, Any]:
    """Run ``concurrency`` closed-loop workers over ``processes`` forked clients; requests/s,
    latency, statuses, server CPU µs per request and the CPU used by the rest of the machine."""
    u = urlsplit(base)
    procs_n = max(1, min(processes, concurrency))
    ctx = mp.get_context("fork")
    barrier, queue = ctx.Barrier(procs_n + 1), ctx.Queue()
    split = [concurrency // procs_n + (k < concurrency % procs_n) for k in range(procs_n)]
    children, base_w = [], 0
    for n in split:
        p = ctx.Process(target=_child, args=((u.hostname, u.port, reqs, n, base_w, concurrency,
                                              warmup, duration, barrier), queue), daemon=True)
        p.start()
        children.append(p)
        base_w += n
    barrier.wait(timeout=60)
    time.sleep(warmup)
    s0, m0, t0 = pids_cpu_seconds([server_pid]), system_cpu(), time.perf_counter()
    time.sleep(duration)
    s1, m1, window = pids_cpu_seconds([server_pid]), system_cpu(), time.perf_counter() - t0
    results = [queue.get(timeout=warmup + duration + 60) for _ in children]
    for p in children:
        p.join(timeout=10)
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError(f"client failed: {errors[0]}")
    lat_arr = array("d")
    statuses: Counter[int] = Counter()
    for r in results:
        lat_arr.frombytes(r["lat"])
        statuses.update(r["statuses"])
    n = len(lat_arr)
    client = sum(r["cpu"] for r in results) / (warmup + duration)
    server = (s1 - s0) / window
    busy, total = m1[0] - m0[0], m1[1] - m0[1]
    ncpu = os.cpu_count() or 1
    return {"concurrency": concurrency, "requests_per_s": n / duration,
            "latency_ms": latency_summary(sorted(lat_arr)),
            "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "server_cpu_us_per_request": 1e6 * (s1 - s0) / max(1, n * window / duration),
            "server_cpu_cores": server, "client_cpu_cores": client,
            "other_cpu_cores": max(0.0, ncpu * busy / total - client - server) if total else None}


# --------------------------------------------------------------------------- revocation lag


async def revocation_lag(control: str, engine: str, sessions: list[dict[str, str]]
                         ) -> dict[str, Any]:
    """For each session: validate (cached), revoke at the control plane, then ask the engine on
    one keep-alive connection until it refuses with reason ``revoked``; milliseconds from the
    revoke call's response to that refusal."""
    import aiohttp

    u = urlsplit(engine)
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(RawConnection, u.hostname, u.port)
    lags: list[float] = []
    polls: list[int] = []
    async with aiohttp.ClientSession() as http:
        for s in sessions:
            req = (f"GET /v1/edge/validate HTTP/1.1\r\nHost: {u.netloc}\r\n"
                   f"Authorization: Bearer {s['access_token']}\r\n\r\n").encode()
            status, body = await conn.request(req)
            if status != 200:
                raise RuntimeError(f"validate before revoke: {status} {body!r}")
            await call(http, "POST", control + "/v1/sessions/revoke",
                       headers={"Authorization": f"Bearer {s['access_token']}"})
            answered = time.perf_counter()
            k = 0
            while True:
                status, body = await conn.request(req)
                k += 1
                if status == 401 and orjson.loads(body)["error"]["details"]["reason"] == "revoked":
                    break
                if status != 200 or time.perf_counter() - answered > 5:
                    raise RuntimeError(f"not refused within 5 s: {status} {body!r}")
            lags.append(time.perf_counter() - answered)
            polls.append(k)
    conn.transport.close()  # type: ignore[union-attr]
    summary = latency_summary(sorted(lags))
    return {"revocations": len(lags), "lag_ms": summary,
            "refused_at_first_ask": sum(1 for k in polls if k == 1)}


# --------------------------------------------------------------------------- in process


async def in_process(db_url: str, issuer: str, tokens: list[str], seconds: float,
                     revoked: int) -> dict[str, Any]:
    """Validations per CPU second through ``SessionJudge``, fresh and repeated tokens."""
    from common.db import create_pool
    from common.jwks import PublishedKeys
    from common.revocations import RevocationMirror
    from engine.sessions import SessionJudge

    pool = await create_pool(db_url, min_size=1, max_size=2)
    try:
        keys = PublishedKeys(pool)
        await keys.reload_all()
        mirror = RevocationMirror()
        far = time.time() + 3600
        mirror.merge((f"sess_{secrets.token_hex(13)}", far) for _ in range(revoked))
        out: dict[str, Any] = {"tokens": len(tokens), "revoked_in_mirror": revoked}
        for kind in ("fresh", "repeated"):
            cache: dict[str, Any] = {}
            judge = SessionJudge(cache, keys, issuer, mirror)
            for t in tokens:  # warm-up; fills the cache for "repeated"
                await judge.session(t)
            lat = array("d")
            n, i, perf = 0, 0, time.perf_counter
            cpu0, t_end = time.process_time(), perf() + seconds
            while perf() < t_end:
                for _ in range(200):
                    token = tokens[i]
                    i = (i + 1) % len(tokens)
                    if kind == "fresh":
                        cache.clear()
                    t0 = perf()
                    await judge.session(token)
                    lat.append(perf() - t0)
                n += 200
            cpu = time.process_time() - cpu0
            out[kind] = {"validations": n, "per_cpu_second": round(n / cpu),
                         "latency_us": {k: round(v * 1000, 2) for k, v in
                                        latency_summary(sorted(lat)).items()}}
            log(f"in process {kind:8}: {n / cpu:10,.0f} validations per CPU second, p50 "
                f"{out[kind]['latency_us']['p50']} µs p99 {out[kind]['latency_us']['p99']} µs")
        return out
    finally:
        await pool.close()


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_PG))
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS))
    ap.add_argument("--sessions", type=int, default=1000, help="signed-in sessions cycled")
    ap.add_argument("--revocations", type=int, default=200)
    ap.add_argument("--concurrency", default="16,64")
    ap.add_argument("--duration", type=float, default=6.0, help="seconds measured per run")
    ap.add_argument("--warmup", type=float, default=1.5)
    ap.add_argument("--rounds", type=int, default=2, help="rounds, the paths alternated")
    ap.add_argument("--processes", type=int, default=2, help="client processes")
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--inprocess-seconds", type=float, default=5.0,
                    help="seconds per in-process measurement (0: skip)")
    ap.add_argument("--revoked", type=int, default=10_000,
                    help="revoked sessions in the in-process mirror")
    ap.add_argument("--json", default=None, metavar="PATH")
    args = ap.parse_args(argv)

    db_url = with_db(args.database_url, BENCH_DB)
    asyncio.run(ensure_database(args.database_url, BENCH_DB, recreate=True))
    migrate(db_url)
    bootstrap = secrets.token_urlsafe(32)
    control_port = _free_port()
    env = {**server_env(db_url, args.redis_url, TAG, bootstrap, None),  # one issuer for both
           "SERVICE_BASE_URL": f"http://localhost:{control_port}"}
    authio = [str(Path(sys.executable).parent / "authio")]
    control = start([*authio, "serve", "control-plane"], env, "control", control_port)
    # One engine process (issue 24's default is one per core): the figures are per process.
    engine = start([*authio, "serve", "engine", "--workers", "1"], env, "engine")
    bare_port = _free_port()
    bare = start([sys.executable, str(HERE / "bare_server.py"), "--port", str(bare_port)], env,
                 "bare", bare_port)
    servers = [control, engine]
    try:
        asyncio.run(wait_ready(servers))
        log("servers ready; signing in sessions and writing the store")
        ctx = asyncio.run(prepare(control.url, db_url, bootstrap,
                                  args.sessions + args.revocations))
        cycled = ctx["sessions"][:args.sessions]
        to_revoke = ctx["sessions"][args.sessions:]
        time.sleep(1.0)  # the engine hears the store's writes
        runs: list[dict[str, Any]] = []
        paths = [p for p in args.paths.split(",") if p]
        for rnd in range(args.rounds):
            for conc in [int(c) for c in args.concurrency.split(",")]:
                for path in paths:
                    server = bare if path == "bare" else engine
                    reqs = payloads(path, server.url, ctx, cycled)
                    assert server.pid is not None
                    row = closed_loop(server.url, reqs, conc, args.warmup, args.duration,
                                      server.pid, args.processes)
                    row.update(path=path, round=rnd + 1)
                    runs.append(row)
                    lat = row["latency_ms"]
                    log(f"round {rnd + 1} c={conc:>2} {path:15} {row['requests_per_s']:8,.0f}"
                        f" req/s p50 {lat['p50']:.2f} ms p99 {lat['p99']:.2f} ms "
                        f"server {row['server_cpu_us_per_request']:6.1f} µs/req "
                        f"statuses {row['statuses']} other-cpu {row['other_cpu_cores']:.2f}")
        inproc = None
        if args.inprocess_seconds > 0:
            inproc = asyncio.run(in_process(db_url, env["SERVICE_BASE_URL"],
                                            [s["access_token"] for s in cycled],
                                            args.inprocess_seconds, args.revoked))
        log(f"revocation lag over {len(to_revoke)} revocations")
        lag = asyncio.run(revocation_lag(control.url, engine.url, to_revoke))
    finally:
        for s in (*servers, bare):
            if s.proc is not None:
                stop_process(s.proc)
    summary = summarize(runs, lag)
    summary["in_process"] = inproc
    print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    if args.json:
        Path(args.json).write_bytes(orjson.dumps({"runs": runs, "lag": lag, "in_process": inproc,
                                                  "summary": summary},
                                                 option=orjson.OPT_INDENT_2))
    return 0


def summarize(runs: list[dict[str, Any]], lag: dict[str, Any]) -> dict[str, Any]:
    """Best run per (path, concurrency) and the issue's ratios from the same rounds."""
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for r in runs:
        k = (r["path"], r["concurrency"])
        if k not in best or r["requests_per_s"] > best[k]["requests_per_s"]:
            best[k] = r
    out: dict[str, Any] = {"revocation_lag_ms": lag["lag_ms"], "targets": TARGETS, "levels": {}}
    for conc in sorted({c for _, c in best}):
        row = {p: {"requests_per_s": round(best[p, conc]["requests_per_s"]),
                   "p50_ms": round(best[p, conc]["latency_ms"]["p50"], 3),
                   "p99_ms": round(best[p, conc]["latency_ms"]["p99"], 3),
                   "server_cpu_us": round(best[p, conc]["server_cpu_us_per_request"], 1)}
               for p in PATHS if (p, conc) in best}
        if "bare" in row and "forward_auth" in row:
            row["forward_auth_share"] = round(row["forward_auth"]["requests_per_s"]
                                              / row["bare"]["requests_per_s"], 3)
        if "check" in row and "validate_check" in row:
            row["validate_check_cost_cpu"] = round(row["validate_check"]["server_cpu_us"]
                                                   / row["check"]["server_cpu_us"], 3)
            row["validate_check_cost_throughput"] = round(
                row["check"]["requests_per_s"] / row["validate_check"]["requests_per_s"], 3)
        out["levels"][str(conc)] = row
    return out


if __name__ == "__main__":
    sys.exit(main())
