"""Magic-link sign-in and refresh, as a browser and the development mailbox do them.

One sign-in: ``POST /v1/auth/magic-link/send?project_id=`` ``{"destination"}`` (200, ``sent``),
the link read from ``GET /v1/dev/mailbox?destination=`` (the service's console sink keeps what it
delivered; needs a full-access key, and the service must serve the mailbox: a console e-mail
sink and a local base URL, or ``SERVICE_DEV_MAILBOX=true``), then
``POST /v1/auth/magic-link/verify?project_id=`` ``{"token"}`` (200 with ``access_token`` and
``refresh_token``). The mailbox reads are requests the bench makes, not an application's: they
are listed under their own name. A refresh is ``POST /v1/sessions/refresh``
``{"refresh_token"}`` with the pair of the previous answer (tokens rotate on every use). A new
sign-in signs the previous session out (``POST /v1/sessions/revoke``), as a user who signs in
again on another day.

Each sign-in comes from a fresh client address (``X-Forwarded-For``, believed when the service
has ``SERVICE_TRUSTED_PROXIES=127.0.0.1``; otherwise raise ``SERVICE_MAGIC_LINK_RATE_PER_IP``, whose
30/minute the whole load generator would share). Half the sign-ins (``AUTHIO_SIGNIN_RETURNING``,
default 0.5) are returning users, an address this simulated user signed in with at least 200 s
before (the per-address limit is 5 links in 15 minutes); the rest are new addresses, whose user
the first sign-in creates.

Settings: ``AUTHIO_PROJECT_ID``, ``AUTHIO_API_KEY`` (see ``scenarios.common``),
``AUTHIO_SIGNIN_RETURNING`` (0.5), ``AUTHIO_MAILBOX_TIMEOUT`` (10 s: how long the link may take to
arrive). Tags: ``magic-link`` (the sign-in), ``refresh``, ``signin`` (both).
"""

from __future__ import annotations

import os
import random
import re
import time
from typing import Any

import gevent
import orjson
from locust import FastHttpUser, tag, task
from locust.contrib.fasthttp import FastHttpSession

from scenarios import common

LINK_TOKEN = re.compile(r"/v1/auth/magic-link/verify\?\S*#token=([A-Za-z0-9_\-.~%]+)")
RETURN_AFTER_S = 200.0  # 5 links per address in 15 minutes: one per 180 s stays under


class Session:
    """A signed-in session: its tokens and whose it is."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.access_token = str(body["access_token"])
        self.refresh_token = str(body["refresh_token"])
        self.user_id = str(body["user"]["id"])
        self.session_id = str(body["session"]["id"])
        self.expires_at = common.jwt_exp(self.access_token)

    def update(self, body: dict[str, Any]) -> None:
        self.access_token = str(body["access_token"])
        self.refresh_token = str(body["refresh_token"])
        self.expires_at = common.jwt_exp(self.access_token)


class MagicLinkFlow:
    """Sign-ins and refreshes of one simulated user over ``client`` (its locust session)."""

    def __init__(self, client: FastHttpSession) -> None:
        self.client = client
        self.project = common.project_id()
        self.key_headers = common.key_headers()
        self.returning_share = float(os.environ.get("AUTHIO_SIGNIN_RETURNING", "0.5"))
        self.mailbox_timeout = float(os.environ.get("AUTHIO_MAILBOX_TIMEOUT", "10"))
        self.known: dict[str, float] = {}  # address -> when it last signed in
        self.seen_messages: set[str] = set()
        self.session: Session | None = None

    def _address(self) -> str:
        now = time.monotonic()
        ready = [a for a, t in self.known.items() if now - t >= RETURN_AFTER_S]
        if ready and random.random() < self.returning_share:
            return random.choice(ready)
        return common.new_email("ml")

    def sign_in(self, email: str | None = None) -> Session | None:
        """A whole magic-link sign-in; the new session, or None (the failed request is marked)."""
        email = email or self._address()
        headers = common.browser_headers(common.fresh_address())
        query = f"?project_id={self.project}"
        with self.client.post(f"/v1/auth/magic-link/send{query}",
                              data=orjson.dumps({"destination": email}), headers=headers,
                              name="POST /v1/auth/magic-link/send", catch_response=True) as resp:
            if common.expect(resp, 200, "sent") is None:
                return None
        token = self._read_link(email)
        if token is None:
            return None
        with self.client.post(f"/v1/auth/magic-link/verify{query}",
                              data=orjson.dumps({"token": token}), headers=headers,
                              name="POST /v1/auth/magic-link/verify", catch_response=True) as resp:
            body = common.expect(resp, 200, "access_token", "refresh_token", "user", "session")
            if body is None:
                return None
        self.known[email] = time.monotonic()
        return Session(body)

    def _read_link(self, email: str) -> str | None:
        """The token of the newest message to ``email`` not read before, polling the mailbox."""
        deadline = time.monotonic() + self.mailbox_timeout
        while True:
            with self.client.get(f"/v1/dev/mailbox?destination={email}&limit=1",
                                 headers=self.key_headers, catch_response=True,
                                 name="GET /v1/dev/mailbox (bench: reads the link)") as resp:
                body = common.expect(resp, 200, "data")
                if body is None:
                    return None
                for item in body["data"]:
                    if item["id"] not in self.seen_messages:
                        self.seen_messages.add(item["id"])
                        m = LINK_TOKEN.search(item["text"])
                        if m is None:
                            resp.failure(f"no sign-in link in message {item['id']}")
                            return None
                        return m.group(1)
                if time.monotonic() > deadline:
                    resp.failure(f"no new message to {email} within {self.mailbox_timeout} s")
                    return None
            gevent.sleep(0.02)

    def refresh(self, session: Session) -> bool:
        with self.client.post("/v1/sessions/refresh",
                              data=orjson.dumps({"refresh_token": session.refresh_token}),
                              headers={"Content-Type": "application/json",
                                       "User-Agent": common.BROWSER_UA},
                              name="POST /v1/sessions/refresh", catch_response=True) as resp:
            body = common.expect(resp, 200, "access_token", "refresh_token")
            if body is None:
                return False
        session.update(body)
        return True

    def sign_out(self, session: Session) -> None:
        with self.client.post("/v1/sessions/revoke", headers=common.bearer(session.access_token),
                              name="POST /v1/sessions/revoke", catch_response=True) as resp:
            if resp.status_code not in (200, 204):
                resp.failure(f"HTTP {resp.status_code}: {(resp.text or '')[:200]}")

    # The tasks of the scenario and of the mixed profile.

    def sign_in_again(self) -> None:
        """Sign the current session out (if any) and sign in anew."""
        if self.session is not None:
            self.sign_out(self.session)
            self.session = None
        self.session = self.sign_in()

    def refresh_current(self) -> None:
        if self.session is None:
            self.session = self.sign_in()
        elif not self.refresh(self.session):
            self.session = None  # a broken chain: sign in again next time


class MagicLinkUser(FastHttpUser):
    """Signs in by magic link now and then and refreshes its session between (1:3)."""

    weight = 1
    host = common.default_host()
    wait_time = common.wait_time()

    def on_start(self) -> None:
        self.flow = MagicLinkFlow(self.client)

    @tag("magic-link", "signin")
    @task(1)
    def magic_link_sign_in(self) -> None:
        self.flow.sign_in_again()

    @tag("refresh", "signin")
    @task(3)
    def refresh(self) -> None:
        self.flow.refresh_current()
