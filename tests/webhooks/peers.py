"""The audit streams' real peers, each a private instance on a free port that the test starts and
stops (never the machine's shared one): ``nats-server`` with JetStream (Debian's package,
installed when missing), open or in operator mode (decentralized JWT authentication: the test's
own operator, accounts and users, :class:`NatsOperator`), and moto's S3 in server mode
(``moto_server``, a test dependency)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nkeys

from tests.fixtures.installs import debian_packages
from tests.fixtures.service import free_ports


def _wait_port(port: int, process: subprocess.Popen[bytes], what: str, within: float = 20) -> None:
    deadline = time.monotonic() + within
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start on port {port}")
        time.sleep(0.05)


def _nats_binary() -> str | None:
    return shutil.which("nats-server") or next(
        (p for p in ("/usr/sbin/nats-server", "/usr/bin/nats-server") if Path(p).exists()), None)


def nkey(prefix: int) -> Any:
    """A new NKey pair (``nkeys.KeyPair``) of the role ``prefix``, ``nkeys.PREFIX_BYTE_OPERATOR``,
    ``_ACCOUNT`` or ``_USER``: nkeys 0.2 generates none, so its seed encoding of 32 random bytes."""
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def nats_jwt(signer: Any, subject: str, name: str, nats: dict[str, Any]) -> str:
    """A NATS v2 JWT (nats-io/jwt's encoding) of ``subject`` (a public key) issued by ``signer``
    (a key pair), its ``nats`` claims given: ``jti`` is the unpadded base32 of the SHA-512/256
    of the standard claims without it, and the signature is the signer's Ed25519 one of
    ``<header>.<claims>``, each part base64url without padding."""
    standard = {"iat": int(time.time()), "iss": signer.public_key.decode(), "name": name,
                "sub": subject}
    digest = hashlib.new("sha512_256", json.dumps(standard, separators=(",", ":")).encode())
    claims = {"jti": base64.b32encode(digest.digest()).decode().rstrip("="), **standard,
              "nats": nats}
    signed = ".".join(_b64url(json.dumps(part, separators=(",", ":")).encode())
                      for part in ({"typ": "JWT", "alg": "ed25519-nkey"}, claims))
    return f"{signed}.{_b64url(signer.sign(signed.encode()))}"


_UNLIMITED: dict[str, Any] = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
                              "wildcards": True, "conn": -1, "leaf": -1}
_JETSTREAM: dict[str, Any] = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}


@dataclass
class NatsOperator:
    """An operator of the test's own and its accounts: ``SYS``, the system account (nats-server
    runs JetStream only with one), and ``audit``, with JetStream, whose users :meth:`creds`
    issues. The server trusts the operator and knows the accounts from its configuration
    (``resolver: MEMORY``, ``resolver_preload``)."""

    operator: Any = field(default_factory=lambda: nkey(nkeys.PREFIX_BYTE_OPERATOR))
    system: Any = field(default_factory=lambda: nkey(nkeys.PREFIX_BYTE_ACCOUNT))
    account: Any = field(default_factory=lambda: nkey(nkeys.PREFIX_BYTE_ACCOUNT))

    def config(self) -> str:
        """The server configuration's lines of decentralized authentication."""
        operator_key, system_key = self.operator.public_key.decode(), self.system.public_key.decode()
        operator_jwt = nats_jwt(self.operator, operator_key, "authio-tests", {
            "system_account": system_key, "type": "operator", "version": 2})
        accounts = {
            system_key: nats_jwt(self.operator, system_key, "SYS", {
                "limits": _UNLIMITED, "type": "account", "version": 2}),
            self.account.public_key.decode(): nats_jwt(
                self.operator, self.account.public_key.decode(), "audit", {
                    "limits": {**_UNLIMITED, **_JETSTREAM}, "type": "account", "version": 2}),
        }
        preload = "".join(f'  {key}: "{jwt}"\n' for key, jwt in accounts.items())
        return f'operator: "{operator_jwt}"\nresolver: MEMORY\nresolver_preload: {{\n{preload}}}\n'

    def creds(self, *, issuer: Any = None) -> str:
        """A new user's ``.creds`` file (nsc's format: the user JWT, then the user's seed), the
        user issued by ``issuer`` (an account key pair; by default ``audit``'s)."""
        user = nkey(nkeys.PREFIX_BYTE_USER)
        jwt = nats_jwt(issuer or self.account, user.public_key.decode(), "authio", {
            "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1, "type": "user",
            "version": 2})
        return (f"-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n"
                "************************* IMPORTANT *************************\n"
                "NKEY Seed printed below can be used to sign and prove identity.\n"
                "NKEYs are sensitive and should be treated as secrets.\n\n"
                f"-----BEGIN USER NKEY SEED-----\n{user.seed.decode()}\n------END USER NKEY SEED------\n\n"
                "*************************************************************\n")


@dataclass
class NatsServer:
    """``nats-server -js`` on a free port, its store under ``directory``; ``restart`` keeps it.
    With ``operator``, in operator mode: only that operator's users connect."""

    directory: Path
    operator: NatsOperator | None = None
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        debian_packages(["nats-server"], present=lambda: _nats_binary() is not None,
                        needed_by="the NATS stream tests")
        if not self.port:
            self.port = free_ports(1)[0]
        binary = _nats_binary()
        assert binary is not None
        command = [binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.directory)]
        if self.operator is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            config = self.directory / "operator.conf"
            config.write_text(self.operator.config())
            command += ["-c", str(config)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(self.port, self.process, "nats-server")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@contextlib.contextmanager
def nats_server(directory: Path, operator: NatsOperator | None = None) -> Iterator[NatsServer]:
    server = NatsServer(directory, operator)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def moto_s3() -> Iterator[str]:
    """moto's server (S3 among its services) on a free port; yields its endpoint URL."""
    port = free_ports(1)[0]
    binary = Path(sys.executable).parent / "moto_server"
    process = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port, process, "moto_server")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait()
