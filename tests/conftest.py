"""Test harness: real PostgreSQL and Redis, one fresh database and Redis key prefix per run.

The servers come from DATABASE_URL / REDIS_URL (``make test`` sets them through
``common.devservices``). Services run as real aiohttp servers on loopback ports and tests talk
to them over HTTP, like users do. Each test gets its own project through POST /v1/bootstrap, so
tests are isolated without resetting the database.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import orjson
import pytest
import pytest_asyncio
from aiohttp import ClientSession, ClientTimeout, web
from redis.asyncio import Redis

from common.settings import Settings, load_settings
from control_plane.migrate import upgrade

BOOTSTRAP_TOKEN = "test-bootstrap-token-" + "x" * 32
# The key-encryption key of this run, in the environment so `authio serve` subprocesses share it.
KMS_KEY = os.environ.setdefault("SERVICE_KMS_KEY", base64.b64encode(secrets.token_bytes(32)).decode())
ROOT = Path(__file__).resolve().parents[1]
AUTHIO = str(Path(sys.executable).with_name("authio"))
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"


DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports nothing listens on right now."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _with_db(url: str, db: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + db))


@contextlib.contextmanager
def migrated_database(server_url: str, label: str) -> Iterator[str]:
    """A database created and migrated on the server of ``server_url``, dropped on exit; yields
    its URL. Call it outside a running event loop (a sync fixture)."""
    name = f"authio_{label}_{secrets.token_hex(4)}"
    admin = _with_db(server_url, "postgres")

    async def admin_exec(sql: str) -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin_exec(f'CREATE DATABASE "{name}"'))
    try:
        url = _with_db(server_url, name)
        upgrade(url)
        yield url
    finally:
        asyncio.run(admin_exec(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A freshly created and migrated database, dropped after the run."""
    with migrated_database(os.environ.get("DATABASE_URL", DEFAULT_PG), "test") as url:
        yield url


async def eventually(probe: Callable[[], Awaitable[Any]], *, within: float = 20.0,
                     what: str = "condition") -> Any:
    """Poll the async ``probe`` until it returns something truthy (and return that); fail the
    test after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.fixture(scope="session")
def redis_url() -> str:
    return os.environ.get("REDIS_URL", DEFAULT_REDIS)


@pytest.fixture(scope="session")
def redis_prefix() -> str:
    return f"authio_test_{secrets.token_hex(4)}:"


@pytest.fixture(scope="session")
def settings_factory(database_url: str, redis_url: str, redis_prefix: str) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "database_url": database_url, "redis_url": redis_url, "redis_prefix": redis_prefix,
            "bootstrap_token": BOOTSTRAP_TOKEN, "engine_poll_seconds": 0.5,
            "consistency_timeout_ms": 2000, "pg_pool_max": 5,
            # Every test signs in from 127.0.0.1: the per-IP budget is tested with its own value.
            "magic_link_rate_per_ip": "100000/minute",
        }
        values.update(overrides)
        return load_settings(**values)
    return make


@dataclass
class Response:
    status: int
    headers: Any
    body: Any
    raw: bytes


class Api:
    """A thin HTTP client for one running service (base URL) and, optionally, one API key."""

    def __init__(self, session: ClientSession, base_url: str, key: str | None = None) -> None:
        self.session, self.base_url, self.key = session, base_url, key

    def with_key(self, key: str | None) -> Api:
        return Api(self.session, self.base_url, key)

    async def request(self, method: str, path: str, *, json: Any = None, data: bytes | None = None,
                      headers: dict[str, str] | None = None, key: Any = ...) -> Response:
        hdrs = dict(headers or {})
        k = self.key if key is ... else key
        if k is not None:
            hdrs.setdefault("Authorization", f"Bearer {k}")
        body = orjson.dumps(json) if json is not None else data
        if body is not None:
            hdrs.setdefault("Content-Type", "application/json")
        async with self.session.request(method, self.base_url + path, data=body, headers=hdrs) as r:
            raw = await r.read()
            try:
                parsed = orjson.loads(raw) if raw else None
            except orjson.JSONDecodeError:
                parsed = None
            return Response(r.status, r.headers, parsed, raw)

    async def get(self, path: str, **kw: Any) -> Response:
        return await self.request("GET", path, **kw)

    async def post(self, path: str, json: Any = None, **kw: Any) -> Response:
        return await self.request("POST", path, json=json, **kw)

    async def delete(self, path: str, **kw: Any) -> Response:
        return await self.request("DELETE", path, **kw)


@dataclass
class RunningApp:
    base_url: str
    runner: web.AppRunner

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_app(app: web.Application) -> RunningApp:
    """Serve ``app`` on a free loopback port (cleanup contexts run, as in production)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return RunningApp(f"http://127.0.0.1:{port}", runner)


