"""Soak: the locust mixed profile (``MixedApplication``) at half the measured capacity for
``--minutes`` (default 30), the server's memory and the p99 sampled every 10 s, and a verdict.

    .venv/bin/python bench/soak.py                         # starts its own service; ~36 min
    .venv/bin/python bench/soak.py --minutes 2 --steps 4,8 --step-seconds 20   # a quick try
    .venv/bin/python bench/soak.py --host http://127.0.0.1:8080 --server-pid PID \\
        --bootstrap-token TOKEN                            # against a running service

1. **The service.** Without ``--host`` it starts ``authio serve`` (both apps in one process,
   as ``make run`` does) on a free port, on its own database ``authio_bench_locust`` (dropped,
   created anew and migrated, so every soak starts from the same empty log, on the server of
   ``--database-url``, default ``$DATABASE_URL`` or the local one) and Redis prefix, with
   ``OTEL_EXPORTER=none``, ``SERVICE_LOG_LEVEL=WARNING``,
   the console sink's printing sent to /dev/null (its mailbox still serves the links),
   ``SERVICE_TRUSTED_PROXIES=127.0.0.1`` and ``SERVICE_WEBHOOK_ALLOW_PRIVATE_URLS=true`` (see
   ``bench/locust_setup.py``); stopped at the end. With ``--host``, ``--server-pid`` names the
   process whose memory is watched (its children count too). No other service may run on that
   database: with the same key-encryption key its outbox worker delivers this one's sign-in
   links into its own mailbox; with another, it claims them and fails to open them.
2. **Set-up**: ``bench/locust_setup.py`` (a new project by the bootstrap token, the small
   dataset in a store, the passkey relying party, the probes); its state file (with the key) is
   ``bench/data/soak-state.json``.
3. **Capacity**: a step run, locust's closed loop (no think time) at each of ``--steps`` users
   (default 8,16,32) for ``--step-seconds`` (default 45) each, a locust process per step. A
   step's throughput is the mean of locust's requests/s over its second half; the capacity is
   the best step's. From the same step the soak learns requests per task (a sign-in is 3 to 5
   requests, a check one).
4. **Soak**: ``--users`` (default 24) simulated users, each holding ``AUTHIO_TASK_RATE`` tasks
   per second (locust's ``constant_throughput``) so that together they ask for
   ``--load`` (0.5) of the capacity, for ``--minutes``. Every ``--sample-seconds`` (10): the
   RSS of the server (the process and its children, ``psutil``), the CPU in cores of the
   server, of locust, of PostgreSQL's backends of the bench database, and of everything else on
   the machine (``/proc/stat``'s busy time less those: other people's work on a shared box),
   and locust's requests/s, p50/p99 of the last 10 s and failures so far
   (its ``--csv`` history, written every second; ``--csv-full-history``, without which locust
   writes the run's cumulative percentiles there, not the last 10 s).
5. **Outputs** in ``--out`` (default ``bench/results``): ``soak.csv`` (one row per sample),
   ``soak.png`` (``bench/plots.py``), ``soak.html`` and ``soak_stats*.csv`` (locust's),
   ``soak-steps.json`` and ``soak-steps.png`` (throughput and latency against users),
   ``soak-verdict.json``. The verdict: **memory** grows less than 10% from the 5-minute mark
   (the first sample at or after it) to the end (the mean of the last minute's samples); **no
   error** (locust counted no failure); **p99 steady**: the median of the 10-s p99s over the
   last 5 minutes is at most 1.5 times that of the 5 minutes after the 5-minute mark (for runs
   shorter than 15 minutes: the last third against the middle third). Exit status 0 when all
   three hold, 1 otherwise, 2 when the run itself could not be made.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import locust_setup  # noqa: E402
import plots  # noqa: E402
from bench_identity import (  # noqa: E402
    DEFAULT_PG,
    DEFAULT_REDIS,
    ensure_database,
    kms_key,
    migrate,
    postgres_processes,
    with_db,
)

DB = "authio_bench_locust"
LOCUST = str(Path(sys.executable).with_name("locust"))
AUTHIO = str(Path(sys.executable).with_name("authio"))
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The requests that start a task of MixedApplication (the others are a task's later steps or a
# flow's set-up): their count is the number of tasks.
TASK_STARTS = ("POST /v1/stores/[id]/check", "GET /v1/edge/auth", "GET /v1/edge/auth (+ check)",
               "POST /v1/sessions/refresh", "POST /v1/auth/passkey/login/options",
               "POST /v1/users", "GET /v1/audit/events.csv", "GET /v1/audit/events.jsonl")


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] soak: {text}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the service


@dataclass
class Service:
    url: str
    pid: int
    proc: subprocess.Popen[bytes] | None = None
    bootstrap_token: str | None = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(database_url: str, redis_url: str, log_path: Path) -> Service:
    """``authio serve`` on a free port on the bench database, ready (``/readyz``)."""
    asyncio.run(ensure_database(database_url, DB, recreate=True))  # fresh: the same start each run
    db_url = with_db(database_url, DB)
    migrate(db_url)
    port = free_port()
    token = secrets.token_urlsafe(32)
    env = {**os.environ, "DATABASE_URL": db_url, "REDIS_URL": redis_url, "PORT": str(port),
           "SERVICE_KMS_KEY": kms_key(), "SERVICE_BOOTSTRAP_TOKEN": token,
           "SERVICE_REDIS_PREFIX": f"locust{secrets.token_hex(3)}:", "OTEL_EXPORTER": "none",
           "SERVICE_LOG_LEVEL": "WARNING", "SERVICE_TRUSTED_PROXIES": "127.0.0.1",
           "SERVICE_WEBHOOK_ALLOW_PRIVATE_URLS": "true", "SERVICE_HOST": "127.0.0.1"}
    env.pop("SERVICE_KMS_KEY_FILE", None)
    err = open(log_path, "wb")  # the server's for its whole life
    proc = subprocess.Popen([AUTHIO, "serve"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=err)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    import requests

    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"authio serve exited {proc.returncode}; see {log_path}")
        try:
            if requests.get(url + "/readyz", timeout=2).status_code == 200:
                break
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"authio serve not ready in 60 s; see {log_path}")
        time.sleep(0.2)
    log(f"service {url} (pid {proc.pid}, database {DB}, log {log_path})")
    return Service(url, proc.pid, proc, token)


# --------------------------------------------------------------------------- measuring


def tree_rss_cpu(pid: int) -> tuple[float, float]:
    """(RSS in MiB, CPU seconds) of ``pid`` and its descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0, 0.0
    rss = cpu = 0.0
    for p in procs:
        try:
            rss += p.memory_info().rss
            t = p.cpu_times()
            cpu += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return rss / 2**20, cpu


