"""Importing a 100,000-user Auth0 export with ``authio import`` (issue 22).

    python bench/bench_import.py [--users 100000] [--rate 2000] [--memory-sizes 10000,50000]
                                 [--profile] [--json PATH]

Target: the 100,000-user export imported at >= 1,000 users/s with ``--rate-limit-rps 2000``;
the CLI's memory flat in the file's size (it streams).

1. A scratch database ``authio_bench_import`` (recreated, migrated) and one ``authio serve
   control-plane`` (``bench_identity``'s helpers; its outbox delivers the enrollment messages
   to the console sink, i.e. its log file); a project bootstrapped (full-access key).
2. The files written by ``tests/data/imports/auth0/make_large.py`` into a temporary directory
   (``--users`` records, and one per ``--memory-sizes``); the 100,000-user file's SHA-256
   checked against ``large.sha256``.
3. ``authio import auth0 --file F --rate-limit-rps R`` run as a subprocess (``AUTHIO_BASE_URL``,
   ``AUTHIO_API_KEY``; standard error a file, so plain progress lines), timed from spawn to
   exit. Every 0.2 s the CLI's RSS (psutil) and the server's CPU times are sampled; the CLI's
   exact peak RSS and CPU come from ``wait4``'s rusage (via a small launcher process). CPU in
   cores over the run: the server, PostgreSQL (backends of the scratch database, and its shared
   processes; sampled every second, so a backend the pool replaces keeps its share), the CLI,
   the whole machine, and ``other`` (the rest: other people's work); and the share of the run
   the server and the CLI spent runnable but waiting for a core (``/proc/PID/schedstat``).
   Before each run the bench waits up to ``--quiet-wait`` s for the machine to be idle.
   ``pg_stat_activity`` is sampled every 100 ms: the average number of the database's backends
   per wait event and statement.
   Checked: the last standard-output line is ``created 84000, existed 0, skipped 16000,
   errored 0`` (for 100,000 records; make_large's tally for other sizes) and the project holds
   that many users (SQL). The users' own ``created_at`` span gives the server-side rate
   (without the CLI's start and its counting pass over the file).
4. The enrollment messages (one per new user, queued by ``POST /v1/users``): how many the
   outbox had sent when the import ended, then the wait until none is pending (at most
   ``--outbox-wait`` s), so the second run does not share the box with the delivery.
5. A second run of the same file (the cursor was removed at the end: every user ``existed``),
   timed and sampled the same way.
6. Memory: the CLI on each ``--memory-sizes`` file, each into a fresh project (real runs), and
   ``--dry-run`` on every size (the parser and the deduplication alone); the peak RSS of each.
7. ``--profile``: one more real run of the ``--profile-users`` file into a fresh project while
   ``py-spy record`` samples the CLI and the server (``.venv/bin/pip install py-spy``); the top
   functions by own and inclusive time.

The server, PostgreSQL and the CLI share the machine's cores (two on the reference box).
Prints a JSON summary (``--json`` writes it too); the scratch database is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from bench_http import wait_for_quiet  # noqa: E402
from bench_identity import (  # noqa: E402  (the bench's own helpers, beside this file)
    analyse_stacks,
    authio_command,
    ensure_database,
    log,
    migrate,
    pg_cpu_delta,
    postgres_processes,
    pyspy_path,
    server_env,
    start_servers,
    with_db,
)

DB = "authio_bench_import"
TOKEN = "bench-import-" + secrets.token_hex(16)
TARGET_USERS_PER_SECOND = 1000.0
FIXTURES = ROOT / "tests" / "data" / "imports" / "auth0"
MAKE_LARGE = FIXTURES / "make_large.py"
LARGE_SHA256 = (FIXTURES / "large.sha256").read_text().split()[0]
SAMPLE_SECONDS = 0.2
QUIET_WAIT = [120.0]  # --quiet-wait
LAUNCHER = """
import json, os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, ru = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump({"maxrss_kib": ru.ru_maxrss, "cpu": ru.ru_utime + ru.ru_stime}, f)
sys.exit(os.waitstatus_to_exitcode(status))
"""
"""Runs the CLI as its child and writes the child's peak RSS and CPU from ``wait4``. The CLI is
not forked from the bench itself because Linux carries ``ru_maxrss`` across ``exec``: a child
forked from this (larger) process would report the bench's own peak; forked from this small
launcher it reports its own."""


# --------------------------------------------------------------------------- set-up


async def bootstrap(url: str, name: str) -> tuple[str, str]:
    """A fresh tenant and project; (project id, full-access key)."""
    async with aiohttp.ClientSession() as http, http.post(
            url + "/v1/bootstrap", headers={"X-Service-Bootstrap-Token": TOKEN},
            json={"tenant_name": "bench import", "project_name": name,
                  "environment": "bench"}) as r:
        doc = await r.json()
        if r.status != 201:
            raise RuntimeError(f"bootstrap failed: {r.status} {doc}")
        return doc["project"]["id"], doc["api_key"]["secret"]


def make_file(n: int, directory: Path) -> tuple[Path, dict[str, int]]:
    """make_large.py's file of ``n`` users and its expected first-run tally."""
    path = directory / f"auth0-{n}.ndjson"
    out = subprocess.run([sys.executable, str(MAKE_LARGE), "-n", str(n), "-o", str(path)],
                         check=True, capture_output=True, text=True).stdout
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if n == 100_000 and digest != LARGE_SHA256:
        raise SystemExit(f"{path}: sha256 {digest}, large.sha256 says {LARGE_SHA256}")
    tally = json.loads(out.strip().splitlines()[-1])["first_run"]
    return path, tally


