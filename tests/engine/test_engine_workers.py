"""``authio serve engine --workers N`` (issue 24): N engine processes on one port under a
supervisor, as an operator runs it.

Each test starts the command as a subprocess against the run's database and Redis (the control
plane is the session's service, which writes the tuples). Which process answered a request is
read from the kernel, not from the answer (which says nothing about it): the test's client
connects from a port of its own, and ``psutil`` names the worker whose accepted socket has that
peer. The listening sockets are the kernel's too: one per worker, each its own socket (its own
inode) on the same port, which only ``SO_REUSEPORT`` allows.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import psutil
import pytest
import pytest_asyncio
from aiohttp import ClientSession

from tests.fixtures.pgproxy import pg_proxy
from tests.fixtures.service import (
    AUTHIO,
    Project,
    ServedProcess,
    eventually,
    serve_process,
    stop_gracefully,
)

WORKERS = 2
DYING_SECONDS = 0.2
"""After a killed worker is gone, how long before every new connection must be answered: a
connection the kernel steered to the dying listener in its last instant is reset (measured
here: one connection in about 5,000, within 5 ms of the process's end; none after 100 ms).
Linux 5.14+ hands them to another listener instead with ``net.ipv4.tcp_migrate_req=1``."""


@pytest.fixture
def engine_env(database_url: str, redis_url: str, redis_prefix: str) -> dict[str, str]:
    """The environment of an ``authio serve engine``: the run's database and Redis, a fast poll,
    small pools, no telemetry export, nothing inherited that would change the service."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "SERVICE_")) and k not in ("PORT", "DATABASE_URL",
                                                                    "REDIS_URL")}
    env.update(DATABASE_URL=database_url, REDIS_URL=redis_url, SERVICE_REDIS_PREFIX=redis_prefix,
               SERVICE_ENGINE_POLL_SECONDS="0.5", SERVICE_PG_POOL_MAX="3",
               OTEL_EXPORTER="none")
    return env


@dataclass
class Store:
    id: str
    revision: int
    project: Project


@pytest_asyncio.fixture
async def store(project: Project) -> Store:
    """A store of the test's project with ``doc:1#viewer@user:ann``, written through the control
    plane."""
    r = await project.api.post("/v1/stores", {"name": "workers"})
    assert r.status == 201, r.body
    written = await project.api.post(f"/v1/stores/{r.body['id']}/write",
                                     {"writes": [tk("doc:1")]})
    assert written.status == 200, written.body
    return Store(r.body["id"], written.body["revision"], project)


def tk(obj: str, user: str = "user:ann") -> dict[str, str]:
    return {"object": obj, "relation": "viewer", "user": user}


# -- the kernel's view ---------------------------------------------------------------------------


def listening(supervisor: int, port: int) -> dict[int, str]:
    """The supervisor's children listening on ``port``: pid -> the listening socket's inode
    (``socket:[n]``, from ``/proc/<pid>/fd``)."""
    found: dict[int, str] = {}
    for child in psutil.Process(supervisor).children():
        try:
            for conn in child.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port:
                    found[child.pid] = os.readlink(f"/proc/{child.pid}/fd/{conn.fd}")
        except psutil.NoSuchProcess:
            continue
    return found


def accepted_by(workers: list[int], port: int, peer: tuple[str, int]) -> int | None:
    """The worker whose accepted socket on ``port`` has ``peer`` as its remote end."""
    for pid in workers:
        try:
            for conn in psutil.Process(pid).net_connections(kind="tcp"):
                if conn.laddr.port == port and conn.raddr and (conn.raddr.ip, conn.raddr.port) == peer:
                    return pid
        except psutil.NoSuchProcess:
            continue
    return None


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: Any
    worker: int | None