def box_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine from /proc/stat."""
    with open("/proc/stat") as f:
        parts = [float(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]
    return sum(parts) - idle, sum(parts)


def pg_bench_cpu() -> float:
    return sum(cpu for kind, cpu in postgres_processes(DB).values() if kind == "bench")


@dataclass
class Sampler:
    server_pid: int
    locust_pid: int
    t0: float
    rows: list[dict[str, float]] = field(default_factory=list)
    _last: tuple[float, float, float, float, float, float] | None = None

    def sample(self) -> dict[str, float] | None:
        now = time.monotonic()
        rss, server = tree_rss_cpu(self.server_pid)
        _, client = tree_rss_cpu(self.locust_pid)
        pg = pg_bench_cpu()
        busy, total = box_busy()
        cur = (now, server, client, pg, busy, total)
        row = None
        if self._last is not None:
            wall = now - self._last[0]
            ncpu = os.cpu_count() or 1
            cores = [(cur[i] - self._last[i]) / wall for i in (1, 2, 3)]
            box = (busy - self._last[4]) / max(total - self._last[5], 1e-9) * ncpu
            row = {"t_s": round(now - self.t0, 1), "unix": round(time.time(), 1),
                   "rss_mib": round(rss, 1), "server_cores": round(cores[0], 3),
                   "locust_cores": round(cores[1], 3), "postgres_cores": round(cores[2], 3),
                   "box_cores": round(box, 3),
                   "other_cores": round(max(0.0, box - sum(cores)), 3),
                   "load1": os.getloadavg()[0]}
            self.rows.append(row)
        self._last = cur
        return row


def history(prefix: Path) -> list[dict[str, str]]:
    """locust's Aggregated rows of ``<prefix>_stats_history.csv``."""
    path = Path(f"{prefix}_stats_history.csv")
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f) if r["Name"] == "Aggregated"]


def num(value: str | None) -> float:
    try:
        return float(value or "nan")
    except ValueError:
        return float("nan")


def stats_rows(prefix: Path) -> dict[str, dict[str, str]]:
    with open(f"{prefix}_stats.csv", newline="") as f:
        return {r["Name"]: r for r in csv.DictReader(f)}


