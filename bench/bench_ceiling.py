"""Issue 12's side-by-side in one command: the bare aiohttp ceiling, single checks and forward
auth with a repeated token, driven by wrk in the same run.

    python bench/bench_ceiling.py --dataset bench/data/medium [--concurrency 16,64]
        [--duration 10] [--rounds 2] [--engine-url URL --engine-pid PID] [--token JWT]
        [--workers N] [--engine-cpus 0] [--client-cpus 1] [--pipeline 1,8,16]
        [--json results.json]

What it runs, per round and per concurrency level, one after the other:

* ``bare-check``: ``bench/bare_server.py`` (aiohttp + uvloop, access log off, as the service),
  ``POST /v1/stores/{id}/check`` with the same bodies and headers as ``check``;
* ``check``: the engine's ``POST /v1/stores/{id}/check``, cycling through the dataset's checks
  (``{"tuple_key": ...}`` bodies, ``Authorization: Bearer $AUTHIO_API_KEY``);
* ``bare-auth``: the bare server's ``GET /v1/edge/auth`` with the same headers as ``auth``;
* ``auth``: the engine's forward auth, ``GET /v1/edge/auth`` with one access token repeated
  (``--token``, else one minted for the store's project by ``bench/edge_token.py``) and the
  ``X-Forwarded-*`` headers an nginx or Traefik sends.

Each is ``wrk -t1 -c<C> -d<D>`` (``bench/wrk/requests.lua``: requests formatted once, a JSON
summary at the end) after ``--warmup`` seconds of the same load. The server's CPU time is read
from ``/proc/<pid>/stat`` around the measured run (the process and all its descendants: an
engine's workers): **server µs per request** is the figure to trust on a shared machine (wrk and
the server share the cores, and others may run). What wrk took (``client`` cores, its rusage)
and what the rest of the machine did meanwhile (``other`` cores: ``/proc/stat``'s busy time
less server and client) are in the table too. Ratios compare each path with its bare twin of
the same round and level, by requests per second and by CPU per request (bare µs / path µs: the
throughput ratio a saturated server would reach).

``--pipeline 1,8,16`` runs every target at each of these HTTP/1.1 pipelining depths (default
1: one request at a time per connection, as a browser or a proxy such as nginx sends them):
at depth N wrk writes N requests at once on each connection and the next N when all N answers
are in (``WRK_PIPELINE``). It costs wrk less per request (a quarter to a third less at depth 8
on the 2-core box: it still parses every answer), so that it leaves more of the cores to the
server; the server's cost per request falls a little too (one read for N requests, still a
write per answer), and proxies such as nginx do not pipeline, so a pipelined figure is no figure
of what a proxy's traffic costs. wrk's latencies at a depth above 1 are
not figures either: it times a group of N (write to last answer) and its correction for
coordinated omission assumes one request per write, adding samples below its own minimum, so
its p50 is skewed and its p99 often reads 0. Before the first measured run at a depth
above 1, each target gets ``2 * depth`` requests pipelined on one connection here
(:func:`pipelined`): every answer must be a 200, and a check's ``allowed`` must be what
``checks.jsonl`` says, in order; else the run stops.

``--workers N`` starts ``authio serve engine --workers N`` (issue 24; default 1, the single
process, so the bare twin compares like with like); ``--engine-cpus`` and ``--client-cpus``
pin the engine (all its workers) and wrk with ``taskset`` (e.g. ``--engine-cpus 0
--client-cpus 1``: the server on one core, the client on another).

Without ``--engine-url`` the engine is started here (``authio serve engine`` of this checkout,
``OTEL_EXPORTER=none`` unless ``--otel-exporter``, log level WARNING, on a free port) against
``$DATABASE_URL``, and stopped at the end; its start waits for ``/readyz``. A non-2xx answer
or a socket error in a measured run is reported in the ``errors`` column (any error makes the
exit status 1). Needs ``wrk`` (Debian: ``apt-get install wrk``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LUA = HERE / "wrk" / "requests.lua"
CLK_TCK = os.sysconf("SC_CLK_TCK")
FORWARDED = ("X-Forwarded-Method: GET\nX-Forwarded-Proto: https\nX-Forwarded-Host: app.example\n"
             "X-Forwarded-Uri: /projects/42/settings\n")


@dataclass
class Row:
    round: int
    target: str
    concurrency: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    server_cores: float
    server_us_per_request: float
    errors: int
    client_cores: float = 0.0
    other_cores: float = 0.0
    pipeline: int = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _own_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and every live descendant (an engine's supervisor and its
    workers). A descendant that ended between two readings is missed: none does in a run."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += _own_cpu(p)
            todo += _children(p)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine spent busy (``/proc/stat``: all but idle and
    iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / CLK_TCK


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} did not answer 200 within {timeout:.0f} s")
        time.sleep(0.2)


CLIENT_CPUS: list[str] = []  # taskset prefix for wrk (--client-cpus)


def parse_depths(text: str) -> list[int]:
    """``--pipeline``'s value, ``"1,8,16"``, as depths (each ≥ 1); ValueError otherwise."""
    depths = [int(d) for d in text.split(",") if d.strip()]
    if not depths or min(depths) < 1:
        raise ValueError(f"pipeline depths are whole numbers of 1 or more: {text!r}")
    return depths