def combined_app(settings: Settings) -> web.Application:
    """Both services in one app, exactly as ``authio serve`` builds it."""
    from common.runtime import base_app
    from control_plane.app import setup_control_plane
    from engine.checks import setup_engine

    app = base_app(settings)
    setup_engine(app)
    setup_control_plane(app)
    return app


async def wait_ready(api: Api, within: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        r = await api.get("/readyz", key=None)
        if r.status == 200:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"service not ready: {r.status} {r.body}")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def serving(http: ClientSession, app: web.Application, *, ready: bool = True) -> AsyncIterator[Api]:
    """Serve ``app`` on a loopback port, wait for /readyz unless ``ready`` is False, stop on exit."""
    running = await start_app(app)
    try:
        api = Api(http, running.base_url)
        if ready:
            await wait_ready(api)
        yield api
    finally:
        await running.stop()


STALL_SECONDS = 120.0


@pytest_asyncio.fixture(autouse=True)
async def report_stalls(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """If a test runs past ``STALL_SECONDS``, print every asyncio task's stack to standard error
    (thread dumps show only the event loop's select; run pytest with ``-s`` to see it at once).
    This is how a stopping app that awaited a worker which had swallowed its cancellation was
    found (asyncio.wait_for in Python 3.11; see tests/test_outbox.py)."""
    loop = asyncio.get_running_loop()

    def dump() -> None:
        print(f"\n--- {request.node.nodeid} has run {STALL_SECONDS:.0f} s; asyncio tasks:",
              file=sys.stderr)
        for task in asyncio.all_tasks(loop):
            task.print_stack(file=sys.stderr)

    handle = loop.call_later(STALL_SECONDS, dump)
    yield
    handle.cancel()


@pytest_asyncio.fixture(scope="session")
async def http() -> AsyncIterator[ClientSession]:
    async with ClientSession(timeout=ClientTimeout(total=60)) as session:
        yield session


@pytest_asyncio.fixture(scope="session")
async def service(settings_factory: Callable[..., Settings], http: ClientSession) -> AsyncIterator[Api]:
    """The whole service (both apps, one port) running for the session; no key attached."""
    running = await start_app(combined_app(settings_factory()))
    api = Api(http, running.base_url)
    await wait_ready(api)
    yield api
    await running.stop()


@pytest_asyncio.fixture(scope="session")
async def redis(redis_url: str, redis_prefix: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    keys = [k async for k in client.scan_iter(match=redis_prefix + "*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@contextlib.asynccontextmanager
async def database_pool(url: str, *, max_size: int = 3) -> AsyncIterator[asyncpg.Pool]:
    """A plain asyncpg pool on ``url`` (no jsonb codec: jsonb reads back as text), closed on
    exit."""
    pool = await asyncpg.create_pool(url, min_size=1, max_size=max_size)
    assert pool is not None
    try:
        yield pool
    finally:
        await pool.close()


@pytest_asyncio.fixture(scope="session")
async def db(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """Direct database access, for asserting what was stored (never to stand in for the API)."""
    async with database_pool(database_url) as pool:
        yield pool


@dataclass
class Project:
    id: str
    tenant_id: str
    key: str
    key_id: str
    api: Api


async def bootstrap_project(service: Api, name: str = "test") -> Project:
    r = await service.post(
        "/v1/bootstrap",
        {"tenant_name": f"{name} tenant", "project_name": name, "environment": "test"},
        headers={"x-service-bootstrap-token": BOOTSTRAP_TOKEN}, key=None,
    )
    assert r.status == 201, r.body
    return Project(r.body["project"]["id"], r.body["tenant"]["id"], r.body["api_key"]["secret"],
                   r.body["api_key"]["id"], service.with_key(r.body["api_key"]["secret"]))


@pytest_asyncio.fixture
async def project(service: Api) -> Project:
    """A fresh tenant and project with a full-access key, through POST /v1/bootstrap."""
    return await bootstrap_project(service)


@pytest_asyncio.fixture
async def new_project(service: Api) -> Callable[[str], Awaitable[Project]]:
    async def make(name: str = "other") -> Project:
        return await bootstrap_project(service, name)
    return make


def assert_error(r: Response, status: int, code: str) -> None:
    """The envelope of DESIGN.md with ``code`` and ``status``, and a matching request id."""
    assert r.status == status, (r.status, r.body)
    assert r.body["error"]["code"] == code, r.body
    assert isinstance(r.body["error"]["message"], str) and r.body["error"]["message"]
    assert isinstance(r.body["error"]["details"], dict)
    assert r.body["request_id"].startswith("req_") or r.body["request_id"]
    assert r.headers["X-Request-Id"] == r.body["request_id"]


# --- `authio serve` as a subprocess -----------------------------------------------------------


@dataclass
class ServedProcess:
    """A running ``authio serve`` with its output collected line by line."""

    proc: asyncio.subprocess.Process
    api: Api
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    readers: list[asyncio.Task[None]] = field(default_factory=list)

    def logs(self) -> str:
        return "".join(self.stderr)


async def _drain(stream: asyncio.StreamReader, sink: list[str]) -> None:
    while line := await stream.readline():
        sink.append(line.decode(errors="replace"))


@contextlib.asynccontextmanager
async def serve_process(http: ClientSession, env: dict[str, str], target: str = "all",
                        *args: str) -> AsyncIterator[ServedProcess]:
    """``authio serve <target> <args>`` on a free port, ready (``/readyz``), killed on exit if
    still up."""
    port = free_ports(1)[0]
    port_var = "SERVICE_ENGINE_PORT" if target == "engine" else "PORT"
    proc = await asyncio.create_subprocess_exec(
        AUTHIO, "serve", target, *args, cwd=ROOT, env={**env, port_var: str(port)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    served = ServedProcess(proc, Api(http, f"http://127.0.0.1:{port}"))
    served.readers = [asyncio.create_task(_drain(proc.stdout, served.stdout)),
                      asyncio.create_task(_drain(proc.stderr, served.stderr))]
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.returncode is not None:
                await asyncio.gather(*served.readers, return_exceptions=True)
                pytest.fail(f"authio serve {target} exited {proc.returncode}: "
                            f"{''.join(served.stdout)}{served.logs()}")
            with contextlib.suppress(OSError):
                if (await served.api.get("/readyz")).status == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"authio serve {target} not ready: {served.logs()}")
            await asyncio.sleep(0.1)
        yield served
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await asyncio.gather(*served.readers, return_exceptions=True)


async def stop_gracefully(served: ServedProcess, within: float = 10.0) -> int:
    """SIGTERM, then the exit code; fails the test if the process outlives ``within`` seconds."""
    served.proc.send_signal(signal.SIGTERM)
    try:
        code = await asyncio.wait_for(served.proc.wait(), timeout=within)
    except TimeoutError:
        pytest.fail(f"authio serve did not stop within {within} s of SIGTERM")
    await asyncio.gather(*served.readers, return_exceptions=True)
    return code


# --- the development mailbox (console message sink) -------------------------------------------


async def mailbox_messages(api: Api, destination: str, *, count: int = 1, within: float = 10.0,
                           also: Sequence[Api] = ()) -> list[dict[str, Any]]:
    """The messages ``GET /v1/dev/mailbox?destination=...`` lists for ``api``'s key (its
    project; newest first) once there are at least ``count``; fails the test after ``within``
    seconds. Each process shows only what its own outbox worker delivered, and every running
    app's worker delivers from the one outbox: a test that starts apps of its own names them in
    ``also`` (asked with ``api``'s key)."""
    from urllib.parse import urlencode

    path = "/v1/dev/mailbox?" + urlencode({"destination": destination, "limit": 1000})
    apis = [api, *(other.with_key(api.key) for other in also)]
    deadline = time.monotonic() + within
    while True:
        data: list[dict[str, Any]] = []
        for each in apis:
            r = await each.get(path)
            assert r.status == 200, (r.status, r.body)
            data += r.body["data"]
        if len(data) >= count:
            return sorted(data, key=lambda m: str(m["id"]), reverse=True)
        if time.monotonic() > deadline:
            pytest.fail(f"{len(data)} of {count} message(s) to {destination} reached the dev "
                        f"mailbox within {within} s")
        await asyncio.sleep(0.05)