def run_locust(prefix: Path, users: int, seconds: float, env: dict[str, str], host: str,
               html: Path | None = None) -> subprocess.Popen[bytes]:
    cmd = [LOCUST, "-f", str(BENCH / "locustfile.py"), "--headless", "-u", str(users), "-r",
           str(users), "-t", f"{int(seconds)}s", "--host", host, "--tags", "mixed",
           "--csv", str(prefix), "--csv-full-history", "--only-summary", "--loglevel", "WARNING"]
    if html is not None:
        cmd += ["--html", str(html)]
    out = open(f"{prefix}.log", "wb")  # locust's output for its whole run
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def step_run(args: argparse.Namespace, host: str, env: dict[str, str]) -> dict[str, Any]:
    """Closed-loop steps: requests/s and latency at each user count, and requests per task."""
    steps = []
    for users in [int(u) for u in args.steps.split(",")]:
        prefix = args.out / f"soak-step-u{users}"
        proc = run_locust(prefix, users, args.step_seconds, {**env, "AUTHIO_TASK_RATE": "0"},
                          host)
        proc.wait()
        rows = history(prefix)
        t_start = num(rows[0]["Timestamp"]) if rows else 0.0
        half = [r for r in rows if num(r["Timestamp"]) >= t_start + args.step_seconds / 2]
        stats = stats_rows(prefix)
        total = stats["Aggregated"]
        tasks = sum(int(stats[n]["Request Count"]) for n in TASK_STARTS if n in stats)
        step = {"users": users,
                "rps": statistics.fmean(num(r["Requests/s"]) for r in half) if half else 0.0,
                "p50_ms": statistics.median(num(r["50%"]) for r in half) if half else None,
                "p95_ms": statistics.median(num(r["95%"]) for r in half) if half else None,
                "p99_ms": statistics.median(num(r["99%"]) for r in half) if half else None,
                "requests": int(total["Request Count"]), "failures": int(total["Failure Count"]),
                "requests_per_task": int(total["Request Count"]) / max(tasks, 1)}
        steps.append(step)
        log(f"step u={users}: {step['rps']:.0f} requests/s, p50 {step['p50_ms']} ms, "
            f"p99 {step['p99_ms']} ms, {step['failures']} failures, "
            f"{step['requests_per_task']:.2f} requests a task")
    best = max(steps, key=lambda s: s["rps"])
    return {"steps": steps, "capacity_rps": best["rps"], "best_users": best["users"],
            "requests_per_task": best["requests_per_task"], "step_seconds": args.step_seconds}


def verdict(rows: list[dict[str, float]], minutes: float, failures: int) -> dict[str, Any]:
    """The three conditions of the module's docstring, with their figures."""
    mark = 300.0 if minutes * 60 >= 600 else minutes * 60 / 3
    at_mark = next((r for r in rows if r["t_s"] >= mark), rows[0] if rows else None)
    end_rows = [r for r in rows if r["t_s"] >= rows[-1]["t_s"] - 60] if rows else []
    rss_mark = at_mark["rss_mib"] if at_mark else float("nan")
    rss_end = statistics.fmean(r["rss_mib"] for r in end_rows) if end_rows else float("nan")
    growth = (rss_end - rss_mark) / rss_mark if rss_mark else float("nan")
    span = rows[-1]["t_s"] if rows else 0.0
    if span >= 900:
        early = [r for r in rows if mark <= r["t_s"] < mark + 300]
        late = [r for r in rows if r["t_s"] >= span - 300]
    else:
        early = [r for r in rows if span / 3 <= r["t_s"] < 2 * span / 3]
        late = [r for r in rows if r["t_s"] >= 2 * span / 3]
    p99_early = statistics.median(r["p99_ms"] for r in early) if early else float("nan")
    p99_late = statistics.median(r["p99_ms"] for r in late) if late else float("nan")
    ratio = p99_late / p99_early if p99_early else float("nan")
    return {
        "memory": {"rss_at_mark_mib": rss_mark, "mark_s": at_mark["t_s"] if at_mark else None,
                   "rss_end_mib": round(rss_end, 1), "growth": round(growth, 4),
                   "ok": growth < 0.10},
        "errors": {"failures": failures, "ok": failures == 0},
        "p99": {"early_median_ms": p99_early, "late_median_ms": p99_late,
                "ratio": round(ratio, 3), "ok": ratio <= 1.5},
    }


