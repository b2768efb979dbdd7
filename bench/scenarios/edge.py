"""Forward auth at the engine: ``GET /v1/edge/auth`` with a session's access token, as nginx's
``auth_request`` (or Caddy, Traefik, Envoy) asks about every request of an application.

Each simulated user signs in once by magic link (``scenarios.signin``), and the set-up of the
user grants it ``viewer`` on ``document:edge-bench`` in the store (``POST
/v1/stores/{id}/write``, then waits until a check at that revision allows it). Then:

* ``GET /v1/edge/auth`` with ``Authorization: Bearer <access token>``: 200 and
  ``Service-User-Id`` naming the user (the session alone);
* the same with ``Service-Check-Store``, ``Service-Check-Object: document:edge-bench`` and
  ``Service-Check-Relation: viewer``: 200 (the session and a permission check), 1 in 3.

The access token lives 15 minutes (``SERVICE_ACCESS_TOKEN_TTL_SECONDS``): a user refreshes it at
the control plane (``POST /v1/sessions/refresh``) a minute before it expires, as an application
would, and signs in again if that fails.

Settings: those of ``scenarios.common`` and ``scenarios.checks`` (``AUTHIO_STORE_ID``),
``AUTHIO_EDGE_OBJECT`` (``document:edge-bench``). Tag: ``edge``.
"""

from __future__ import annotations

import os
import time

import orjson
from locust import FastHttpUser, tag, task
from locust.contrib.fasthttp import FastHttpSession

from scenarios import checks, common
from scenarios.signin import MagicLinkFlow, Session

REFRESH_BEFORE_S = 60.0


class EdgeFlow:
    """One signed-in browser whose requests an edge proxy validates."""

    def __init__(self, client: FastHttpSession) -> None:
        self.client = client
        self.signin = MagicLinkFlow(client)
        self.store = checks.store_id()
        self.object = os.environ.get("AUTHIO_EDGE_OBJECT", "document:edge-bench")
        self.session: Session | None = None

    def _ensure_session(self) -> Session | None:
        if self.session is not None and self.session.expires_at - time.time() > REFRESH_BEFORE_S:
            return self.session
        if self.session is not None and self.signin.refresh(self.session):
            return self.session
        self.session = self.signin.sign_in()
        if self.session is not None and not self._grant(self.session.user_id):
            self.session = None
        return self.session

    def _grant(self, user_id: str) -> bool:
        """``<object>#viewer@user:<id>`` written and visible to the engine."""
        write = {"writes": [{"object": self.object, "relation": "viewer",
                             "user": f"user:{user_id}"}], "deletes": []}
        with self.client.post(f"/v1/stores/{self.store}/write", data=orjson.dumps(write),
                              headers=common.key_headers(), catch_response=True,
                              name="POST /v1/stores/[id]/write (edge set-up)") as resp:
            body = common.expect(resp, 200, "revision")
            if body is None:
                return False
        check = {"tuple_key": {"object": self.object, "relation": "viewer",
                               "user": f"user:{user_id}"},
                 "consistency": {"at_least_revision": body["revision"]}}
        with self.client.post(f"/v1/stores/{self.store}/check", data=orjson.dumps(check),
                              headers=common.key_headers(), catch_response=True,
                              name="POST /v1/stores/[id]/check (edge set-up)") as resp:
            answer = common.expect(resp, 200, "allowed")
            if answer is None:
                return False
            if answer["allowed"] is not True:
                resp.failure(f"the grant just written is not seen: {answer}")
                return False
        return True

    def forward_auth(self, *, with_check: bool) -> None:
        session = self._ensure_session()
        if session is None:
            return
        headers = {"Authorization": f"Bearer {session.access_token}",
                   "X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/docs/handbook",
                   "X-Forwarded-Host": "app.bench.example.com"}
        name = "GET /v1/edge/auth"
        if with_check:
            headers.update({"Service-Check-Store": self.store, "Service-Check-Object": self.object,
                            "Service-Check-Relation": "viewer"})
            name += " (+ check)"
        with self.client.get("/v1/edge/auth", headers=headers, name=name,
                             catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")
            elif resp.headers.get("Service-User-Id") != session.user_id:
                resp.failure(f"Service-User-Id {resp.headers.get('Service-User-Id')!r}, "
                             f"expected {session.user_id}")


class ForwardAuthUser(FastHttpUser):
    """A proxy asking the engine about one signed-in browser's requests."""

    weight = 3
    host = common.default_host()
    wait_time = common.wait_time()

    def on_start(self) -> None:
        self.flow = EdgeFlow(self.client)

    @tag("edge")
    @task(2)
    def session_only(self) -> None:
        self.flow.forward_auth(with_check=False)

    @tag("edge")
    @task(1)
    def session_and_check(self) -> None:
        self.flow.forward_auth(with_check=True)