def http_request(method: str, path: str, host: str, headers: str, body: str | None) -> bytes:
    """One HTTP/1.1 request as wrk's ``wrk.format`` writes it: ``headers`` are ``"Name: value"``
    lines separated by ``"\\n"``; a body gets ``Content-Type: application/json`` and its
    ``Content-Length``."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [line for line in headers.split("\n") if line]
    data = b""
    if body is not None:
        data = body.encode()
        lines += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


def pipelined(host: str, port: int, requests: list[bytes],
              timeout: float = 10.0) -> list[tuple[int, bytes]]:
    """Send ``requests`` (whole HTTP/1.1 requests, :func:`http_request`) in one write on one
    connection to ``host:port`` and read their answers in order: ``(status, body)`` per request.
    Answers must carry ``Content-Length`` (the service's and the bare server's do); one without,
    a closed connection before the last answer, or ``timeout`` seconds without data raise
    ``ValueError``/``OSError``."""
    answers: list[tuple[int, bytes]] = []
    buf = b""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(b"".join(requests))
        while len(answers) < len(requests):
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                head = buf[:end].decode("latin-1").split("\r\n")
                fields = {k.strip().lower(): v.strip()
                          for k, _, v in (line.partition(":") for line in head[1:])}
                if "content-length" not in fields:
                    raise ValueError(f"answer {len(answers) + 1} has no Content-Length: {head}")
                size = int(fields["content-length"])
                if len(buf) >= end + 4 + size:
                    answers.append((int(head[0].split()[1]), buf[end + 4:end + 4 + size]))
                    buf = buf[end + 4 + size:]
                    continue
            chunk = sock.recv(65536)
            if not chunk:
                raise ValueError(f"connection closed after {len(answers)} of {len(requests)} "
                                 "answers")
            buf += chunk
    return answers


def verify_pipelined(url: str, path: str, *, method: str, headers: str,
                     bodies: list[str] | None, expected: list[bool] | None, depth: int) -> None:
    """``2 * depth`` requests of a target pipelined on one connection (:func:`pipelined`):
    SystemExit unless every answer is a 200 and, with ``expected``, each ``allowed`` is the
    dataset's answer for its body, in order."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    count = 2 * depth
    sample = [bodies[k % len(bodies)] for k in range(count)] if bodies else [None] * count
    answers = pipelined(host, int(port), [http_request(method, path, f"{host}:{port}", headers, b)
                                          for b in sample])
    for k, (status, body) in enumerate(answers):
        if status != 200:
            raise SystemExit(f"pipelined {method} {path}, answer {k + 1} of {count}: {status} "
                             f"{body[:200]!r}")
        if expected is not None and json.loads(body)["allowed"] is not expected[k % len(expected)]:
            raise SystemExit(f"pipelined {method} {path}, answer {k + 1} of {count}: allowed "
                             f"is not {expected[k % len(expected)]} for {sample[k]}")


def wrk(url: str, path: str, *, method: str, headers: str, bodies: Path | None, conc: int,
        seconds: float, pipeline: int = 1) -> dict[str, Any]:
    env = {**os.environ, "WRK_METHOD": method, "WRK_PATH": path, "WRK_HEADERS": headers,
           "WRK_BODIES": str(bodies) if bodies else "", "WRK_PIPELINE": str(pipeline)}
    out = subprocess.run([*CLIENT_CPUS, "wrk", "-t1", f"-c{conc}", f"-d{seconds:g}s",
                          "--timeout", "5s", "-s", str(LUA), url], env=env,
                         capture_output=True, text=True, check=True).stdout
    return dict(json.loads([line for line in out.splitlines() if line.startswith("{")][-1]))


