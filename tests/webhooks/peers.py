"""The audit streams' real peers, each a private instance on a free port that the test starts and
stops (never the machine's shared one): ``nats-server`` with JetStream (Debian's package,
installed when missing), and moto's S3 in server mode (``moto_server``, a test dependency)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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


@dataclass
class NatsServer:
    """``nats-server -js`` on a free port, its store under ``directory``; ``restart`` keeps it."""

    directory: Path
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
        self.process = subprocess.Popen(
            [binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(self.port, self.process, "nats-server")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@contextlib.contextmanager
def nats_server(directory: Path) -> Iterator[NatsServer]:
    server = NatsServer(directory)
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
