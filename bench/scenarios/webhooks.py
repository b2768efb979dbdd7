"""Webhook fan-out: users created through the API, each ``user.created`` event delivered to
every subscribed endpoint, received by a receiver inside the locust process.

The receiver is a gevent WSGI server (locust's own event loop) on ``AUTHIO_WEBHOOK_LISTEN``
(default ``127.0.0.1:0``, a free port), started by the first simulated user that needs it, with
``AUTHIO_WEBHOOK_ENDPOINTS`` (default 2) endpoints created then (``POST /v1/webhook-endpoints``
``{"url": "<base>/hooks/<n>", "events": ["user.created"]}``; ``<base>`` is
``AUTHIO_WEBHOOK_URL_BASE``, default the receiver's own ``http://127.0.0.1:<port>``) and deleted
when the test stops. The service must allow a loopback ``http`` receiver:
``SERVICE_WEBHOOK_ALLOW_PRIVATE_URLS=true``.

* The task (tag ``webhooks``): ``POST /v1/users`` ``{"email"}`` (201), a new address each time.
* Each delivery is verified the Standard Webhooks way (``standardwebhooks``, the endpoint's
  secret) and answered 204; it is reported to locust as a request of type ``WEBHOOK`` named
  ``user.created delivered``, whose response time is the delay from the event's ``timestamp``
  (the server's clock: the same machine) to its arrival. A delivery that does not verify is a
  failure; so is a user whose event has not reached every endpoint within
  ``AUTHIO_WEBHOOK_TIMEOUT`` seconds (default 30; checked every second). Repeats (delivery is
  at least once) are counted as ``user.created delivered again``. Events of users this process
  did not create (sign-ups by the sign-in scenarios) are delivered too and timed the same way.

Settings: ``AUTHIO_API_KEY`` (``users:write`` and ``webhooks:write``), the ones above. Tag:
``webhooks``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import gevent
import gevent.lock
import orjson
import requests
from gevent.pywsgi import WSGIServer
from locust import FastHttpUser, events, tag, task
from locust.contrib.fasthttp import FastHttpSession
from locust.env import Environment
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from scenarios import common

log = logging.getLogger("authio.bench.webhooks")
DELIVERED = "user.created delivered"


class Receiver:
    """The endpoints' receiver and the ledger of what must arrive."""

    def __init__(self, environment: Environment, host: str) -> None:
        self.environment = environment
        self.host = host.rstrip("/")
        self.count = max(1, int(os.environ.get("AUTHIO_WEBHOOK_ENDPOINTS", "2")))
        self.timeout = float(os.environ.get("AUTHIO_WEBHOOK_TIMEOUT", "30"))
        self.endpoints: list[str] = []  # whep_ ids, by index
        self.verifiers: list[Webhook] = []
        self.pending: dict[tuple[str, int], float] = {}  # (user id, endpoint) -> created at
        self.seen: set[tuple[str, int]] = set()
        listen = os.environ.get("AUTHIO_WEBHOOK_LISTEN", "127.0.0.1:0")
        addr, _, port = listen.rpartition(":")
        self.server = WSGIServer((addr or "127.0.0.1", int(port)), self.app, log=None,
                                 error_log=None)
        self.server.start()
        self.base = os.environ.get("AUTHIO_WEBHOOK_URL_BASE") \
            or f"http://127.0.0.1:{self.server.server_port}"
        self.watchdog = gevent.spawn(self._watch)

    def subscribe(self) -> None:
        """Create the endpoints (raises on a refusal: nothing would be delivered)."""
        for n in range(self.count):
            r = requests.post(f"{self.host}/v1/webhook-endpoints", headers=common.key_headers(),
                              data=orjson.dumps({"url": f"{self.base}/hooks/{n}",
                                                 "events": ["user.created"],
                                                 "description": "locust webhook fan-out"}),
                              timeout=30)
            if r.status_code != 201:
                raise RuntimeError(f"creating a webhook endpoint: HTTP {r.status_code} {r.text}"
                                   " (does the service allow SERVICE_WEBHOOK_ALLOW_PRIVATE_URLS?)")
            body = r.json()
            self.endpoints.append(body["id"])
            self.verifiers.append(Webhook(body["secret"]))

    def expect(self, user_id: str) -> None:
        now = time.time()
        for n in range(self.count):
            if (user_id, n) not in self.seen:
                self.pending[(user_id, n)] = now

    def app(self, environ: dict[str, Any],
            start_response: Callable[[str, list[tuple[str, str]]], Any]) -> Iterable[bytes]:
        arrived = time.time()
        size = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(size)
        path = environ.get("PATH_INFO", "")
        try:
            n = int(path.rsplit("/", 1)[1])
            verifier = self.verifiers[n]
        except (IndexError, ValueError):
            start_response("404 Not Found", [])
            return [b""]
        headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items()
                   if k.startswith("HTTP_")}
        try:
            event = verifier.verify(body, headers)
        except WebhookVerificationError as exc:
            self._report(DELIVERED, 0.0, len(body), RuntimeError(f"does not verify: {exc}"))
            start_response("400 Bad Request", [])
            return [b""]
        key = (str(event["data"].get("target_id") or event["data"].get("user_id")), n)
        stamp = datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00"))
        lag_ms = max(0.0, (arrived - stamp.timestamp()) * 1000)
        self._report(DELIVERED + (" again" if key in self.seen else ""), lag_ms, len(body), None)
        self.seen.add(key)
        self.pending.pop(key, None)
        start_response("204 No Content", [])
        return [b""]

    def _report(self, name: str, ms: float, size: int, exc: Exception | None) -> None:
        self.environment.events.request.fire(request_type="WEBHOOK", name=name,
                                             response_time=ms, response_length=size,
                                             exception=exc, context={})

    def _watch(self) -> None:
        while True:
            gevent.sleep(1.0)
            now = time.time()
            for key, since in list(self.pending.items()):
                if now - since > self.timeout:
                    self.pending.pop(key, None)
                    self._report(DELIVERED, (now - since) * 1000, 0, RuntimeError(
                        f"user {key[0]}: no delivery to endpoint {key[1]} within "
                        f"{self.timeout:.0f} s"))

    def stop(self) -> None:
        self.watchdog.kill()
        for whep in self.endpoints:
            try:
                requests.delete(f"{self.host}/v1/webhook-endpoints/{whep}",
                                headers=common.key_headers(), timeout=10)
            except requests.RequestException as exc:
                log.warning("could not delete webhook endpoint %s: %s", whep, exc)
        if self.pending:
            log.info("%d deliveries still on their way when the test stopped", len(self.pending))
        self.server.stop(timeout=1)


