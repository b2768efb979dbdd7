"""``authio serve engine --workers 2`` over TLS (issue 24): every worker serves HTTPS with HSTS
on the shared port, and SIGHUP to the supervisor reloads the certificate in every worker.

Which worker took a connection is read from the kernel (``psutil``: the worker whose accepted
socket has the client's port as its peer), as ``tests/engine/test_engine_workers.py`` does; the
certificate here has an ECDSA key (``test_serve_tls`` uses RSA).
"""

from __future__ import annotations

import signal
import socket
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
import pytest_asyncio
import trustme
from aiohttp import ClientSession

from common.tls import HSTS
from tests.tls.helpers import (
    HOST,
    client_context,
    https_session,
    issue,
    replace_files,
    serve_https,
    service_env,
    until_logged,
)

WORKERS = 2


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest_asyncio.fixture(scope="module")
async def https(ca: trustme.CA) -> AsyncIterator[ClientSession]:
    async with https_session(ca) as session:
        yield session


def _worker_of(supervisor: int, port: int, peer: tuple[str, int]) -> int | None:
    """The supervisor's child whose accepted socket on ``port`` has ``peer`` as its remote end."""
    for child in psutil.Process(supervisor).children():
        try:
            for conn in child.net_connections(kind="tcp"):
                if conn.laddr.port == port and conn.raddr and (conn.raddr.ip, conn.raddr.port) == peer:
                    return child.pid
        except psutil.NoSuchProcess:
            continue
    return None


def _ask(supervisor: int, port: int, context: ssl.SSLContext) -> tuple[int, str, int, bytes]:
    """One TLS connection: (the worker that accepted it, the TLS version, the served
    certificate's serial, the head of the answer to ``GET /healthz``)."""
    from cryptography import x509

    with socket.create_connection((HOST, port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=HOST) as tls:
        worker = None
        deadline = time.monotonic() + 5
        while worker is None and time.monotonic() < deadline:
            worker = _worker_of(supervisor, port, tls.getsockname()[:2])
        assert worker is not None, "no worker holds the connection"
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        received = b""
        while chunk := tls.recv(65536):
            received += chunk
        version = tls.version()
        assert version is not None
        return (worker, version, x509.load_der_x509_certificate(der).serial_number,
                received.split(b"\r\n\r\n")[0])


def _every_worker(supervisor: int, port: int, context: ssl.SSLContext
                  ) -> dict[int, list[tuple[str, int, bytes]]]:
    """Connections until each of the :data:`WORKERS` workers has taken at least two (the
    kernel spreads them by a hash of the addresses): worker -> what each connection saw."""
    seen: dict[int, list[tuple[str, int, bytes]]] = {}
    for _ in range(400):
        worker, version, serial, head = _ask(supervisor, port, context)
        seen.setdefault(worker, []).append((version, serial, head))
        if len(seen) == WORKERS and all(len(v) >= 2 for v in seen.values()):
            return seen
    pytest.fail(f"400 connections reached {len(seen)} workers only")


async def test_every_worker_serves_tls_and_reloads_on_sighup(
        https: ClientSession, ca: trustme.CA, tmp_path: Path, tls_database_url: str,
        redis_url: str, redis_prefix: str) -> None:
    """Both workers answer over TLS 1.3 with HSTS; a TLS 1.2 client is served too. After the
    files are replaced and the supervisor gets SIGHUP, each worker logs the reload and every
    new connection, whichever worker takes it, is served the new certificate."""
    files = issue(ca, tmp_path / "live")
    first = files.serial
    env = service_env(tls_database_url, redis_url, redis_prefix, files)
    async with serve_https(https, env, "engine", "--workers", str(WORKERS)) as running:
        supervisor = running.proc.pid
        seen = _every_worker(supervisor, running.port, client_context(ca))
        for answers in seen.values():
            for version, serial, head in answers:
                assert (version, serial) == ("TLSv1.3", first)
                assert head.startswith(b"HTTP/1.1 200"), head
                assert f"Strict-Transport-Security: {HSTS}".encode() in head.split(b"\r\n")
        tls12 = client_context(ca, maximum=ssl.TLSVersion.TLSv1_2)
        assert {v for a in _every_worker(supervisor, running.port, tls12).values()
                for v, _, _ in a} == {"TLSv1.2"}

        replace_files(files, issue(ca, tmp_path / "second"))
        running.proc.send_signal(signal.SIGHUP)
        await until_logged(running, "TLS reload: serving the certificate", count=WORKERS)
        after = _every_worker(supervisor, running.port, client_context(ca))
        assert {serial for a in after.values() for _, serial, _ in a} == {files.serial}
        assert files.serial != first
        assert running.proc.returncode is None
        assert (await running.api.get("/readyz")).status == 200