def tally_line(t: dict[str, int]) -> str:
    return (f"created {t['created']}, existed {t['existed']}, skipped {t['skipped']}, "
            f"errored {t['errored']}")


# --------------------------------------------------------------------------- one CLI run


class Activity(threading.Thread):
    """``pg_stat_activity`` of the scratch database sampled every 100 ms while the CLI runs:
    for each client backend, what it waits on (``running`` when nothing) and the start of its
    statement; reported as the average number of backends in each (wait, statement) pair."""

    def __init__(self, db_url: str) -> None:
        super().__init__(daemon=True)
        self._db_url, self._done = db_url, threading.Event()
        self.samples, self.seen = 0, Counter[tuple[str, str]]()

    def run(self) -> None:
        asyncio.run(self._sample())

    async def _sample(self) -> None:
        conn = await asyncpg.connect(self._db_url)
        try:
            while not self._done.is_set():
                rows = await conn.fetch(
                    """SELECT state, wait_event_type, wait_event, left(query, 60) AS q
                       FROM pg_stat_activity WHERE datname = current_database()
                         AND backend_type = 'client backend' AND pid <> pg_backend_pid()""")
                self.samples += 1
                for r in rows:
                    if r["state"] != "active":
                        what = "idle in transaction" if r["state"] == "idle in transaction" \
                            else "idle"
                        self.seen[(what, "")] += 1
                        continue
                    wait = f"{r['wait_event_type']}:{r['wait_event']}" \
                        if r["wait_event_type"] else "running"
                    self.seen[(wait, " ".join(r["q"].split())[:50])] += 1
                await asyncio.sleep(0.1)
        finally:
            await conn.close()

    def stop(self) -> dict[str, Any]:
        self._done.set()
        self.join(timeout=10)
        n = max(1, self.samples)
        return {"samples": self.samples, "backends_by_state": [
            (wait, query, round(count / n, 2)) for (wait, query), count in self.seen.most_common(12)]}



def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (every core; idle and iowait excluded, guest
    time already in user time)."""
    t = psutil.cpu_times()
    return float(sum(getattr(t, name, 0.0) for name in
                     ("user", "nice", "system", "irq", "softirq", "steal")))


def run_queue_wait(pid: int) -> float:
    """Seconds ``pid`` has spent runnable but waiting for a CPU (``/proc/PID/schedstat``)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


