"""PostgreSQL and Redis over verified TLS (issue 24; docs/tls.md): ``DATABASE_URL`` with
``sslmode=verify-full`` and ``sslrootcert``, ``REDIS_URL`` ``rediss://`` with ``ssl_ca_certs``
and ``ssl_cert_reqs=required``.

The servers are private ones of this module: a PostgreSQL cluster (``devtools``' private
instance) with ``ssl = on``, a certificate of a ``trustme`` CA, and ``pg_hba.conf`` rewritten to
``hostssl`` plus a ``hostnossl ... reject`` line, so a connection without TLS is refused by the
server; a ``redis-server`` (Debian's is built with TLS) listening on a ``--tls-port`` only. A
service that works against them has used TLS for every connection, and the servers say so
(``pg_stat_ssl``, ``CLIENT LIST``). Then the servers present certificates that do not name the
host the URLs give, and the same settings are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import asyncpg
import pytest
import pytest_asyncio
import trustme
from aiohttp import ClientSession
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from common.db import create_redis
from devtools import ensure_services
from devtools.services import PG_DIR, remove_private
from tests.fixtures.identity import email, sign_in
from tests.fixtures.service import AUTHIO, ROOT, bootstrap_project, free_ports, serve_process
from tests.tls.helpers import ServerFiles, issue, service_env

ELSEWHERE = "db.elsewhere.example"
"""A name the servers' second certificates hold instead of 127.0.0.1."""


@dataclass
class Backends:
    """The private servers, the CA file clients trust and the service's URLs for them."""

    ca: trustme.CA
    ca_file: Path
    run_dir: Path
    pg_port: int
    redis_port: int
    database_url: str
    redis_url: str
    directory: Path

    def admin_dsn(self) -> str:
        """An administrator's DSN: TLS without verification (the tests' own connection)."""
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/postgres?sslmode=require"


def _redis_tls(port: int, files: ServerFiles, ca_file: Path, directory: Path) -> subprocess.Popen[bytes]:
    """``redis-server`` with TLS only on ``port``, started and answering."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    proc = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(files.cert), "--tls-key-file", str(files.key),
         "--tls-ca-cert-file", str(ca_file), "--tls-auth-clients", "no",
         "--save", "", "--appendonly", "no", "--dir", str(directory)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    context = ssl.create_default_context(cafile=str(ca_file))
    context.check_hostname = False  # the second server's certificate names another host
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as raw, \
                    context.wrap_socket(raw) as tls:
                tls.sendall(b"PING\r\n")
                if tls.recv(16).startswith(b"+PONG"):
                    return proc
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            out = proc.stdout.read() if proc.stdout is not None and proc.poll() is not None else b""
            proc.kill()
            pytest.fail(f"redis-server with --tls-port did not start: {out.decode(errors='replace')}")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


async def _admin(backends: Backends, *statements: str) -> list[list[asyncpg.Record]]:
    conn = await asyncpg.connect(backends.admin_dsn())
    try:
        return [await conn.fetch(sql) for sql in statements]
    finally:
        await conn.close()


def _install_pg_certificate(backends: Backends, files: ServerFiles) -> None:
    """Copy ``files`` into the cluster's data directory (owned and readable by its user only,
    as PostgreSQL demands of a key), where ``ssl_cert_file``/``ssl_key_file`` name them."""
    data_dir = (backends.run_dir / PG_DIR).resolve()
    owner = data_dir.stat()
    for source, name in ((files.cert, "server.crt"), (files.key, "server.key")):
        target = data_dir / name
        target.write_bytes(source.read_bytes())
        os.chown(target, owner.st_uid, owner.st_gid)
        target.chmod(0o600)


@contextlib.contextmanager
def _private_backends() -> Iterator[Backends]:
    ca = trustme.CA()
    directory = Path(tempfile.mkdtemp(prefix="authio-tls-backends-"))
    run_dir = directory / "run"
    run_dir.mkdir()
    ca_file = directory / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    pg_port, plain_redis_port, redis_port = free_ports(3)
    redis_proc = None
    try:
        ensure_services(run_dir=run_dir, database_url=None, redis_url=None, force_private=True,
                        private_pg_port=pg_port, private_redis_port=plain_redis_port,
                        log=lambda _: None)
        query = f"sslmode=verify-full&sslrootcert={quote(str(ca_file))}"
        backends = Backends(
            ca, ca_file, run_dir, pg_port, redis_port,
            f"postgresql://postgres@127.0.0.1:{pg_port}/authio?{query}",
            f"rediss://127.0.0.1:{redis_port}/0?ssl_ca_certs={quote(str(ca_file))}"
            "&ssl_cert_reqs=required", directory)
        _install_pg_certificate(backends, issue(ca, directory / "pg"))

        async def configure() -> str:
            """Turn TLS on (without requiring it yet); the path of ``pg_hba.conf``."""
            conn = await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{pg_port}/postgres")
            try:
                await conn.execute("ALTER SYSTEM SET ssl_cert_file = 'server.crt'")
                await conn.execute("ALTER SYSTEM SET ssl_key_file = 'server.key'")
                await conn.execute("ALTER SYSTEM SET ssl = on")
                await conn.execute("SELECT pg_reload_conf()")
                return str(await conn.fetchval("SHOW hba_file"))
            finally:
                await conn.close()

        hba = Path(asyncio.run(configure()))
        lines = [("hostssl" + line[4:]) if line.startswith("host ") else line
                 for line in hba.read_text().splitlines()]
        hba.write_text("\n".join([*lines, "hostnossl all all all reject", ""]))
        asyncio.run(_admin(backends, "SELECT pg_reload_conf()"))
        redis_proc = _redis_tls(redis_port, issue(ca, directory / "redis"), ca_file,
                                directory)
        yield backends
    finally:
        if redis_proc is not None:
            _stop(redis_proc)
        remove_private(run_dir, log=lambda _: None)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def backends() -> Iterator[Backends]:
    with _private_backends() as made:
        yield made


async def _authio(*args: str, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        AUTHIO, *args, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


@pytest_asyncio.fixture(scope="module")
async def redis_admin(backends: Backends) -> AsyncIterator[Redis]:
    client = Redis.from_url(backends.redis_url)
    yield client
    await client.aclose()


async def test_the_service_runs_on_verified_tls(backends: Backends, http: ClientSession,
                                                redis_admin: Redis) -> None:
    """``authio migrate`` (alembic over SQLAlchemy's asyncpg dialect) and ``authio serve all``
    with the verify-full and rediss URLs: the schema is made, the engine follows the change log
    (a write is checked at its revision), and a magic-link sign-in (Redis: rate limits and the
    risk engine's counters) succeeds. PostgreSQL refuses any connection without TLS and sees
    the service's connections encrypted; Redis listens on its TLS port only."""
    env = service_env(backends.database_url, backends.redis_url, "authio-tls:", None)
    code, out = await _authio("migrate", env=env)
    assert code == 0, out

    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError, match="no encryption"):
        await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{backends.pg_port}/authio"
                              "?sslmode=disable")

    async with serve_process(http, env, "all") as served:
        project = await bootstrap_project(served.api, "tls-backends")
        store = await project.api.post("/v1/stores", {"name": "tls"})
        assert store.status == 201, store.body
        tuple_key = {"object": "doc:1", "relation": "viewer", "user": "user:ann"}
        written = await project.api.post(f"/v1/stores/{store.body['id']}/write",
                                         {"writes": [tuple_key]})
        assert written.status == 200, written.body
        checked = await project.api.post(
            f"/v1/stores/{store.body['id']}/check",
            {"tuple_key": tuple_key, "consistency": {"at_least_revision": written.body["revision"]}})
        assert (checked.status, checked.body["allowed"]) == (200, True), checked.body

        signed = await sign_in(project, email())
        assert signed.access_token

        [rows] = await _admin(backends, """
            SELECT a.application_name, s.ssl, s.version FROM pg_stat_activity a
            JOIN pg_stat_ssl s USING (pid)
            WHERE a.datname = 'authio' AND a.backend_type = 'client backend'""")
        assert len(rows) >= 2, rows  # the pool and the listeners
        assert all(r["ssl"] and r["version"] in ("TLSv1.2", "TLSv1.3") for r in rows), rows
        clients = await redis_admin.client_list()
        assert len(clients) >= 2, clients  # ours and the service's
        keys = [k async for k in redis_admin.scan_iter(match="authio-tls:*")]
        assert keys, "the service wrote nothing to Redis"


