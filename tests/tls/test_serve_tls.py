"""``authio serve`` speaking TLS itself (issue 24; SPEC.md 1: TLS 1.2 or newer; docs/tls.md).

The service runs as an operator runs it, ``authio serve all`` as a subprocess with
``SERVICE_TLS_CERT_FILE`` and ``SERVICE_TLS_KEY_FILE`` naming PEM files a private CA issued
(``trustme``), and the tests are its clients: Python's own TLS (OpenSSL) at the version and with
the suites each test chooses, aiohttp for HTTP over it, and a raw socket for plain HTTP.

This module's server holds an RSA certificate (the commonest kind, and the one that could offer
RSA key exchange if allowed); the engine workers' test (``test_engine_workers_tls``) an ECDSA
one.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import socket
import ssl
import termios
import threading
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
import trustme
from aiohttp import ClientSession

from common.tls import HSTS
from tests.fixtures.identity import email, latest_link, send_link
from tests.fixtures.service import AUTHIO, Api, bootstrap_project
from tests.tls.helpers import (
    HOST,
    Served,
    ServerFiles,
    client_context,
    handshake,
    https_session,
    issue,
    replace_files,
    serve_https,
    service_env,
    until_logged,
)

AEAD_TLS12 = ("ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384",
              "ECDHE-RSA-CHACHA20-POLY1305")
"""The TLS 1.2 suites an RSA certificate is served with: ECDHE, AEAD."""
REFUSED_TLS12 = {
    "RSA key exchange (no forward secrecy)": "AES128-GCM-SHA256:AES256-GCM-SHA384",
    "CBC with SHA-1": "ECDHE-RSA-AES128-SHA:ECDHE-RSA-AES256-SHA",
    "CBC with SHA-2": "ECDHE-RSA-AES128-SHA256:ECDHE-RSA-AES256-SHA384",
}
"""TLS 1.2 suites a client may offer that the server must refuse, offered alone. (Finite-field
DHE is left out of the cipher list too, but neither server here has DH parameters, so the
control could not show it accepted.)"""
RSA = trustme.KeyType.RSA


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA(key_type=RSA)


@pytest.fixture(scope="module")
def files(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> ServerFiles:
    return issue(ca, tmp_path_factory.mktemp("tls") / "live", key_type=RSA)


@pytest_asyncio.fixture(scope="module")
async def https(ca: trustme.CA) -> AsyncIterator[ClientSession]:
    async with https_session(ca) as session:
        yield session


@pytest_asyncio.fixture(scope="module")
async def served(https: ClientSession, files: ServerFiles, tls_database_url: str, redis_url: str,
                 redis_prefix: str) -> AsyncIterator[Served]:
    """``authio serve all`` over https with ``files``, for the tests that do not change them."""
    async with serve_https(https, service_env(tls_database_url, redis_url, redis_prefix, files),
                           "all") as running:
        yield running


def test_tls13_client_connects(served: Served, ca: trustme.CA, files: ServerFiles) -> None:
    """A client allowing every version gets TLS 1.3 and the configured certificate."""
    seen = handshake(served.port, client_context(ca))
    assert seen.version == "TLSv1.3"
    assert seen.cipher in ("TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256",
                           "TLS_AES_128_GCM_SHA256")
    assert seen.serial == files.serial


def test_tls12_client_gets_ecdhe_with_aead(served: Served, ca: trustme.CA) -> None:
    """A TLS 1.2 client offering everything its OpenSSL has gets ECDHE with an AEAD, and each
    of the three served suites works when offered alone."""
    everything = client_context(ca, maximum=ssl.TLSVersion.TLSv1_2, ciphers="ALL:@SECLEVEL=0")
    seen = handshake(served.port, everything)
    assert seen.version == "TLSv1.2"
    assert seen.cipher in AEAD_TLS12, seen
    for suite in AEAD_TLS12:
        alone = client_context(ca, maximum=ssl.TLSVersion.TLSv1_2, ciphers=suite)
        assert handshake(served.port, alone).cipher == suite


@pytest.mark.parametrize("what", REFUSED_TLS12)
def test_tls12_weak_suites_are_refused(served: Served, ca: trustme.CA, what: str) -> None:
    """A TLS 1.2 client offering only ``what`` cannot complete a handshake (the same client
    completes one with the permissive control server: ``test_a_tls11_client_is_refused``)."""
    weak = client_context(ca, maximum=ssl.TLSVersion.TLSv1_2,
                          ciphers=REFUSED_TLS12[what] + ":@SECLEVEL=0")
    with pytest.raises(OSError):  # ssl.SSLError: the server's alert, or its closing (EOF)
        handshake(served.port, weak)


@pytest.fixture(scope="module")
def permissive(files: ServerFiles) -> Iterator[int]:
    """The control: a TLS server of Python's own on the same certificate, allowing TLS 1.0 to
    1.3 and every suite. What the service refuses and this one accepts is refused by the
    service's configuration, not by the client's OpenSSL. Yields its port."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = ssl.TLSVersion.TLSv1
    context.set_ciphers("ALL:@SECLEVEL=0")
    context.load_cert_chain(files.cert, files.key)
    listener = socket.create_server((HOST, 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    tls.settimeout(2)
                    tls.recv(1)
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        listener.close()


def test_a_tls11_client_is_refused(served: Served, permissive: int, ca: trustme.CA) -> None:
    """A client speaking TLS 1.1 at most cannot complete a handshake; the same client completes
    TLS 1.1 with the permissive control server, so the refusal is the service's (SECLEVEL=0
    lets the client's OpenSSL offer TLS 1.1 and SHA-1). The TLS 1.2 suites refused by the
    service are taken by the control too."""
    with warnings.catch_warnings():  # Python deprecates naming TLS 1.1, rightly
        warnings.simplefilter("ignore", DeprecationWarning)
        tls11 = client_context(ca, minimum=ssl.TLSVersion.TLSv1_1,
                               maximum=ssl.TLSVersion.TLSv1_1, ciphers="ALL:@SECLEVEL=0")
    assert handshake(permissive, tls11).version == "TLSv1.1"
    with pytest.raises(OSError):  # ssl.SSLError: the server's alert, or its closing (EOF)
        handshake(served.port, tls11)
    for what, suites in REFUSED_TLS12.items():  # the control takes the refused suites too
        weak = client_context(ca, maximum=ssl.TLSVersion.TLSv1_2, ciphers=suites + ":@SECLEVEL=0")
        assert handshake(permissive, weak).version == "TLSv1.2", what


def test_plain_http_to_the_tls_port_gets_no_http_answer(served: Served) -> None:
    """A plaintext request to the TLS port is not answered in HTTP: the server closes the
    connection (after at most a TLS alert record)."""
    with socket.create_connection((HOST, served.port), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        received = b""
        while chunk := sock.recv(4096):
            received += chunk
    assert not received.startswith(b"HTTP/"), received
    assert received == b"" or received[0] == 0x15, received  # nothing, or a TLS alert record


def _raw_request(port: int, context: ssl.SSLContext, request: bytes) -> bytes:
    """``request`` written over one TLS connection; the bytes until the server closes it."""
    with socket.create_connection((HOST, port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=HOST) as tls:
        tls.sendall(request)
        received = b""
        while chunk := tls.recv(65536):
            received += chunk
        return received


async def test_every_response_carries_hsts(served: Served, ca: trustme.CA, http: ClientSession,
                                           service: Api) -> None:
    """``Strict-Transport-Security`` (two years, subdomains) is on a JSON answer, an error of
    the envelope, a streamed export, and what aiohttp's parser refuses before any handler;
    the plain-HTTP service of the test session sends none."""
    for path, status in (("/healthz", 200), ("/readyz", 200), ("/v1/no-such-route", 404),
                         ("/v1/users", 401)):
        r = await served.api.get(path)
        assert r.status == status, (path, r.body)
        assert r.headers.getall("Strict-Transport-Security") == [HSTS], path

    project = await bootstrap_project(served.api, "tls-hsts")
    r = await project.api.get("/v1/audit/events.jsonl")
    assert r.status == 200, r.body
    assert r.headers["Strict-Transport-Security"] == HSTS

    malformed = _raw_request(served.port, client_context(ca),
                             b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
    head = malformed.split(b"\r\n\r\n")[0].decode()
    assert head.startswith(("HTTP/1.0 400", "HTTP/1.1 400")), malformed
    assert f"Strict-Transport-Security: {HSTS}" in head.split("\r\n"), head

    plain = await service.get("/healthz")
    assert plain.status == 200 and "Strict-Transport-Security" not in plain.headers


async def test_links_name_https_when_the_service_serves_tls(served: Served) -> None:
    """Without ``SERVICE_BASE_URL`` the links the service sends name ``https://localhost`` and
    its port: plain http there would reach nothing."""
    project = await bootstrap_project(served.api, "tls-links")
    destination = email()
    r = await send_link(served.api, project, destination)
    assert r.status == 200, r.body
    link = await latest_link(project, destination)
    assert link.startswith(f"https://localhost:{served.port}/v1/auth/magic-link/verify?"), link


async def test_sighup_reloads_the_certificate(https: ClientSession, ca: trustme.CA,
                                              tmp_path: Path, tls_database_url: str,
                                              redis_url: str, redis_prefix: str) -> None:
    """SIGHUP after the files were replaced: the next connection is served the new certificate,
    and a connection opened before keeps working. A pair that does not load (a key that is not
    the certificate's) is logged and the previous certificate stays in service."""
    files = issue(ca, tmp_path / "live", key_type=RSA)
    first = files.serial
    env = service_env(tls_database_url, redis_url, redis_prefix, files)
    async with serve_https(https, env, "all") as running:
        assert handshake(running.port, client_context(ca)).serial == first
        reader, writer = await asyncio.open_connection(
            HOST, running.port, ssl=client_context(ca), server_hostname=HOST)
        try:
            replace_files(files, issue(ca, tmp_path / "second", key_type=RSA))
            running.proc.send_signal(signal.SIGHUP)
            await until_logged(running, "TLS reload: serving the certificate")
            assert handshake(running.port, client_context(ca)).serial == files.serial != first

            # The connection of before the reload still answers, on its old session.
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 5)
            assert answer.startswith(b"HTTP/1.1 200"), answer
        finally:
            writer.close()

        second = files.serial
        stranger = issue(ca, tmp_path / "third", key_type=RSA)
        files.key.write_bytes(stranger.key.read_bytes())  # the second certificate, another key
        running.proc.send_signal(signal.SIGHUP)
        await until_logged(running, "TLS reload: cannot load")
        assert "still serving the previous certificate" in running.logs()
        assert handshake(running.port, client_context(ca)).serial == second
        assert (await running.api.get("/healthz")).status == 200
        assert running.proc.returncode is None


def _encrypt_key(files: ServerFiles, passphrase: bytes) -> None:
    """Rewrite ``files.key`` encrypted with ``passphrase`` (PKCS#8, the best cipher available)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
    files.key.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(passphrase)))


async def test_an_encrypted_key_with_its_passphrase_file(
        https: ClientSession, ca: trustme.CA, tmp_path: Path, tls_database_url: str, redis_url: str,
        redis_prefix: str) -> None:
    """``SERVICE_TLS_KEY_PASSWORD_FILE`` opens an encrypted key (the file's trailing line break
    is not part of the passphrase); SIGHUP reads it again with the key."""
    files = issue(ca, tmp_path / "live", key_type=RSA)
    _encrypt_key(files, b"correct horse")
    passphrase = tmp_path / "passphrase"
    passphrase.write_bytes(b"correct horse\n")
    env = {**service_env(tls_database_url, redis_url, redis_prefix, files),
           "SERVICE_TLS_KEY_PASSWORD_FILE": str(passphrase)}
    async with serve_https(https, env, "all") as running:
        assert handshake(running.port, client_context(ca)).serial == files.serial
        new = issue(ca, tmp_path / "second", key_type=RSA)
        _encrypt_key(new, b"correct horse")
        replace_files(files, new)
        running.proc.send_signal(signal.SIGHUP)
        await until_logged(running, "TLS reload: serving the certificate")
        assert handshake(running.port, client_context(ca)).serial == new.serial


async def test_bad_tls_settings_stop_the_start(tls_database_url: str, redis_url: str,
                                               redis_prefix: str, tmp_path: Path,
                                               ca: trustme.CA) -> None:
    """A certificate without its key, a key that is not the certificate's, or an encrypted key
    with a wrong passphrase stops ``authio serve`` at start with a message naming the
    variables."""
    good, other = issue(ca, tmp_path / "a", key_type=RSA), issue(ca, tmp_path / "b", key_type=RSA)
    _encrypt_key(other, b"secret")
    wrong = tmp_path / "wrong"
    wrong.write_text("not the passphrase")
    base = service_env(tls_database_url, redis_url, redis_prefix, None)
    cases = {"only the certificate": {"SERVICE_TLS_CERT_FILE": str(good.cert)},
             "a key of another certificate": {"SERVICE_TLS_CERT_FILE": str(good.cert),
                                              "SERVICE_TLS_KEY_FILE": str(other.key)},
             "a wrong passphrase": {"SERVICE_TLS_CERT_FILE": str(other.cert),
                                    "SERVICE_TLS_KEY_FILE": str(other.key),
                                    "SERVICE_TLS_KEY_PASSWORD_FILE": str(wrong)}}
    for what, extra in cases.items():
        proc = await asyncio.create_subprocess_exec(
            AUTHIO, "serve", "all", env={**base, **extra},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 120)
        except TimeoutError:
            proc.kill()
            out, err = await proc.communicate()
            pytest.fail(f"{what}: still running after 120 s; it said:\n{(out + err).decode()[-3000:]}")
        assert proc.returncode != 0, what
        assert b"SERVICE_TLS_CERT_FILE" in out + err, (what, out, err)



def _on_a_terminal(slave: int) -> None:
    """In the child: a session of its own whose controlling terminal is the pty ``slave``,
    as for a service started by hand in a shell."""
    os.setsid()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)


async def test_an_encrypted_key_without_its_passphrase_file_stops_the_start_on_a_terminal(
        tls_database_url: str, redis_url: str, redis_prefix: str, tmp_path: Path,
        ca: trustme.CA) -> None:
    """Given no passphrase, OpenSSL asks for one on the controlling terminal ("Enter PEM pass
    phrase:") and waits there: started from a shell, the service hung instead of saying what is
    missing. Here ``authio serve`` runs with a pseudo-terminal as its controlling terminal and
    must stop at once, naming the variables, with nothing asked on the terminal."""
    files = issue(ca, tmp_path / "a", key_type=RSA)
    _encrypt_key(files, b"secret")
    env = {**service_env(tls_database_url, redis_url, redis_prefix, None),
           "SERVICE_TLS_CERT_FILE": str(files.cert), "SERVICE_TLS_KEY_FILE": str(files.key)}
    master, slave = os.openpty()
    try:
        proc = await asyncio.create_subprocess_exec(
            AUTHIO, "serve", "all", env=env, stdin=slave, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, preexec_fn=lambda: _on_a_terminal(slave))
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 60)
        except TimeoutError:
            proc.kill()
            out, err = await proc.communicate()
            os.set_blocking(master, False)
            try:
                asked = os.read(master, 4096)
            except BlockingIOError:
                asked = b""
            pytest.fail(f"still running after 60 s; the terminal was asked {asked!r}; it said:\n"
                        f"{(out + err).decode()[-2000:]}")
    finally:
        os.close(slave)
        os.close(master)
    assert proc.returncode != 0
    assert b"SERVICE_TLS_KEY_PASSWORD_FILE" in out + err or b"SERVICE_TLS_CERT_FILE" in out + err, \
        (out, err)
