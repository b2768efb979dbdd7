"""``deploy/healthcheck.py``, the image's ``HEALTHCHECK``, run as Docker runs it (a process whose
exit status is the verdict: 0 healthy, 1 not) against real servers on loopback ports: plain HTTP,
HTTPS with a certificate the check cannot verify (``trustme``'s private CA, as a service serving
TLS itself would present for its public name), on either ``PORT`` or ``SERVICE_ENGINE_PORT``;
and unhealthy when nothing answers or ``/healthz`` answers 503. ``test_image.py`` runs it inside
the built image as well.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
import trustme

from tests.fixtures.service import ROOT, free_ports

CHECK = ROOT / "deploy" / "healthcheck.py"


@contextlib.contextmanager
def server(port: int, status: int, tls: ssl.SSLContext | None = None) -> Iterator[None]:
    """A server on ``127.0.0.1:port`` answering ``GET /healthz`` with ``status``."""
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status if self.path == "/healthz" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Health)
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def check(port: int, engine_port: int, host: str = "0.0.0.0") -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PORT": str(port),
           "SERVICE_ENGINE_PORT": str(engine_port), "SERVICE_HOST": host}
    return subprocess.run([sys.executable, str(CHECK)], env=env, capture_output=True, text=True,
                          timeout=30)


@pytest.fixture(scope="module")
def tls() -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    trustme.CA().issue_cert("auth.example.com").configure_cert(context)
    return context


@pytest.mark.parametrize("served", ["PORT", "SERVICE_ENGINE_PORT"])
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_healthy_when_the_served_port_answers_200(tls: ssl.SSLContext, served: str, scheme: str
                                                  ) -> None:
    port, engine_port = free_ports(2)
    with server(port if served == "PORT" else engine_port, 200,
                tls if scheme == "https" else None):
        done = check(port, engine_port)
    assert done.returncode == 0, done.stderr


def test_unhealthy_when_nothing_answers() -> None:
    port, engine_port = free_ports(2)
    done = check(port, engine_port)
    assert done.returncode == 1
    assert done.stderr.count("Connection refused") == 4  # both ports, both schemes


def test_unhealthy_when_healthz_fails() -> None:
    port, engine_port = free_ports(2)
    with server(port, 503):
        done = check(port, engine_port)
    assert done.returncode == 1 and "503" in done.stderr


def test_a_service_bound_to_one_address_is_asked_there() -> None:
    port, engine_port = free_ports(2)
    with server(engine_port, 200):
        assert check(port, engine_port, host="127.0.0.1").returncode == 0
        assert check(port, engine_port, host="127.0.0.2").returncode == 1
