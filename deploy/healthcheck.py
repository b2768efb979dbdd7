"""The container's health check: exit 0 when the service in this container answers ``GET /healthz``.

One image runs the engine (``SERVICE_ENGINE_PORT``, default 8081), the control plane or both
(``PORT``, default 8080), so the check asks both ports on the loopback address and is healthy when
either answers 200 within 2 seconds; a container runs one service, so only its own port answers.
It asks over HTTP, and over HTTPS (the certificate unchecked: the loopback address is not the name
the certificate carries) when a port refuses plain HTTP, for a service serving TLS itself.
Standard library only. Exit status: 0 healthy, 1 not (the reason on standard error).

Docker runs it as the image's ``HEALTHCHECK``; Kubernetes ignores that and probes ``/healthz`` and
``/readyz`` itself (``deploy/kubernetes``).
"""

from __future__ import annotations

import os
import ssl
import sys
import urllib.request

TIMEOUT_S = 2.0


def answers(url: str, context: ssl.SSLContext | None = None) -> bool:
    """Whether ``url`` answers 200 within :data:`TIMEOUT_S`."""
    opener = urllib.request.build_opener(  # no proxy from the environment for the loopback
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(url, timeout=TIMEOUT_S) as reply:
            return bool(reply.status == 200)
    except (OSError, ValueError) as exc:  # URLError, HTTPError, timeouts, TLS errors
        print(f"{url}: {exc}", file=sys.stderr)
        return False


def main() -> int:
    host = os.environ.get("SERVICE_HOST", "")
    if host in ("", "0.0.0.0", "::", "[::]"):  # bound to every address: ask the loopback one
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    unchecked = ssl.create_default_context()
    unchecked.check_hostname = False
    unchecked.verify_mode = ssl.CERT_NONE
    for port in dict.fromkeys((os.environ.get("PORT", "8080"),
                               os.environ.get("SERVICE_ENGINE_PORT", "8081"))):
        if answers(f"http://{host}:{port}/healthz") or \
                answers(f"https://{host}:{port}/healthz", unchecked):
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