def proc_cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def run_cli(file: Path, rate: float, env: dict[str, str], server_pid: int, *, dry_run: bool,
            work: Path, label: str, profile_dir: Path | None = None,
            db_url: str | None = None) -> dict[str, Any]:
    """Run ``authio import auth0`` on ``file``; its figures (module docstring, step 3)."""
    quiet = wait_for_quiet(QUIET_WAIT[0]) if QUIET_WAIT[0] > 0 else None
    cmd = [*authio_command(), "import", "auth0", "--file", str(file), "--rate-limit-rps", str(rate)]
    if dry_run:
        cmd.append("--dry-run")
    server = psutil.Process(server_pid)
    out_path, err_path = work / f"{label}.stdout", work / f"{label}.stderr"
    usage_path = work / f"{label}.rusage"
    pg_before = postgres_processes(DB)
    server_before, busy_before = proc_cpu(server), machine_busy()
    server_waited = run_queue_wait(server_pid)
    cli_waited = 0.0
    activity = Activity(db_url) if db_url and not dry_run else None
    if activity is not None:
        activity.start()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        started = time.monotonic()
        launcher = subprocess.Popen([sys.executable, "-S", "-c", LAUNCHER, str(usage_path), *cmd],
                                    cwd=ROOT, env=env, stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL)
    cli_pid = None
    while cli_pid is None and launcher.poll() is None:
        with contextlib.suppress(psutil.Error):
            kids = psutil.Process(launcher.pid).children()
            cli_pid = kids[0].pid if kids else None
        time.sleep(0.005)
    spies: list[subprocess.Popen[bytes]] = []
    stacks: list[Path] = []
    if profile_dir is not None and cli_pid is not None:
        exe = pyspy_path()
        if exe is None:
            raise SystemExit("py-spy is missing: .venv/bin/pip install py-spy")
        profile_dir.mkdir(parents=True, exist_ok=True)
        for who, pid in (("cli", cli_pid), ("server", server_pid)):
            path = profile_dir / f"{label}-{who}.txt"
            stacks.append(path)
            spies.append(subprocess.Popen(
                [exe, "record", "-p", str(pid), "-r", "100", "--nonblocking", "--format", "raw",
                 "-o", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    peak_rss, samples = 0, []
    server_cpu = [(0.0, 0.0)]
    pg_seen = dict(pg_before)  # pid -> the last CPU seen: a backend that exits keeps its share
    tick = 0
    while launcher.poll() is None:
        with contextlib.suppress(psutil.Error, TypeError, OSError):
            rss = psutil.Process(cli_pid).memory_info().rss
            peak_rss = max(peak_rss, rss)
            samples.append((round(time.monotonic() - started, 1), rss))
            cli_waited = run_queue_wait(cli_pid)  # type: ignore[arg-type]
        server_cpu.append((time.monotonic() - started, proc_cpu(server) - server_before))
        tick += 1
        if tick % 5 == 0:
            pg_seen.update(postgres_processes(DB))
        time.sleep(SAMPLE_SECONDS)
    wall = time.monotonic() - started
    backends = activity.stop() if activity is not None else None
    usage = json.loads(usage_path.read_text())
    server_seconds = proc_cpu(server) - server_before
    server_waited = run_queue_wait(server_pid) - server_waited
    busy = machine_busy() - busy_before
    pg_seen.update(postgres_processes(DB))
    pg = pg_cpu_delta(pg_before, pg_seen, exclude=set())
    for spy in spies:  # py-spy stops by itself when the CLI ends; the server's needs a signal
        if spy.poll() is None:
            spy.send_signal(2)
        spy.wait(timeout=60)
    lines = out_path.read_text().splitlines()
    cli_seconds = usage["cpu"]
    # the busiest second of the server, from the 0.2 s samples
    busiest = max((b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(server_cpu, server_cpu[5:],
                                                                   strict=False)) \
        if len(server_cpu) > 5 else server_seconds / max(wall, 1e-9)
    result: dict[str, Any] = {
        "file": file.name, "dry_run": dry_run, "exit_status": launcher.returncode,
        "machine_quiet_before": quiet,
        "wall_seconds": round(wall, 2), "last_line": lines[-1] if lines else "",
        "cli_peak_rss_mb": round(peak_rss / 2**20, 1),
        "cli_maxrss_mb": round(usage["maxrss_kib"] / 1024, 1),
        "cli_cpu_cores": round(cli_seconds / wall, 2),
        "cli_cpu_seconds": round(cli_seconds, 2),
        "server_cpu_cores": round(server_seconds / wall, 2),
        "server_cpu_cores_busiest_second": round(busiest, 2),
        "server_runnable_waiting_share": round(server_waited / wall, 2),
        "cli_runnable_waiting_share": round(cli_waited / wall, 2),
        "postgres_cpu_cores": round(pg["bench"] / wall, 2),
        "postgres_shared_cpu_cores": round(pg["shared"] / wall, 2),
        "postgres_other_databases_cpu_cores": round(pg["other_db"] / wall, 2),
        "machine_busy_cores": round(busy / wall, 2),
        "other_cpu_cores": round((busy - server_seconds - cli_seconds - pg["bench"] - pg["shared"])
                                 / wall, 2),
        "rss_mb_over_time": " ".join(f"{t:g}s:{r / 2**20:.0f}"
                                     for t, r in samples[::max(1, len(samples) // 12)]),
        "stderr_tail": err_path.read_text().splitlines()[-3:],
    }
    if backends is not None:
        result["postgres_backends"] = backends
    if stacks:
        result["profile"] = {"cli": analyse_stacks([stacks[0]], top=25),
                             "server": analyse_stacks([stacks[1]], top=25)}
    return result


# --------------------------------------------------------------------------- SQL checks


async def project_figures(db_url: str, project_id: str) -> dict[str, Any]:
    conn = await asyncpg.connect(db_url)
    try:
        row = await conn.fetchrow(
            """SELECT count(*) AS users, extract(epoch FROM max(created_at) - min(created_at))
                      AS span FROM users WHERE project_id = $1""", project_id)
        per_10s = [r["n"] for r in await conn.fetch(
            """SELECT floor(extract(epoch FROM created_at) / 10) AS t, count(*) AS n FROM users
               WHERE project_id = $1 GROUP BY t ORDER BY t""", project_id)]
        messages = {r["status"]: r["n"] for r in await conn.fetch(
            """SELECT status, count(*) AS n FROM messages WHERE project_id = $1
               GROUP BY status""", project_id)}
    finally:
        await conn.close()
    span = float(row["span"] or 0.0)
    return {"users": row["users"], "created_span_seconds": round(span, 2),
            "server_side_users_per_second": round(row["users"] / span, 1) if span else None,
            "users_per_second_by_10s": [round(n / 10) for n in per_10s[1:-1]],
            "messages": messages}


async def wait_outbox(db_url: str, limit: float) -> dict[str, Any]:
    """Seconds until no message of the database is pending (at most ``limit``)."""
    conn = await asyncpg.connect(db_url)
    started = time.monotonic()
    try:
        while True:
            pending = await conn.fetchval("SELECT count(*) FROM messages WHERE status = 'pending'")
            waited = time.monotonic() - started
            if pending == 0 or waited > limit:
                return {"pending_left": pending, "waited_seconds": round(waited, 1)}
            await asyncio.sleep(1.0)
    finally:
        await conn.close()


# --------------------------------------------------------------------------- the bench


def cli_env(url: str, key: str) -> dict[str, str]:
    env = {**os.environ, "AUTHIO_BASE_URL": url, "AUTHIO_API_KEY": key, "PYTHONPATH": str(ROOT)}
    for name in ("AUTHIO_PROFILE", "FORCE_COLOR"):
        env.pop(name, None)
    return env


def per_user(run: dict[str, Any], users: int) -> None:
    """CPU milliseconds per user sent (created or existed), by process group."""
    run["cpu_ms_per_user"] = {
        name: round(run[key] * run["wall_seconds"] * 1000 / users, 3)
        for name, key in (("server", "server_cpu_cores"), ("postgres", "postgres_cpu_cores"),
                          ("postgres_shared", "postgres_shared_cpu_cores"),
                          ("cli", "cli_cpu_cores"), ("machine", "machine_busy_cores"))}


def check(run: dict[str, Any], expected: str, users: int | None, found: dict[str, Any] | None) -> None:
    run["expected_last_line"] = expected
    run["last_line_ok"] = run["last_line"] == expected
    if users is not None and found is not None:
        run["project_users_ok"] = found["users"] == users
    if not run["last_line_ok"] or run.get("project_users_ok") is False:
        log(f"CHECK FAILED: {run['last_line']!r} (expected {expected!r}); project {found}")


def bench(args: argparse.Namespace, url: str, server_pid: int, db_url: str,
          work: Path) -> dict[str, Any]:
    """Steps 2 to 7 of the module docstring against the running server; the JSON summary."""
    out: dict[str, Any] = {"users": args.users, "rate_limit_rps": args.rate,
                           "cores": os.cpu_count()}
    sizes = sorted({*args.memory_sizes, args.users})
    files: dict[int, tuple[Path, dict[str, int]]] = {}
    for n in sizes:
        files[n] = make_file(n, work)
        log(f"wrote {files[n][0]} ({files[n][0].stat().st_size / 2**20:.1f} MiB)")
    big, big_tally = files[args.users]
    out["file_mib"] = {n: round(p.stat().st_size / 2**20, 1) for n, (p, _) in files.items()}

    # the first run (every eligible user created) and the second (every one existed)
    project_id, key = asyncio.run(bootstrap(url, "import"))
    env = cli_env(url, key)
    log(f"first run: {args.users:,} records at --rate-limit-rps {args.rate:g}")
    first = run_cli(big, args.rate, env, server_pid, dry_run=False, work=work, label="first",
                    db_url=db_url)
    found = asyncio.run(project_figures(db_url, project_id))
    check(first, tally_line(big_tally), big_tally["created"], found)
    first["project"] = found
    first["users_per_second"] = round(big_tally["created"] / first["wall_seconds"], 1)
    per_user(first, big_tally["created"])
    first["records_per_second"] = round(args.users / first["wall_seconds"], 1)
    log(f"first run: {first['wall_seconds']} s, {first['users_per_second']} users/s; "
        f"{first['last_line']}")
    first["outbox_drain_after_run"] = asyncio.run(wait_outbox(db_url, args.outbox_wait))
    log(f"outbox: {first['outbox_drain_after_run']}")
    out["first_run"] = first

    log("second run: the same file (every user existed)")
    second = run_cli(big, args.rate, env, server_pid, dry_run=False, work=work, label="second",
                     db_url=db_url)
    again = {**big_tally, "created": 0, "existed": big_tally["created"]}
    check(second, tally_line(again), big_tally["created"],
          asyncio.run(project_figures(db_url, project_id)))
    second["users_per_second"] = round(big_tally["created"] / second["wall_seconds"], 1)
    per_user(second, big_tally["created"])
    second["records_per_second"] = round(args.users / second["wall_seconds"], 1)
    log(f"second run: {second['wall_seconds']} s, {second['users_per_second']} users/s; "
        f"{second['last_line']}")
    out["second_run"] = second

    # memory: real runs of the smaller files into fresh projects, dry runs of every size
    memory: dict[str, Any] = {"real": {args.users: first["cli_maxrss_mb"]}, "dry_run": {}}
    for n in args.memory_sizes:
        if n == args.users:
            continue
        path, tally = files[n]
        pid_n, key_n = asyncio.run(bootstrap(url, f"import {n}"))
        log(f"memory: real run of {n:,} records")
        r = run_cli(path, args.rate, cli_env(url, key_n), server_pid, dry_run=False, work=work,
                    label=f"real-{n}", db_url=db_url)
        check(r, tally_line(tally), tally["created"], asyncio.run(project_figures(db_url, pid_n)))
        r["users_per_second"] = round(tally["created"] / r["wall_seconds"], 1)
        out[f"run_{n}"] = r
        memory["real"][n] = r["cli_maxrss_mb"]
        asyncio.run(wait_outbox(db_url, args.outbox_wait))
    for n in sizes:
        path, tally = files[n]
        log(f"memory: dry run of {n:,} records")
        r = run_cli(path, args.rate, env, server_pid, dry_run=True, work=work, label=f"dry-{n}")
        check(r, tally_line(tally), None, None)
        out[f"dry_run_{n}"] = {k: r[k] for k in ("wall_seconds", "cli_maxrss_mb",
                                                 "cli_peak_rss_mb", "cli_cpu_seconds",
                                                 "last_line_ok")}
        memory["dry_run"][n] = r["cli_maxrss_mb"]
    lo, hi = min(sizes), max(sizes)
    growth = {kind: round((m[hi] - m[lo]) * 2**20 / (hi - lo), 1)
              for kind, m in memory.items() if lo in m and hi in m and hi > lo}
    memory["growth_bytes_per_record"] = growth
    memory["file_bytes_per_record"] = round(files[hi][0].stat().st_size / hi, 1)
    out["memory_peak_rss_mb"] = memory

    if args.profile:
        n = args.profile_users
        path, tally = files.get(n) or make_file(n, work)
        pid_p, key_p = asyncio.run(bootstrap(url, "import profile"))
        log(f"profile: real run of {n:,} records under py-spy")
        r = run_cli(path, args.rate, cli_env(url, key_p), server_pid, dry_run=False, work=work,
                    label=f"profile-{n}", profile_dir=Path(args.profile_dir),
                    db_url=db_url)
        check(r, tally_line(tally), tally["created"], asyncio.run(project_figures(db_url, pid_p)))
        r["users_per_second"] = round(tally["created"] / r["wall_seconds"], 1)
        out["profiled_run"] = r
    out["meets_target"] = first["users_per_second"] >= TARGET_USERS_PER_SECOND
    headline = {
        "users_per_second_first_run": first["users_per_second"],
        "users_per_second_second_run": second["users_per_second"],
        "wall_seconds_first_second": [first["wall_seconds"], second["wall_seconds"]],
        "server_cpu_cores_first_second": [first["server_cpu_cores"], second["server_cpu_cores"]],
        "cli_peak_rss_mb_by_records": memory["real"],
        "target_users_per_second": TARGET_USERS_PER_SECOND,
        "meets_target": out["meets_target"],
    }
    return {"headline": headline, **out}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--users", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--memory-sizes", default="10000,50000",
                    type=lambda s: [int(x) for x in s.split(",") if x])
    ap.add_argument("--outbox-wait", type=float, default=300.0,
                    help="most seconds to wait for the enrollment messages after a run")
    ap.add_argument("--quiet-wait", type=float, default=120.0,
                    help="before each run, wait up to this many seconds for the machine to be "
                         "idle (other people's tests); 0: do not wait")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-users", type=int, default=50_000)
    ap.add_argument("--profile-dir", default="/tmp/bench-import-profile")
    ap.add_argument("--keep-database", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    QUIET_WAIT[0] = args.quiet_wait
    asyncio.run(ensure_database(args.database_url, DB, recreate=True))
    db_url = with_db(args.database_url, DB)
    migrate(db_url)
    env = server_env(db_url, args.redis_url, "bench-import", TOKEN, None)
    [server] = start_servers(1, env, "bench-import")
    assert server.pid is not None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-import-") as work:
            out = bench(args, server.url, server.pid, db_url, Path(work))
    finally:
        server.stop()
        if not args.keep_database:
            asyncio.run(drop_database(args.database_url))
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


async def drop_database(admin_url: str) -> None:
    conn = await asyncpg.connect(with_db(admin_url, "postgres"))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
    finally:
        await conn.close()


if __name__ == "__main__":
    main()
