"""Helpers of the TLS tests: certificates from ``trustme`` written as an operator's files, the
service served over https as a subprocess, and raw TLS clients of a chosen version.

``trustme`` makes a private certificate authority and certificates it signs (ECDSA P-256 keys,
SHA-256), with the names asked for as subject alternative names: what a real private CA or
cert-manager issues, without a hand-made CA in the tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from aiohttp import ClientSession, ClientTimeout, TCPConnector

from tests.fixtures.service import BOOTSTRAP_TOKEN, ServedProcess, serve_process

HOST = "127.0.0.1"
NAMES = ("127.0.0.1", "localhost")


@dataclass
class ServerFiles:
    """A certificate chain and its key as PEM files (what ``SERVICE_TLS_CERT_FILE`` and
    ``SERVICE_TLS_KEY_FILE`` name), and the certificate's serial number."""

    cert: Path
    key: Path
    serial: int


def issue(ca: trustme.CA, directory: Path, *names: str,
          key_type: trustme.KeyType = trustme.KeyType.ECDSA) -> ServerFiles:
    """A server certificate of ``ca`` for ``names`` (default: 127.0.0.1 and localhost) with a
    ``key_type`` key, written into ``directory`` as ``server.crt`` (leaf, then the chain) and
    ``server.key``."""
    leaf = ca.issue_cert(*(names or NAMES), key_type=key_type)
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "server.crt", directory / "server.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(key))
    key.chmod(0o600)
    from cryptography import x509

    serial = x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes()).serial_number
    return ServerFiles(cert, key, serial)


def replace_files(files: ServerFiles, new: ServerFiles) -> None:
    """Put ``new``'s certificate and key in place of ``files``'s, each file by an atomic rename
    (as a Kubernetes Secret volume or cert-manager's writer swaps them)."""
    for source, target in ((new.cert, files.cert), (new.key, files.key)):
        staged = target.with_suffix(".new")
        staged.write_bytes(source.read_bytes())
        os.replace(staged, target)
    files.serial = new.serial


def client_context(ca: trustme.CA, *, minimum: ssl.TLSVersion | None = None,
                   maximum: ssl.TLSVersion | None = None, ciphers: str | None = None
                   ) -> ssl.SSLContext:
    """A verifying client context trusting ``ca`` only, limited to the versions given."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca.configure_trust(context)
    if ciphers is not None:
        context.set_ciphers(ciphers)
    if minimum is not None:
        context.minimum_version = minimum
    if maximum is not None:
        context.maximum_version = maximum
    return context


@dataclass
class Handshake:
    """What a client saw of one TLS handshake: version, cipher suite, the server's serial."""

    version: str
    cipher: str
    serial: int
    local_port: int


def handshake(port: int, context: ssl.SSLContext, *, host: str = HOST,
              server_name: str = HOST) -> Handshake:
    """One TLS connection to ``host:port``, closed at once. Raises ssl.SSLError (or OSError)
    when the handshake fails."""
    with socket.create_connection((host, port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=server_name) as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        from cryptography import x509

        serial = x509.load_der_x509_certificate(der).serial_number
        version, cipher = tls.version(), tls.cipher()
        assert version is not None and cipher is not None
        return Handshake(version, cipher[0], serial, tls.getsockname()[1])


def https_session(ca: trustme.CA) -> ClientSession:
    """An aiohttp client trusting ``ca`` that opens a new connection for every request (so each
    request shows the certificate served at that moment)."""
    return ClientSession(connector=TCPConnector(ssl=client_context(ca), force_close=True),
                         timeout=ClientTimeout(total=30))


def service_env(database_url: str, redis_url: str, redis_prefix: str,
                files: ServerFiles | None) -> dict[str, str]:
    """The environment of an ``authio serve`` subprocess: the run's database and Redis, the TLS
    files when given, nothing inherited that would change the service, no telemetry export."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "SERVICE_"))
           and k not in ("PORT", "DATABASE_URL", "REDIS_URL", "SSL_CERT_FILE", "SSL_CERT_DIR")}
    env.update(DATABASE_URL=database_url, REDIS_URL=redis_url, SERVICE_REDIS_PREFIX=redis_prefix,
               SERVICE_BOOTSTRAP_TOKEN=BOOTSTRAP_TOKEN, SERVICE_KMS_KEY=os.environ["SERVICE_KMS_KEY"],
               SERVICE_PG_POOL_MAX="3", SERVICE_ENGINE_POLL_SECONDS="0.5", OTEL_EXPORTER="none",
               SERVICE_LOG_LEVEL="INFO")
    if files is not None:
        env.update(SERVICE_TLS_CERT_FILE=str(files.cert), SERVICE_TLS_KEY_FILE=str(files.key))
    return env


Served = ServedProcess
"""A running ``authio serve`` over https: its process, port and output so far."""


@contextlib.asynccontextmanager
async def serve_https(http: ClientSession, env: dict[str, str], target: str, *args: str,
                      within: float = 60.0) -> AsyncIterator[Served]:
    """``authio serve <target> <args>`` on a free port, ready over https (``/readyz`` 200
    through ``http``, which must trust the server's CA), SIGTERMed (then killed) on exit."""
    async with serve_process(http, env, target, *args, base=f"https://{HOST}", within=within,
                             sigterm=True) as served:
        yield served


async def until_logged(served: Served, text: str, *, count: int = 1, within: float = 10.0) -> None:
    """Until ``text`` appeared ``count`` times in the process's output."""
    deadline = time.monotonic() + within
    while served.logs().count(text) < count:
        if time.monotonic() > deadline:
            pytest.fail(f"{text!r} not logged {count} times within {within} s: {served.logs()}")
        await asyncio.sleep(0.05)
