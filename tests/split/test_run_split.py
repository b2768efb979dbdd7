"""``make run-split`` (``python -m devtools split``, issue 24): the engine's workers and the
control plane as separate processes behind a real nginx (Debian's, installed by the runner
when missing) with ``deploy/authio-routes.conf``'s routing, started as ``make run-split``
starts them, on free ports, with a database of its own that the runner migrates itself and a
real SMTP server (aiosmtpd) for the sign-in links.

Through nginx: bootstrap, a store and its tuples (control plane), check and batch-check
(engine), a magic-link sign-in read from the SMTP server, ``/v1/edge/validate`` and forward
auth; which process answers what is shown by routes only one of them has. Then forward auth's
refusals, with real nginx twice over: the ingress answers a request to ``/v1/edge/auth`` that
aiohttp's parser refuses (a method outside its list, more than 128 header lines, a control
character in a header value) with 401 or 403, never the engine's 400, which nginx's
``auth_request`` makes a 500; and the documented application configuration
(``docs/edge/nginx.conf``, asking the split's ingress) answers any such request 401 without a
session and 200 with one, the identity passed upstream. Finally Ctrl-C (SIGINT to the runner's
process group, as a terminal sends it) stops every process it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import psutil
import pytest
import pytest_asyncio
import redis
from aiohttp import ClientSession
from aiosmtpd.controller import Controller

from tests.fixtures.database import created_database
from tests.fixtures.peers import SmtpSink
from tests.fixtures.proxies import Proxy, nginx_serving, render
from tests.fixtures.service import (
    BOOTSTRAP_TOKEN,
    ROOT,
    Api,
    Project,
    bootstrap_project,
    free_ports,
)

READY_WITHIN = 180.0  # seconds: migrations, two engine workers and a control plane, on a busy box
STOP_WITHIN = 60.0
WORKERS = 2


# --- the runner ---------------------------------------------------------------------------------


@dataclass
class Runner:
    """``python -m devtools split`` running: its process (leader of its own process group, as a
    shell's foreground job is), its ports and its output."""

    process: subprocess.Popen[bytes]
    port: int
    engine_port: int
    control_port: int
    log: Path
    smtp: SmtpSink
    children: list[psutil.Process] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def descendants(self) -> list[psutil.Process]:
        return list(psutil.Process(self.process.pid).children(recursive=True))


@contextlib.contextmanager
def smtp(sink: SmtpSink) -> Iterator[int]:
    """aiosmtpd on a free loopback port (its own thread) for the duration."""
    port = free_ports(1)[0]
    controller = Controller(sink, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield port
    finally:
        controller.stop()


@contextlib.contextmanager
def redis_keys(url: str, prefix: str) -> Iterator[None]:
    """Deletes every Redis key starting with ``prefix`` on exit."""
    try:
        yield
    finally:
        client = redis.Redis.from_url(url)
        try:
            keys = list(client.scan_iter(match=prefix + "*"))
            if keys:
                client.delete(*keys)
        finally:
            client.close()


def _http_status(port: int, path: str) -> int | None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            conn.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            head = conn.recv(64)
    except OSError:
        return None
    m = re.match(rb"HTTP/1\.[01] (\d{3})", head)
    return int(m[1]) if m else None


@contextlib.contextmanager
def started(database_url: str, redis_url: str, workers: int) -> Iterator[Runner]:
    """The runner as ``make run-split`` starts it (the same entry point, on free ports, with
    ``workers`` engine workers), ready: nginx answers ``/readyz``. Interrupted and, if need be,
    killed at the end."""
    sink = SmtpSink()
    port, engine_port, control_port = free_ports(3)
    prefix = f"authio_split_{secrets.token_hex(4)}:"
    with created_database(database_url, "split") as db_url, smtp(sink) as smtp_port, \
            tempfile.TemporaryDirectory(prefix="authio-split-") as tmp, \
            redis_keys(redis_url, prefix):
        env = {
            **os.environ, "DATABASE_URL": db_url, "REDIS_URL": redis_url,
            "SERVICE_REDIS_PREFIX": prefix,
            "SERVICE_BOOTSTRAP_TOKEN": BOOTSTRAP_TOKEN, "OTEL_EXPORTER": "none",
            "SERVICE_EMAIL_SINK": "smtp", "SERVICE_SMTP_HOST": "127.0.0.1",
            "SERVICE_SMTP_PORT": str(smtp_port), "SERVICE_SMTP_TLS": "none",
            "SERVICE_MAGIC_LINK_RATE_PER_IP": "100000/minute",
        }
        for name in ("PORT", "SERVICE_BASE_URL", "SERVICE_HOST", "SERVICE_ENGINE_PORT"):
            env.pop(name, None)
        log = Path(tmp) / "split.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "devtools", "split", "--port", str(port),
                 "--engine-port", str(engine_port), "--control-plane-port", str(control_port),
                 "--workers", str(workers), "--run-dir", str(Path(tmp) / "run")],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        running = Runner(process, port, engine_port, control_port, log, sink)
        try:
            deadline = time.monotonic() + READY_WITHIN
            while _http_status(port, "/readyz") != 200:
                if process.poll() is not None:
                    pytest.fail(f"the runner exited {process.returncode}:\n{running.output()}",
                                pytrace=False)
                if time.monotonic() > deadline:
                    pytest.fail(f"nginx not ready within {READY_WITHIN:g} s:\n{running.output()}",
                                pytrace=False)
                time.sleep(0.2)
            running.children = running.descendants()
            yield running
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
                try:
                    process.wait(timeout=STOP_WITHIN)
                except subprocess.TimeoutExpired:
                    for child in running.descendants():
                        child.kill()
                    process.kill()
                    process.wait()
            for child in running.children:  # orphans, had the runner died without them
                if alive(child):
                    child.kill()


@pytest.fixture(scope="module")
def runner(database_url: str, redis_url: str) -> Iterator[Runner]:
    """:func:`started` with :data:`WORKERS` engine workers, for the module's tests."""
    with started(database_url, redis_url, WORKERS) as running:
        yield running


# --- the main flows through nginx -------------------------------------------------------------


@dataclass
class World:
    """What the main flows made through nginx: a project, a store (``doc:handbook`` viewable
    by ``viewer``) and a signed-in user's tokens."""

    api: Api
    project: Project
    store_id: str
    user_id: str
    session_id: str
    access_token: str


_LINK = re.compile(r"https?://\S+/v1/auth/magic-link/verify\?\S+#token=\S+")


async def _sign_in(api: Api, runner: Runner, project: Project) -> dict[str, Any]:
    """A magic link sent through nginx, read from the SMTP server, redeemed through nginx."""
    address = f"split-{secrets.token_hex(4)}@example.com"
    r = await api.post(f"/v1/auth/magic-link/send?project_id={project.id}",
                       {"destination": address}, key=None)
    assert r.status == 200, r.body
    received = await runner.smtp.wait_for(address)
    text = received[0].message.get_body(("plain",))
    assert text is not None
    link = _LINK.search(text.get_content())
    assert link is not None, text.get_content()
    # The link leads to the public address: nginx's, SERVICE_BASE_URL of both services.
    assert link[0].startswith(f"http://localhost:{runner.port}/"), link[0]
    token = parse_qs(urlsplit(link[0]).fragment)["token"][0]
    r = await api.post(f"/v1/auth/magic-link/verify?project_id={project.id}", {"token": token},
                       key=None)
    assert r.status == 200, r.body
    return dict(r.body)


@pytest_asyncio.fixture(scope="module")
async def world(runner: Runner, http: ClientSession) -> World:
    api = Api(http, runner.base_url)
    project = await bootstrap_project(api, "split")  # POST /v1/bootstrap, control plane
    store = await project.api.post("/v1/stores", {"name": "split"})
    assert store.status == 201, store.body
    signed = await _sign_in(api, runner, project)
    user = signed["user"]["id"]
    r = await project.api.post(f"/v1/stores/{store.body['id']}/write", {"writes": [
        {"object": "doc:handbook", "relation": "viewer", "user": f"user:{user}"},
        {"object": "doc:handbook", "relation": "viewer", "user": "user:ann"}]})
    assert r.status == 200, r.body
    # The engine follows the change log: a check at the write's revision waits for it.
    r = await project.api.post(f"/v1/stores/{store.body['id']}/check", {
        "tuple_key": {"object": "doc:handbook", "relation": "viewer", "user": f"user:{user}"},
        "consistency": {"at_least_revision": r.body["revision"]}})
    assert r.status == 200 and r.body["allowed"] is True, r.body
    return World(api, project, store.body["id"], user, signed["session"]["id"],
                 signed["access_token"])


async def test_the_main_flows_through_nginx(runner: Runner, world: World) -> None:
    key = world.project.api
    store = world.store_id
    r = await key.post(f"/v1/stores/{store}/check", {
        "tuple_key": {"object": "doc:handbook", "relation": "viewer", "user": "user:bob"}})
    assert r.status == 200 and r.body["allowed"] is False, r.body
    r = await key.post(f"/v1/stores/{store}/batch-check", {"checks": [
        {"tuple_key": {"object": "doc:handbook", "relation": "viewer", "user": "user:ann"}},
        {"tuple_key": {"object": "doc:handbook", "relation": "viewer", "user": "user:bob"}}]})
    assert r.status == 200, r.body
    assert [item["allowed"] for item in r.body["results"]] == [True, False]

    bearer = {"Authorization": f"Bearer {world.access_token}"}
    query = f"store_id={store}&object=doc:handbook&relation=viewer"
    r = await world.api.get(f"/v1/edge/validate?{query}", headers=bearer)
    assert r.status == 200, r.body
    assert r.headers["Service-User-Id"] == world.user_id
    assert r.headers["Service-Session-Id"] == world.session_id
    cookie = {"Cookie": f"service_session={world.access_token}"}
    r = await world.api.get("/v1/edge/auth/app/page", headers=cookie)
    assert r.status == 200, r.body
    assert r.headers["Service-Project-Id"] == world.project.id
    r = await world.api.get("/v1/edge/auth/app/page", headers={
        **cookie, "Service-Check-Store": store, "Service-Check-Object": "doc:other",
        "Service-Check-Relation": "viewer"})
    assert r.status == 403, r.body
    r = await world.api.get("/v1/edge/auth/app/page")
    assert r.status == 401 and r.body["error"]["code"] == "no_session", r.body


async def test_each_path_reaches_its_own_process(runner: Runner, world: World,
                                                 http: ClientSession) -> None:
    """Routes only one process has: the engine alone answers edge validation, the control plane
    alone lists stores and says how its maintenance goes in ``/readyz``; through nginx, both
    answer."""
    key = {"Authorization": f"Bearer {world.project.key}"}
    bearer = {"Authorization": f"Bearer {world.access_token}"}
    engine = f"http://127.0.0.1:{runner.engine_port}"
    control = f"http://127.0.0.1:{runner.control_port}"
    for base, validate, stores in ((engine, 200, 404), (control, 404, 200),
                                   (runner.base_url, 200, 200)):
        async with http.get(f"{base}/v1/edge/validate", headers=bearer) as r:
            assert r.status == validate, (base, r.status)
        async with http.get(f"{base}/v1/stores", headers=key) as r:
            assert r.status == stores, (base, r.status)
    async with http.get(f"{runner.base_url}/readyz") as r:
        assert r.status == 200 and "maintenance" in (await r.json())["detail"]
    async with http.get(f"{engine}/readyz") as r:
        assert r.status == 200 and "maintenance" not in (await r.json())["detail"]
    # The engine runs its workers under a supervisor: WORKERS processes listening on its port.
    listening = [c for c in runner.children
                 if any(conn.laddr and conn.laddr.port == runner.engine_port
                        and conn.status == psutil.CONN_LISTEN
                        for conn in _connections(c))]
    assert len(listening) == WORKERS, [p.cmdline() for p in runner.children]


def _connections(process: psutil.Process) -> list[Any]:
    with contextlib.suppress(psutil.Error):
        return list(process.net_connections(kind="tcp"))
    return []


# --- forward auth's refusals --------------------------------------------------------------------


def raw(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """``(status, headers by lower-case name, body)`` of ``request`` sent as bytes (aiohttp's
    client would refuse to send what these tests send)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip()
               for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, body


def request(method: str, path: str, *headers: bytes) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: app.example\r\nConnection: close\r\n".encode()
            + b"".join(h + b"\r\n" for h in headers) + b"\r\n")


MANY = tuple(b"X-Extra-%d: v" % i for i in range(200))  # aiohttp reads 128 header lines at most
CONTROL = b"X-Note: a\x01b"  # aiohttp refuses a control character in a header value
TOO_LONG = b"X-Note: " + b"a" * 12_000  # aiohttp reads 8190 bytes a header at most
SPOOFED = (b"Service-User-Id: user_spoofed", b"Service-Project-Id: proj_spoofed")


async def test_the_ingress_answers_forward_auth_it_cannot_read_401_or_403(
        runner: Runner, world: World) -> None:
    """``deploy/authio-routes.conf``: forward auth through the ingress is a GET without a body
    whatever the method, and what the engine's parser refuses is 403 ``forbidden``."""
    cookie = b"Cookie: service_session=" + world.access_token.encode()
    port, path = runner.port, "/v1/edge/auth/app/page"
    status, _, body = await asyncio.to_thread(raw, port, request("FOO", path))
    assert status == 401 and orjson.loads(body)["error"]["code"] == "no_session", body
    status, headers, _ = await asyncio.to_thread(raw, port, request("FOO", path, cookie))
    assert status == 200 and headers["service-user-id"] == world.user_id
    status, headers, _ = await asyncio.to_thread(
        raw, port, request("POST", path, cookie, b"Content-Length: 5") + b"hello")
    assert status == 200 and headers["service-user-id"] == world.user_id
    for extra in (MANY, (CONTROL,)):
        for with_session in ((), (cookie,)):
            status, headers, body = await asyncio.to_thread(
                raw, port, request("GET", path, *with_session, *extra))
            assert status == 403, (status, body[:300])
            error = orjson.loads(body)
            assert error["error"]["code"] == "forbidden", error
            assert error["error"]["details"] == {"reason": "invalid_request"}, error
            assert headers["x-request-id"] == error["request_id"]
            assert error["request_id"].startswith("req_"), error
    # Validation is not forward auth: what the engine cannot read stays its 400.
    status, _, body = await asyncio.to_thread(raw, port, request("GET", "/v1/edge/validate",
                                                                 *MANY))
    assert status == 400 and orjson.loads(body)["error"]["code"] == "invalid_request", body


@pytest.fixture(scope="module")
def application(runner: Runner, world: World, nginx_binary: str) -> Iterator[Proxy]:
    """``docs/edge/nginx.conf`` asking the split's ingress, in front of an application that is
    nginx too (it reads whatever nginx reads, so no refusal below is the application's): it
    answers 200 with the method and the identity headers it received as JSON. Its header
    buffers are raised to 32 KiB, as a site with big cookies raises them, so a single header
    can exceed what aiohttp reads."""
    port, app = free_ports(2)
    site = render("nginx.conf", {"ENGINE": f"127.0.0.1:{runner.port}",
                                 "APP": f"127.0.0.1:{app}", "LISTEN": f"127.0.0.1:{port}",
                                 "STORE_ID": world.store_id})
    echo = ('{"method":"$request_method","user":"$http_service_user_id",'
            '"session":"$http_service_session_id","project":"$http_service_project_id"}')
    upstream = (f"server {{\n  listen 127.0.0.1:{app};\n  location / {{\n"
                f"    default_type application/json;\n    return 200 '{echo}';\n  }}\n}}\n")
    with nginx_serving(nginx_binary, "large_client_header_buffers 4 32k;\n" + site + upstream,
                       port) as proxy:
        yield proxy


def _port(proxy: Proxy) -> int:
    return int(proxy.base_url.rsplit(":", 1)[1])


async def test_the_documented_application_never_answers_500(
        world: World, application: Proxy) -> None:
    """Whatever the client sends that aiohttp would refuse, the engine is asked only what it
    reads: no session is 401, a valid session passes with its identity (the client's own
    ``Service-*`` headers replaced), and the permission of ``/docs/`` still holds."""
    port = _port(application)
    cookie = b"Cookie: service_session=" + world.access_token.encode()
    bearer = b"Authorization: Bearer " + world.access_token.encode()
    big_cookie = b"Cookie: tracking=" + b"t" * 12_000 + b"; service_session=" \
        + world.access_token.encode()
    cases: list[tuple[str, tuple[bytes, ...]]] = [
        ("unknown method", ()), ("200 header lines", MANY), ("control character", (CONTROL,)),
        ("12 kB header", (TOO_LONG,)), ("spoofed identity", SPOOFED)]
    for what, extra in cases:
        method = "FOO" if what == "unknown method" else "GET"
        status, _, body = await asyncio.to_thread(raw, port, request(method, "/app/x", *extra))
        assert status == 401, (what, status, body[:200], application.logs()[-2000:])
        for token in (cookie, bearer):
            status, _, body = await asyncio.to_thread(
                raw, port, request(method, "/app/x", token, *extra))
            assert status == 200, (what, status, body[:200], application.logs()[-2000:])
            seen = orjson.loads(body)
            assert seen == {"method": method, "user": world.user_id,
                            "session": world.session_id, "project": world.project.id}, seen
    # The session cookie among 12 kB of others: only it goes to the engine.
    status, _, body = await asyncio.to_thread(raw, port, request("GET", "/app/x", big_cookie))
    assert status == 200 and orjson.loads(body)["user"] == world.user_id, body
    # A token the engine could not read is refused like any token that is not a JWT, and a
    # Bearer token still wins over the cookie.
    for token in (b"Authorization: Bearer " + b"a" * 12_000, b"Authorization: Bearer a\x01b",
                  b"Cookie: service_session=a\x7fb"):
        status, _, body = await asyncio.to_thread(raw, port, request("GET", "/app/x", token))
        assert status == 401, (token[:40], status, body[:200])
    for token in (b"Authorization: Bearer " + b"a" * 12_000, b"Authorization: Bearer a\x01b"):
        status, _, body = await asyncio.to_thread(raw, port, request("GET", "/app/x", token,
                                                                     cookie))
        assert status == 401, (token[:40], status, body[:200])
    # The permission of /docs/: the signed-in user is a viewer of doc:handbook.
    status, _, _ = await asyncio.to_thread(raw, port, request("GET", "/docs/x", cookie, *MANY))
    assert status == 200
    status, _, _ = await asyncio.to_thread(raw, port, request("GET", "/docs/x", *MANY))
    assert status == 401


# --- stopping -----------------------------------------------------------------------------------


async def test_ctrl_c_stops_all_of_it(runner: Runner) -> None:
    """SIGINT to the runner's process group, as a terminal's Ctrl-C: nginx, the engine's
    supervisor and workers and the control plane all exit, the runner with status 0, and the
    ports are free again."""
    children = runner.descendants()
    names = " ".join(" ".join(p.cmdline()) for p in children)
    assert "nginx" in names and "serve engine" in names and "serve control-plane" in names, names
    assert len(children) >= 3 + WORKERS, names
    os.killpg(runner.process.pid, signal.SIGINT)
    code = await asyncio.to_thread(runner.process.wait, STOP_WITHIN)
    assert code == 0, runner.output()[-3000:]

    await asyncio.to_thread(all_gone, runner, children, 10)
    assert "devtools split: stopped" in runner.output()


def alive(process: psutil.Process) -> bool:
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def all_gone(runner: Runner, children: list[psutil.Process], within: float) -> None:
    """Every one of ``children`` exits within ``within`` seconds, and nothing answers on the
    runner's ports any more."""
    deadline = time.monotonic() + within
    while left := [p for p in children if alive(p)]:
        if time.monotonic() > deadline:
            pytest.fail(f"still running {within:g} s later: {[p.cmdline() for p in left]}",
                        pytrace=False)
        time.sleep(0.1)
    for port in (runner.port, runner.engine_port, runner.control_port):
        assert _http_status(port, "/readyz") is None, port


def test_a_child_that_exits_stops_the_rest(database_url: str, redis_url: str) -> None:
    """The control plane killed: the runner stops nginx and the engine and exits with 1."""
    with started(database_url, redis_url, 1) as runner:
        children = runner.descendants()
        control = [p for p in children if "control-plane" in " ".join(p.cmdline())]
        assert len(control) == 1, [p.cmdline() for p in children]
        control[0].kill()
        code = runner.process.wait(STOP_WITHIN)
        assert code == 1, runner.output()[-3000:]
        all_gone(runner, children, within=10)
        assert "control plane exited with status -9; stopping the rest" in runner.output()


def test_what_the_runner_started_stops_when_it_dies(database_url: str,
                                                    redis_url: str) -> None:
    """The runner killed (SIGKILL: it can do nothing about it): the kernel sends each child
    SIGTERM (PR_SET_PDEATHSIG), and each stops, nginx's and the engine's workers with them."""
    with started(database_url, redis_url, WORKERS) as runner:
        children = runner.descendants()
        assert len(children) >= 3 + WORKERS, [p.cmdline() for p in children]
        runner.process.kill()
        runner.process.wait(STOP_WITHIN)
        all_gone(runner, children, within=STOP_WITHIN)