async def ask(port: int, method: str, path: str, *, key: str | None = None,
              body: Any = None, workers: Sequence[int] = ()) -> Answer:
    """One request on a new connection (so the kernel picks a worker for it); the answer, and
    which of ``workers`` accepted the connection (looked up while it is open)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        peer = writer.get_extra_info("sockname")[:2]
        data = b"" if body is None else orjson.dumps(body)
        head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(data)}"]
        if body is not None:
            head.append("Content-Type: application/json")
        if key is not None:
            head.append(f"Authorization: Bearer {key}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        await writer.drain()
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        lines = raw.decode().split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip()
                   for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        payload = await reader.readexactly(int(headers.get("content-length", "0")))
        worker = accepted_by(list(workers), port, peer) if workers else None
        return Answer(status, headers, orjson.loads(payload) if payload else None, worker)
    finally:
        writer.close()


def check_body(obj: str, at_least: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"tuple_key": tk(obj)}
    if at_least is not None:
        body["consistency"] = {"at_least_revision": at_least}
    return body


def port_of(served: ServedProcess) -> int:
    return int(served.api.base_url.rsplit(":", 1)[1])


@pytest_asyncio.fixture
async def engine(http: ClientSession, engine_env: dict[str, str]) -> AsyncIterator[ServedProcess]:
    """``authio serve engine --workers 2``, ready (every worker), stopped after the test."""
    async with serve_process(http, engine_env, "engine", "--workers", str(WORKERS)) as served:
        yield served


async def spread(served: ServedProcess, store: Store, body: dict[str, Any],
                 connections: int = 24) -> list[Answer]:
    """``connections`` checks, each on its own connection, with the worker each reached."""
    port = port_of(served)
    workers = sorted(listening(served.proc.pid, port))
    return [await ask(port, "POST", f"/v1/stores/{store.id}/check", key=store.project.key,
                      body=body, workers=workers) for _ in range(connections)]


# -- tests ---------------------------------------------------------------------------------------


async def test_the_workers_share_the_port_and_all_answer(engine: ServedProcess,
                                                         store: Store) -> None:
    port = port_of(engine)
    sockets = listening(engine.proc.pid, port)
    # Two processes, each with a listening socket of its own on the same port: SO_REUSEPORT
    # (a socket shared by fork would be one inode in both).
    assert len(sockets) == WORKERS, sockets
    assert len(set(sockets.values())) == WORKERS, sockets
    answers = await spread(engine, store, check_body("doc:1", store.revision))
    for a in answers:
        assert (a.status, a.body["allowed"], a.body["revision"]) == (200, True, store.revision), a
    # The kernel spread the 24 connections over both (all on one: a chance of 2**-23).
    assert {a.worker for a in answers} == set(sockets), answers
    # And a plain client sees one service.
    ready = await engine.api.get("/readyz")
    assert (ready.status, ready.body["status"]) == (200, "ready")


async def test_a_write_is_checked_at_its_revision_on_every_worker(engine: ServedProcess,
                                                                  store: Store) -> None:
    """Each worker follows the change log on its own; a check at a write's revision waits for
    the worker it lands on, whichever it is. A revision past the store's is 400 on every one."""
    for n in range(3):
        written = await store.project.api.post(f"/v1/stores/{store.id}/write",
                                               {"writes": [tk(f"doc:w{n}")]})
        assert written.status == 200, written.body
        revision = written.body["revision"]
        answers = await spread(engine, store, check_body(f"doc:w{n}", revision), connections=12)
        assert all((a.status, a.body["allowed"]) == (200, True) for a in answers), answers
        assert all(a.body["revision"] >= revision for a in answers), answers
        assert len({a.worker for a in answers}) == WORKERS, answers
    ahead = await spread(engine, store, check_body("doc:1", revision + 5), connections=12)
    assert len({a.worker for a in ahead}) == WORKERS, ahead
    for a in ahead:
        assert (a.status, a.body["error"]["code"]) == (400, "revision_ahead"), a
        assert a.body["error"]["details"] == {"requested": revision + 5, "current": revision}
        assert "retry-after" not in a.headers


async def test_a_killed_worker_is_replaced_and_the_service_keeps_answering(
        engine: ServedProcess, store: Store) -> None:
    port = port_of(engine)
    before = listening(engine.proc.pid, port)
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    await eventually(lambda: _gone(victim), within=5, what="the killed worker gone")
    await asyncio.sleep(DYING_SECONDS)
    # Every check on a new connection is answered meanwhile: the kernel no longer sends any to
    # the dead socket, and the replacement binds only once it has loaded.
    answered = 0
    deadline = time.monotonic() + 30
    while True:
        workers = listening(engine.proc.pid, port)
        if len(workers) == WORKERS and victim not in workers and (
                await engine.api.get("/readyz")).status == 200:
            break
        assert time.monotonic() < deadline, f"no replacement: {workers}\n{engine.logs()}"
        a = await ask(port, "POST", f"/v1/stores/{store.id}/check", key=store.project.key,
                      body=check_body("doc:1", store.revision))
        assert (a.status, a.body["allowed"]) == (200, True), a
        answered += 1
    assert answered > 0
    assert re.search(rf"engine worker \d exited \(code -{int(signal.SIGKILL)}\); starting it again "
                     r"in 0\.0 s", engine.logs())
    answers = await spread(engine, store, check_body("doc:1", store.revision))
    assert {a.worker for a in answers} == set(listening(engine.proc.pid, port)), answers
    assert all(a.status == 200 for a in answers)