def soak(args: argparse.Namespace, service: Service, env: dict[str, str],
         capacity: dict[str, Any]) -> int:
    target = capacity["capacity_rps"] * args.load
    per_user = target / capacity["requests_per_task"] / args.users
    log(f"soak: {args.users} users at {per_user:.2f} tasks/s each, for {target:.0f} requests/s "
        f"({args.load:.0%} of {capacity['capacity_rps']:.0f}), {args.minutes} min")
    prefix = args.out / "soak"
    seconds = args.minutes * 60
    proc = run_locust(prefix, args.users, seconds, {**env, "AUTHIO_TASK_RATE": f"{per_user:.4f}"},
                      service.url, html=args.out / "soak.html")
    t0 = time.monotonic()
    sampler = Sampler(service.pid, proc.pid, t0)
    sampler.sample()
    while proc.poll() is None:
        time.sleep(args.sample_seconds - (time.monotonic() - t0) % args.sample_seconds)
        if proc.poll() is not None:
            break
        row = sampler.sample()
        if row and int(row["t_s"]) % 60 < args.sample_seconds:
            log(f"t={row['t_s']:.0f}s RSS {row['rss_mib']:.0f} MiB, cores: server "
                f"{row['server_cores']:.2f} locust {row['locust_cores']:.2f} PostgreSQL "
                f"{row['postgres_cores']:.2f} other {row['other_cores']:.2f}")
    hist = history(prefix)
    t_unix0 = time.time() - (time.monotonic() - t0)
    merged = []
    for row in sampler.rows:
        at = t_unix0 + row["t_s"]
        before = [h for h in hist if num(h["Timestamp"]) <= at]
        h = before[-1] if before else {}
        merged.append({**row, "rps": num(h.get("Requests/s")), "p50_ms": num(h.get("50%")),
                       "p99_ms": num(h.get("99%")),
                       "failures": num(h.get("Total Failure Count")),
                       "requests": num(h.get("Total Request Count"))})
    with open(args.out / "soak.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(merged[0]))
        writer.writeheader()
        writer.writerows(merged)
    total = stats_rows(prefix)["Aggregated"]
    failures = int(total["Failure Count"])
    result = verdict(merged, args.minutes, failures)
    result.update({"requests": int(total["Request Count"]), "failures": failures,
                   "mean_rps": statistics.fmean(r["rps"] for r in merged if r["rps"] == r["rps"]),
                   "target_rps": target, "users": args.users, "tasks_per_user_s": per_user,
                   "minutes": args.minutes, "capacity": capacity,
                   "other_cores_mean": statistics.fmean(r["other_cores"] for r in merged),
                   "other_cores_max": max(r["other_cores"] for r in merged),
                   "server_cores_mean": statistics.fmean(r["server_cores"] for r in merged),
                   "locust_cores_mean": statistics.fmean(r["locust_cores"] for r in merged),
                   "postgres_cores_mean": statistics.fmean(r["postgres_cores"] for r in merged),
                   "cpus": os.cpu_count()})
    (args.out / "soak-verdict.json").write_text(json.dumps(result, indent=2) + "\n")
    plots.soak_figure(args.out / "soak.csv", args.out / "soak.png", verdict=result)
    ok = all(result[k]["ok"] for k in ("memory", "errors", "p99"))
    log(f"verdict: memory {result['memory']['growth']:+.1%} "
        f"({result['memory']['rss_at_mark_mib']:.0f} -> {result['memory']['rss_end_mib']:.0f} "
        f"MiB), failures {failures}, p99 {result['p99']['early_median_ms']:.0f} -> "
        f"{result['p99']['late_median_ms']:.0f} ms: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default=None, help="a running service (else one is started)")
    ap.add_argument("--server-pid", type=int, default=None, help="its process, with --host")
    ap.add_argument("--bootstrap-token", default=os.environ.get("SERVICE_BOOTSTRAP_TOKEN"))
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_PG))
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS))
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--load", type=float, default=0.5, help="share of the capacity to hold")
    ap.add_argument("--users", type=int, default=24)
    ap.add_argument("--steps", default="8,16,32")
    ap.add_argument("--step-seconds", type=float, default=45.0)
    ap.add_argument("--capacity-rps", type=float, default=None,
                    help="skip the step run: this capacity (with --requests-per-task)")
    ap.add_argument("--requests-per-task", type=float, default=1.1)
    ap.add_argument("--sample-seconds", type=float, default=10.0)
    ap.add_argument("--out", type=Path, default=BENCH / "results")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.host and not args.server_pid:
        ap.error("--host needs --server-pid (the process whose memory is watched)")
    service: Service | None = None
    try:
        if args.host:
            service = Service(args.host.rstrip("/"), args.server_pid,
                              bootstrap_token=args.bootstrap_token)
        else:
            service = start_service(args.database_url, args.redis_url,
                                    Path(f"/tmp/authio-soak-{os.getpid()}.log"))
        state = BENCH / "data" / "soak-state.json"  # holds the key: not beside the results
        setup = ["--host", service.url, "--state", str(state)]
        setup += ["--api-key", args.api_key] if args.api_key else \
            ["--bootstrap-token", service.bootstrap_token or ""]
        if locust_setup.main(setup) != 0:
            return 2
        env = {**os.environ, "AUTHIO_STATE": str(state)}
        if args.capacity_rps:
            capacity = {"steps": [], "capacity_rps": args.capacity_rps,
                        "requests_per_task": args.requests_per_task}
        else:
            capacity = step_run(args, service.url, env)
            (args.out / "soak-steps.json").write_text(json.dumps(capacity, indent=2) + "\n")
            plots.steps_figure(args.out / "soak-steps.json", args.out / "soak-steps.png")
        return soak(args, service, env, capacity)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        log(f"FAILED: {exc}")
        return 2
    finally:
        if service is not None:
            service.stop()


if __name__ == "__main__":
    sys.exit(main())