def measure(target: str, rnd: int, url: str, pid: int, path: str, *, method: str, headers: str,
            bodies: Path | None, conc: int, seconds: float, warmup: float,
            pipeline: int = 1) -> Row:
    if warmup > 0:
        wrk(url, path, method=method, headers=headers, bodies=bodies, conc=conc, seconds=warmup,
            pipeline=pipeline)
    before, client0, busy0 = cpu_seconds(pid), _children_cpu(), machine_busy_seconds()
    t0 = time.monotonic()
    res = wrk(url, path, method=method, headers=headers, bodies=bodies, conc=conc,
              seconds=seconds, pipeline=pipeline)
    cpu, wall = cpu_seconds(pid) - before, time.monotonic() - t0
    client, busy = _children_cpu() - client0, machine_busy_seconds() - busy0
    n = max(res["requests"], 1)
    errors = sum(res[k] for k in ("connect_errors", "read_errors", "write_errors",
                                  "status_errors", "timeouts"))
    return Row(rnd, target, conc, res["requests"] / (res["duration_us"] / 1e6),
               res["p50_us"] / 1000, res["p99_us"] / 1000, cpu / wall, cpu / n * 1e6, errors,
               client / wall, max(busy - cpu - client, 0.0) / wall, pipeline)


def spawn(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as fh:
        return subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="bare aiohttp vs check vs forward auth, with wrk")
    ap.add_argument("--dataset", type=Path, default=HERE / "data" / "medium")
    ap.add_argument("--store-id", default=None, help="default: the dataset's store.json")
    ap.add_argument("--api-key", default=os.environ.get("AUTHIO_API_KEY", ""))
    ap.add_argument("--token", default=os.environ.get("EDGE_TOKEN", ""),
                    help="access token for forward auth (default: minted by edge_token.py)")
    ap.add_argument("--project-id", default=None,
                    help="project to mint the token for (default: the store's, from $DATABASE_URL)")
    ap.add_argument("--engine-url", default=None)
    ap.add_argument("--engine-pid", type=int, default=None)
    ap.add_argument("--otel-exporter", default="none")
    ap.add_argument("--concurrency", default="16,64")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--limit", type=int, default=20_000, help="checks used from checks.jsonl")
    ap.add_argument("--targets", default="bare-check,check,bare-auth,auth")
    ap.add_argument("--workers", type=int, default=1,
                    help="engine processes of the engine started here (authio serve engine "
                         "--workers N; default 1)")
    ap.add_argument("--engine-cpus", default=None,
                    help="pin the engine started here to these CPUs (taskset -c LIST)")
    ap.add_argument("--client-cpus", default=None, help="pin wrk to these CPUs (taskset -c)")
    ap.add_argument("--pipeline", default="1", type=parse_depths,
                    help="HTTP/1.1 pipelining depths, requests per write on each connection "
                         "(e.g. 1,8,16; default 1: none)")
    ap.add_argument("--json", default=None, metavar="PATH")
    args = ap.parse_args(argv)
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install -y --no-install-recommends wrk")
    if not args.api_key:
        raise SystemExit("--api-key or $AUTHIO_API_KEY: a key of the store's project")
    store_id = args.store_id or json.loads((args.dataset / "store.json").read_text())["store_id"]
    levels = [int(c) for c in args.concurrency.split(",")]
    targets = args.targets.split(",")
    if args.client_cpus:
        CLIENT_CPUS[:] = ["taskset", "-c", args.client_cpus]
    bindir = Path(sys.executable).parent
    tmp = Path(tempfile.mkdtemp(prefix="bench_ceiling_"))
    bodies = tmp / "bodies.jsonl"
    check_bodies: list[str] = []
    allowed: list[bool] = []
    with open(args.dataset / "checks.jsonl", "rb") as src, open(bodies, "w") as dst:
        for k, line in enumerate(src):
            if k >= args.limit:
                break
            c = json.loads(line)
            check_bodies.append(json.dumps({"tuple_key": {"object": c["object"],
                                                          "relation": c["relation"],
                                                          "user": c["user"]}},
                                           separators=(",", ":")))
            allowed.append(bool(c["allowed"]))
            dst.write(check_bodies[-1] + "\n")
    check_path = f"/v1/stores/{store_id}/check"
    key_header = f"Authorization: Bearer {args.api_key}\n"

    engine = bare = None
    try:
        bare_port = free_port()
        bare = spawn([sys.executable, str(HERE / "bare_server.py"), "--port", str(bare_port)],
                     dict(os.environ), tmp / "bare.log")
        bare_url = f"http://127.0.0.1:{bare_port}"
        if args.engine_url:
            engine_url = args.engine_url.rstrip("/")
            if args.engine_pid is None:
                raise SystemExit("--engine-pid goes with --engine-url (for its CPU time)")
            engine_pid = args.engine_pid
        else:
            port = free_port()
            env = {**os.environ, "SERVICE_ENGINE_PORT": str(port),
                   "OTEL_EXPORTER": args.otel_exporter, "SERVICE_LOG_LEVEL": "WARNING"}
            pin = ["taskset", "-c", args.engine_cpus] if args.engine_cpus else []
            engine = spawn([*pin, str(bindir / "authio"), "serve", "engine", "--workers",
                            str(args.workers)], env, tmp / "engine.log")
            engine_url, engine_pid = f"http://127.0.0.1:{port}", engine.pid
        wait_http(bare_url + "/v1/edge/auth")
        wait_http(engine_url + "/readyz", timeout=120)
        token = args.token
        if not token and "auth" in targets:
            project = args.project_id or subprocess.run(
                ["psql", os.environ.get("DATABASE_URL", ""), "-Atc",
                 f"SELECT project_id FROM stores WHERE id = '{store_id}'"],
                capture_output=True, text=True, check=True).stdout.strip()
            token = subprocess.run([sys.executable, str(HERE / "edge_token.py"), "--project-id",
                                    project], capture_output=True, text=True,
                                   check=True).stdout.strip()
        auth_headers = f"Authorization: Bearer {token}\n{FORWARDED}"
        plan = {
            "bare-check": (bare_url, bare.pid, check_path, "POST", key_header, bodies),
            "check": (engine_url, engine_pid, check_path, "POST", key_header, bodies),
            "bare-auth": (bare_url, bare.pid, "/v1/edge/auth", "GET", auth_headers, None),
            "auth": (engine_url, engine_pid, "/v1/edge/auth", "GET", auth_headers, None),
        }
        answers = {"check": allowed}  # the bare server's answer is fixed: its status only
        for depth in args.pipeline:
            for target in targets:
                if depth > 1:
                    url, _, path, method, headers, body_file = plan[target]
                    verify_pipelined(url, path, method=method, headers=headers,
                                     bodies=check_bodies if body_file else None,
                                     expected=answers.get(target), depth=depth)
        rows: list[Row] = []
        print(f"{'round':>5} {'target':<10} {'conc':>4} {'depth':>5} {'req/s':>9} {'p50 ms':>7} "
              f"{'p99 ms':>7} {'cores':>5} {'µs/req':>7} {'errors':>6} {'client':>6} "
              f"{'other':>5}")
        for rnd in range(1, args.rounds + 1):
            for conc in levels:
                for depth in args.pipeline:
                    for target in targets:
                        url, pid, path, method, headers, body_file = plan[target]
                        row = measure(target, rnd, url, pid, path, method=method,
                                      headers=headers, bodies=body_file, conc=conc,
                                      seconds=args.duration, warmup=args.warmup, pipeline=depth)
                        rows.append(row)
                        print(f"{rnd:>5} {target:<10} {conc:>4} {depth:>5} "
                              f"{row.requests_per_s:>9,.0f} "
                              f"{row.p50_ms:>7.2f} {row.p99_ms:>7.2f} {row.server_cores:>5.2f} "
                              f"{row.server_us_per_request:>7.1f} {row.errors:>6} "
                              f"{row.client_cores:>6.2f} {row.other_cores:>5.2f}", flush=True)
        print("\nratios to the bare twin (same round, level and depth): by req/s, by server "
              "µs/req")
        ratios = []
        for row in rows:
            twin = {"check": "bare-check", "auth": "bare-auth"}.get(row.target)
            base = next((r for r in rows if r.target == twin and r.round == row.round
                         and r.concurrency == row.concurrency
                         and r.pipeline == row.pipeline), None)
            if base is None:
                continue
            by_rate = row.requests_per_s / base.requests_per_s
            by_cpu = base.server_us_per_request / row.server_us_per_request
            ratios.append({"round": row.round, "target": row.target,
                           "concurrency": row.concurrency, "pipeline": row.pipeline,
                           "by_rate": by_rate, "by_cpu": by_cpu})
            print(f"  round {row.round} {row.target:<6} c={row.concurrency:<3} "
                  f"depth={row.pipeline:<3} "
                  f"{by_rate:6.1%} by req/s  {by_cpu:6.1%} by CPU "
                  f"({row.server_us_per_request:.1f} vs {base.server_us_per_request:.1f} µs)")
        if args.json:
            doc = {"rows": [asdict(r) for r in rows], "ratios": ratios,
                   "loadavg": os.getloadavg(), "cpus": os.cpu_count()}
            text = json.dumps(doc, indent=2)
            sys.stdout.write(text + "\n") if args.json == "-" else Path(args.json).write_text(text)
        return 1 if any(r.errors for r in rows) else 0
    finally:
        stop(engine)
        stop(bare)


if __name__ == "__main__":
    raise SystemExit(main())