_receiver: Receiver | None = None
_lock = gevent.lock.Semaphore()


def receiver(environment: Environment, host: str) -> Receiver:
    """The process's receiver, started (and subscribed) by the first caller."""
    global _receiver
    with _lock:
        if _receiver is None:
            made = Receiver(environment, host)
            try:
                made.subscribe()
            except Exception:
                made.stop()
                raise
            _receiver = made
        return _receiver


@events.test_stop.add_listener
def _stop_receiver(**_: Any) -> None:
    global _receiver
    if _receiver is not None:
        _receiver.stop()
        _receiver = None


class WebhookFlow:
    def __init__(self, client: FastHttpSession, environment: Environment, host: str) -> None:
        self.client = client
        self.receiver = receiver(environment, host)
        self.headers = common.key_headers()

    def create_user(self) -> None:
        with self.client.post("/v1/users", data=orjson.dumps({"email": common.new_email("wh")}),
                              headers=self.headers, name="POST /v1/users",
                              catch_response=True) as resp:
            body = common.expect(resp, 201, "id")
            if body is not None:
                self.receiver.expect(str(body["id"]))


class WebhookFanoutUser(FastHttpUser):
    """Creates users; their ``user.created`` events fan out to the receiver's endpoints."""

    weight = 1
    host = common.default_host()
    wait_time = common.wait_time()

    def on_start(self) -> None:
        self.flow = WebhookFlow(self.client, self.environment, self.host or "")

    @tag("webhooks")
    @task
    def create_user(self) -> None:
        self.flow.create_user()
