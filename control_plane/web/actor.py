"""The acting party of a request or a worker, and the per-request context a handler receives.

Every rule (a domain's ``service.py``) takes an :class:`Actor` and never a ``web.Request``; every
audit event records one (SPEC.md 2 "Audit event": actor type and id, API key id, IP, user agent).
A handler gets a :class:`Call`: the request, its actor and, for session routes, the verified
access-token claims; ``control_plane.web.auth`` builds it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg
from aiohttp import web
from asyncpg.pool import PoolAcquireContext

from common.access_tokens import AccessClaims
from common.appkeys import PG_POOL, SETTINGS
from common.auth import Principal
from common.http import json_response
from common.settings import Settings
from control_plane.web.cookies import set_session_cookie

ActorType = Literal["api_key", "user", "operator", "system", "anonymous", "scim", "portal"]


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts, in which project, and from where.

    * ``type``: ``api_key`` (a caller with a key), ``user`` (a person signing in or acting on
      their session), ``operator`` (a dashboard operator acting in the console, or the
      bootstrap token), ``system`` (a worker), ``anonymous`` (a public endpoint before anyone
      is known), ``scim`` (an organization's directory through its SCIM token).
    * ``id``: the key id, user id, operator id (``opr_``), ``bootstrap_token``, the worker's
      name or the SCIM token's id (``sct_``); None when unknown.
    * ``portal`` (type): an organization's IT administrator in the admin portal, known only by
      the setup link they opened; the id is the link's (``plk_``).
    * ``project_id``: the project acted in; None before one exists (bootstrap) or for a worker
      acting across projects.
    * ``api_key``: the calling key with its scopes and prefix (type ``api_key`` only).
    * ``ip``, ``user_agent``: of the request (the client's address behind trusted proxies);
      None for workers.
    """

    type: ActorType
    id: str | None
    project_id: str | None = None
    api_key: Principal | None = None
    ip: str | None = None
    user_agent: str | None = None

    @property
    def api_key_id(self) -> str | None:
        """The calling key's id, when the actor is a key."""
        return self.api_key.key_id if self.api_key is not None else None

    def as_user(self, user_id: str | None, *, project_id: str | None = None) -> Actor:
        """The same request acting as the user ``user_id`` (a sign-in once the user is known),
        in ``project_id`` when given."""
        return dataclasses.replace(self, type="user", id=user_id, api_key=None,
                                   project_id=project_id or self.project_id)

    def as_operator(self, operator_id: str, *, project_id: str | None) -> Actor:
        """The same request acting as the dashboard operator ``operator_id`` (signed in to the
        console) in ``project_id``: what the operator does is theirs in the audit log."""
        return dataclasses.replace(self, type="operator", id=operator_id, api_key=None,
                                   project_id=project_id)


def client_device(request: web.Request) -> dict[str, Any]:
    """What the client says about its device: the User-Agent and the User-Agent Client Hints
    (RFC 8942) it sent, verbatim; recorded with a sign-in attempt, and what the risk engine
    fingerprints."""
    h = request.headers
    hints = {"platform": h.get("Sec-CH-UA-Platform"), "mobile": h.get("Sec-CH-UA-Mobile"),
             "brands": h.get("Sec-CH-UA")}
    return {"user_agent": h.get("User-Agent"), **{k: v for k, v in hints.items() if v}}


def system_actor(name: str) -> Actor:
    """The actor of a background worker (``name``: what it is, e.g. ``signing_key_rotation``)."""
    return Actor(type="system", id=name)


@dataclass(frozen=True, slots=True)
class Call:
    """One request to a typed handler (``control_plane.web.endpoint``): the ``request``, its
    ``actor``, and the verified ``claims`` of the access token on session routes."""

    request: web.Request
    actor: Actor
    claims: AccessClaims | None = None

    @property
    def app(self) -> web.Application:
        return self.request.app

    @property
    def project_id(self) -> str:
        """The project of the call (API-key, session and public-project routes have one)."""
        assert self.actor.project_id is not None, "this route's auth names no project"
        return self.actor.project_id

    @property
    def session_claims(self) -> AccessClaims:
        """The verified access-token claims (session routes)."""
        assert self.claims is not None, "this route is not authenticated by a session"
        return self.claims

    def path(self, name: str) -> str:
        """The path parameter ``name`` (``{name}`` in the route's path)."""
        return self.request.match_info[name]

    @property
    def settings(self) -> Settings:
        return self.request.app[SETTINGS]

    @property
    def pool(self) -> asyncpg.Pool:
        """The PostgreSQL pool, for a read of one statement."""
        return self.request.app[PG_POOL]

    def connection(self) -> PoolAcquireContext:
        """A pooled PostgreSQL connection for the rule the handler calls."""
        return self.request.app[PG_POOL].acquire()

    def reply(self, data: Any, *, status: int = 200,
              headers: dict[str, str] | None = None) -> web.Response:
        """The JSON response of ``data`` (a dataclass or mapping) with ``request_id`` added."""
        return json_response(self.request, data, status=status, headers=headers)

    def reply_signed_in(self, data: Any, *, access_token: str, max_age: int) -> web.Response:
        """``reply(data)`` with the ``service_session`` cookie set to ``access_token``: the
        answer of every sign-in, organization change and refresh (SPEC.md 3)."""
        response = self.reply(data)
        set_session_cookie(response, access_token, max_age=max_age, settings=self.settings)
        return response