async def test_servers_not_named_by_the_urls_are_refused(backends: Backends) -> None:
    """The servers now present certificates of the same trusted CA for another name: with
    ``verify-full`` and ``rediss://`` (hostname checked) the service's connections are refused,
    ``authio migrate`` and ``authio serve`` fail on it, while ``sslmode=verify-ca`` (the chain
    only) still connects, so it is the name that is refused. A CA nobody trusts is refused too.
    """
    _install_pg_certificate(backends, issue(backends.ca, backends.directory / "pg-elsewhere",
                                            ELSEWHERE))
    await _admin(backends, "SELECT pg_reload_conf()")
    other_redis_port = free_ports(1)[0]
    other_redis = _redis_tls(other_redis_port, issue(backends.ca, backends.directory / "r2",
                                                     ELSEWHERE), backends.ca_file,
                             backends.directory)
    try:
        async def refused() -> str:
            with pytest.raises(ssl.SSLCertVerificationError) as caught:
                conn = await asyncpg.connect(backends.database_url)
                await conn.close()
            return str(caught.value)

        deadline = time.monotonic() + 10
        while "match" not in (reason := await refused()):  # the reload takes a moment
            assert time.monotonic() < deadline, reason
            await asyncio.sleep(0.2)
        assert "IP address mismatch" in reason or "Hostname mismatch" in reason, reason

        env = service_env(backends.database_url, backends.redis_url, "authio-tls:", None)
        code, out = await _authio("migrate", env=env)
        assert code != 0 and "certificate verify failed" in out, out
        port = free_ports(1)[0]
        code, out = await _authio("serve", "all", env={**env, "PORT": str(port)})
        assert code != 0 and "certificate verify failed" in out, out

        chain_only = backends.database_url.replace("verify-full", "verify-ca")
        conn = await asyncpg.connect(chain_only)
        await conn.close()

        stranger = tempfile.NamedTemporaryFile(suffix=".pem", dir=backends.directory, delete=False)
        trustme.CA().cert_pem.write_to_path(stranger.name)
        with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
            await asyncpg.connect(chain_only.replace(quote(str(backends.ca_file)),
                                                     quote(stranger.name)))

        wrong_host = backends.redis_url.replace(f":{backends.redis_port}/", f":{other_redis_port}/")
        client = create_redis(wrong_host)
        try:
            with pytest.raises(RedisConnectionError, match="certificate verify failed"):
                await client.ping()
        finally:
            await client.aclose()
    finally:
        _stop(other_redis)
        _install_pg_certificate(backends, issue(backends.ca, backends.directory / "pg-again"))
        await _admin(backends, "SELECT pg_reload_conf()")