async def test_readyz_is_503_until_every_worker_is_ready(
        http: ClientSession, engine_env: dict[str, str], database_url: str,
        store: Store) -> None:
    """A worker that cannot load holds the whole service's readiness, whichever worker is
    asked; meanwhile the others answer checks. The replacement of a killed worker is held for
    real: its PostgreSQL (a proxy in front of the run's) refuses new connections, while the
    connections the running worker holds go on."""
    async with pg_proxy(database_url) as proxy:
        env = {**engine_env, "DATABASE_URL": proxy.url(database_url)}
        async with serve_process(http, env, "engine", "--workers", str(WORKERS)) as served:
            port = port_of(served)
            workers = listening(served.proc.pid, port)
            proxy.refusing = True
            victim, survivor = sorted(workers)
            os.kill(victim, signal.SIGKILL)
            await eventually(lambda: _gone(victim), within=5, what="the killed worker gone")
            await asyncio.sleep(DYING_SECONDS)
            until = time.monotonic() + 3  # the replacement retries its connection meanwhile
            while time.monotonic() < until:
                ready = await ask(port, "GET", "/readyz", workers=[survivor])
                assert ready.worker == survivor  # the only one listening
                assert (ready.status, (ready.body.get("error") or {}).get("code")) == (
                    503, "not_ready"), (ready, served.logs()[-3000:])
                a = await ask(port, "POST", f"/v1/stores/{store.id}/check",
                              key=store.project.key, body=check_body("doc:1", store.revision))
                assert (a.status, a.body["allowed"]) == (200, True), a
                await asyncio.sleep(0.1)
            assert list(listening(served.proc.pid, port)) == [survivor]
            proxy.refusing = False
            await eventually(lambda: _all_ready(served), within=30, what="every worker ready")
            assert len(listening(served.proc.pid, port)) == WORKERS


async def test_sigterm_stops_every_worker_gracefully(engine: ServedProcess) -> None:
    workers = list(listening(engine.proc.pid, port_of(engine)))
    assert len(workers) == WORKERS
    assert await stop_gracefully(engine, within=30) == 0
    for pid in workers:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert engine.logs().count("engine supervisor stopping 2 workers") == 1


async def test_a_worker_that_cannot_start_is_retried_with_backoff(
        http: ClientSession, engine_env: dict[str, str]) -> None:
    """The port held by a socket without SO_REUSEPORT: every worker fails to bind and exits,
    and is started again after 0.5, 1, 2 s... not in a tight loop."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            AUTHIO, "serve", "engine", "--workers", "2",
            env={**engine_env, "SERVICE_ENGINE_PORT": str(port)},
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        assert proc.stderr is not None
        delays: dict[str, list[float]] = {}
        try:
            async with asyncio.timeout(30):
                while sum(len(d) for d in delays.values()) < 6:
                    line = (await proc.stderr.readline()).decode()
                    assert line, "the supervisor ended"
                    m = re.search(r"engine worker (\d) exited \(code 1\) before it was ever "
                                  r"ready; starting it again in ([\d.]+) s", line)
                    if m:
                        delays.setdefault(m[1], []).append(float(m[2]))
        finally:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 30)
    assert delays == {"0": [0.5, 1.0, 2.0], "1": [0.5, 1.0, 2.0]}, delays
    assert proc.returncode == 0


# -- helpers -------------------------------------------------------------------------------------


async def _gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


async def _all_ready(served: ServedProcess) -> bool:
    answers = [await ask(port_of(served), "GET", "/readyz") for _ in range(8)]
    return all(a.status == 200 for a in answers)
