"""Sessions: sign-in, organization context, refresh token rotation, revocation (SPEC.md 2, 3).

A session is a row in ``sessions``; the client holds a short-lived access JWT (the
``service_session`` cookie or a Bearer token) and an opaque refresh token. The state table of
SPEC.md 3 is implemented by these endpoints (S = session cookie or Bearer access token):

* ``POST /v1/sessions/select-org`` ``{"organization_id"}``: once per session, for a user with an
  active membership there (``not_a_member`` 403); a session that already has one answers
  ``org_already_selected`` (409) unless it is the same organization.
* ``POST /v1/sessions/switch-org`` ``{"organization_id"}``: to another organization with an
  active membership; ``session.org_switched`` is recorded. ``no_org_selected`` (409) before a
  first selection.
* ``POST /v1/sessions/refresh`` ``{"refresh_token"}``: authenticated by the refresh token alone
  (the access token may have expired, RFC 6749 6). The refresh token rotates; a rotated token
  presented again revokes the whole session (reuse detection, as the OAuth 2.0 Security BCP,
  RFC 9700 4.14.2, recommends), except a token the client presented less than
  ``SERVICE_REFRESH_REUSE_GRACE_SECONDS`` ago with no newer one presented since, so that a lost
  response or racing requests do not log the user out (``refresh`` has the rule in full). The
  organization is re-checked: a membership that is no longer active drops the org context.
* ``POST /v1/sessions/revoke``: revokes the session (every org context: the session id is what
  every token carries), adds it to the Redis revocation set and publishes it, clears the cookie.
* ``GET /v1/sessions/me``: the session and its user.

Failures are ``no_session`` (401) with ``details.reason`` saying why (``missing``,
``token_invalid``, ``token_expired``, ``session_revoked``, ``session_expired``,
``unknown_refresh_token``, ``refresh_token_reused``).

The revocation set is the Redis sorted set ``<prefix>revoked_sessions``: member the session id,
score the Unix time until which a token of that session may still verify (the latest access
token's ``exp`` plus leeway); members past their score are trimmed on every write. Each
revocation is also published on ``<prefix>session_revocations`` so engines can deny at once.
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

import asyncpg
from aiohttp import web
from redis.asyncio import Redis

from common.appkeys import PG_POOL, REDIS, SETTINGS
from common.auth import token_digest
from common.errors import InvalidRequest, NoOrgSelected, NoSession, NotAMember, OrgAlreadySelected
from common.http import json_response, read_json
from common.ids import is_id
from common.schemas import RequestModel, parse_body, parse_model
from common.settings import Settings
from control_plane import audit, users  # users imports this module: attributes at call time
from control_plane.appkeys import TOKENS
from control_plane.tokens import TokenService

log = logging.getLogger("authio.sessions")

COOKIE: Final = "service_session"  # SPEC.md 2: its value is the access JWT itself
REFRESH_PREFIX: Final = "rt_"
REVOCATION_LEEWAY_SECONDS: Final = 60  # verifiers' clock leeway, kept on the revocation set
SESSION_COLUMNS: Final = (
    "id, user_id, organization_id, status, auth_method, created_at, expires_at, "
    "last_refreshed_at, revoked_at"
)
_SESSION_FIELDS: Final = tuple(SESSION_COLUMNS.split(", "))


# --- revocation (Redis) ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Revoked:
    """A revoked session and the Unix time until which its access tokens could still verify."""

    session_id: str
    until: int


def revocation_set(prefix: str) -> str:
    return f"{prefix}revoked_sessions"


def revocation_channel(prefix: str) -> str:
    return f"{prefix}session_revocations"


def _revoked(session_id: str, access_expires_at: datetime) -> Revoked:
    return Revoked(session_id, int(access_expires_at.timestamp()) + REVOCATION_LEEWAY_SECONDS)


_REVOKE: Final = """UPDATE sessions SET status = 'revoked', revoked_at = now(), revoke_reason = $2
WHERE {where} AND status = 'active' RETURNING {columns}, access_expires_at"""


async def revoke_session(conn: asyncpg.Connection, session_id: str, *,
                         reason: str) -> tuple[dict[str, Any], Revoked] | None:
    """Mark the session revoked in ``conn``'s transaction: (its row, the Revoked to publish after
    commit), or None when it was not active."""
    row = await conn.fetchrow(_REVOKE.format(where="id = $1", columns=SESSION_COLUMNS),
                              session_id, reason)
    if row is None:
        return None
    session = dict(row)
    return session, _revoked(session_id, session.pop("access_expires_at"))


async def revoke_sessions_of_user(
    conn: asyncpg.Connection, *, user_id: str, reason: str
) -> list[Revoked]:
    """Mark every active session of ``user_id`` revoked, in ``conn``'s transaction; publish the
    result with ``publish_revocations`` after commit."""
    rows = await conn.fetch(_REVOKE.format(where="user_id = $1", columns="id"), user_id, reason)
    return [_revoked(r["id"], r["access_expires_at"]) for r in rows]


async def publish_revocations(redis: Redis, settings: Settings, revoked: Sequence[Revoked]) -> None:
    """Add ``revoked`` to the Redis revocation set and publish each id.

    PostgreSQL stays the source of truth: a Redis failure is logged, not raised, since the
    revocation already committed and the control plane refuses the session either way.
    """
    if not revoked:
        return
    now = int(time.time())
    key = revocation_set(settings.redis_prefix)
    try:
        async with redis.pipeline(transaction=True) as pipe:
            pipe.zadd(key, {r.session_id: r.until for r in revoked}, gt=True)
            pipe.zremrangebyscore(key, "-inf", now)
            ttl = max(r.until for r in revoked) - now + 1
            pipe.expire(key, ttl, nx=True)  # a new set gets a lifetime ...
            pipe.expire(key, ttl, gt=True)  # ... and an existing one only ever a longer one
            for r in revoked:
                pipe.publish(revocation_channel(settings.redis_prefix), r.session_id)
            await pipe.execute()
    except Exception:
        log.exception("could not publish session revocations",
                      extra={"sessions": [r.session_id for r in revoked]})


# --- tokens and the sign-in envelope ---------------------------------------------------------


def new_refresh_token() -> tuple[str, bytes]:
    """(plaintext, stored SHA-256 digest) of a new opaque refresh token."""
    token = REFRESH_PREFIX + secrets.token_urlsafe(32)
    return token, token_digest(token)


@dataclass(frozen=True, slots=True)
class Grant:
    """What a sign-in, an org change or a refresh hands back to the client."""

    session: dict[str, Any]
    user: dict[str, Any]
    access_token: str
    expires_in: int
    refresh_token: str | None  # None when the refresh token did not change

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "session": self.session, "user": self.user, "access_token": self.access_token,
            "token_type": "Bearer", "expires_in": self.expires_in,
        }
        if self.refresh_token is not None:
            out["refresh_token"] = self.refresh_token
        return out


def _session_body(row: asyncpg.Record | dict[str, Any], role: str | None) -> dict[str, Any]:
    s = dict(row)
    s["role"] = role if s.get("organization_id") else None
    return s


async def _active_role(conn: asyncpg.Connection, user_id: str, org_id: str) -> str | None:
    role: str | None = await conn.fetchval(
        """SELECT role FROM memberships
           WHERE user_id = $1 AND organization_id = $2 AND status = 'active'""",
        user_id, org_id,
    )
    return role


USER_UPDATE: Final = """
UPDATE users SET last_sign_in_at = now(),
       email_verified = email_verified OR $11, phone_verified = phone_verified OR $12
WHERE id = $3 {condition} RETURNING {user_columns}"""

_START: Final = f"""
WITH {{head}},
m AS (
    SELECT organization_id, role FROM memberships
    WHERE user_id = $3 AND status = 'active' AND ($4::text IS NULL OR organization_id = $4)
    LIMIT 2
), pick AS (
    SELECT CASE WHEN count(*) = 1 THEN min(organization_id) END AS organization_id,
           CASE WHEN count(*) = 1 THEN min(role) END AS role
    FROM m
), s AS (
    INSERT INTO sessions (id, project_id, user_id, organization_id, auth_method, ip, user_agent,
                          expires_at, access_expires_at)
    SELECT $1, $2, $3, pick.organization_id, $5, $6, $7, now() + $8::interval, to_timestamp($9)
    FROM pick, u{{gate}}
    RETURNING {SESSION_COLUMNS}
), r AS (
    INSERT INTO refresh_tokens (token_hash, session_id, generation) SELECT $10, s.id, 1 FROM s
), e AS (
    {audit.insert_from("s", 13, more_metadata="jsonb_build_object('organization_id', s.organization_id)")}
)
SELECT s.*, pick.role, {{user_fields}} FROM s, pick, u
"""


@functools.lru_cache(maxsize=8)
def _start_sql(head: str | None, gate: str) -> str:
    """``_START`` completed (once per head: a sign-in is a hot path)."""
    user_head = head or f"u AS ({USER_UPDATE.format(condition='', user_columns=users.USER_COLUMNS)})"
    return _START.format(head=user_head, gate=gate,
                         user_fields=", ".join(f"u.{f} AS user_{f}" for f in users.USER_FIELDS))


async def start_session(
    conn: asyncpg.Connection, settings: Settings, *, session_id: str, project_id: str,
    user_id: str, auth_method: str, ip: str | None, user_agent: str | None, iat: int,
    event: list[Any], organization_id: str | None = None,
    verified: Literal["email", "sms"] | None = None, head: str | None = None,
    gate: str = "", head_args: Sequence[Any] = (),
) -> tuple[dict[str, Any], str | None, str, dict[str, Any]] | None:
    """Sign ``user_id`` in, in one statement: the session ``session_id`` (``new_id("sess")``),
    its first refresh token, the user's ``last_sign_in_at`` (and the ``verified`` channel marked
    verified) and the audit ``event`` (``audit.event_values``; the organization picked is merged
    into its metadata). Returns (session body, role, refresh token, user).

    The organization is ``organization_id`` when given (an accepted invitation) and the
    membership there is active, else the one organization of a user with exactly one active
    membership (SPEC.md 3), else none.

    ``head`` replaces the CTE ``u`` (``USER_UPDATE``), which yields the user's row: a caller may
    create the user there, or make the sign-in conditional on CTEs of its own, named in ``gate``
    (``", t"``: the session is inserted only if ``u`` and ``t`` yield rows; otherwise nothing of
    this function's is written and None is returned), with ``head_args`` as parameters ``$26``
    on. Without ``head``, a user deleted meanwhile raises NoSession.
    """
    refresh, digest = new_refresh_token()
    row = await conn.fetchrow(
        _start_sql(head, gate),
        session_id, project_id, user_id, organization_id, auth_method, ip, user_agent,
        timedelta(seconds=settings.session_ttl_seconds), iat + settings.access_token_ttl_seconds,
        digest, verified == "email", verified == "sms", *event, *head_args,
    )
    if row is None:
        if head is not None:
            return None
        raise NoSession("The user no longer exists.", details={"reason": "session_revoked"})
    session = {k: row[k] for k in _SESSION_FIELDS}
    user = {k: row[f"user_{k}"] for k in users.USER_FIELDS}
    return _session_body(session, row["role"]), row["role"], refresh, user


async def grant(
    tokens: TokenService, settings: Settings, *, project_id: str, session: dict[str, Any],
    user: dict[str, Any], role: str | None, iat: int, refresh_token: str | None,
) -> Grant:
    """Sign the access token for ``session`` and assemble the response."""
    access = await tokens.issue(
        project_id=project_id, user_id=session["user_id"], session_id=session["id"],
        org_id=session["organization_id"], role=role, iat=iat,
    )
    return Grant(session, user, access, settings.access_token_ttl_seconds, refresh_token)


def grant_response(request: web.Request, g: Grant, *, status: int = 200) -> web.Response:
    """The envelope plus the ``service_session`` cookie (HttpOnly, SameSite=Lax, Path=/,
    Secure unless the service is on plain-HTTP localhost)."""
    response = json_response(request, g.body(), status=status)
    settings = request.app[SETTINGS]
    response.set_cookie(
        COOKIE, g.access_token, max_age=g.expires_in, path="/", httponly=True, samesite="Lax",
        secure=_secure_cookies(settings),
    )
    return response


@functools.lru_cache(maxsize=8)
def _secure_cookies(settings: Settings) -> bool:
    return not (settings.public_base_url.startswith("http://") and settings.base_url_is_local)


# --- the current session (S endpoints) -----------------------------------------------------


def require_json(request: web.Request) -> None:
    """Endpoints that set the session cookie take JSON bodies only (login CSRF): a form on
    another site can post text/plain, urlencoded or multipart bodies without a CORS preflight,
    and the SameSite=Lax cookie would then be set by a top-level navigation; a JSON post from
    another origin needs a preflight, which is never granted. Raises InvalidRequest."""
    if request.content_type != "application/json":
        raise InvalidRequest(
            "Content-Type must be application/json.",
            details={"fields": [{"field": "Content-Type", "message": "must be application/json"}]},
        )


def presented_access_token(request: web.Request) -> str | None:
    """The Bearer access token, else the ``service_session`` cookie."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.cookies.get(COOKIE) or None


async def current_session(request: web.Request, conn: asyncpg.Connection, *,
                          for_update: bool = False) -> dict[str, Any]:
    """The caller's active session (``SESSION_COLUMNS`` and ``project_id``), from the Bearer
    access token or the cookie; ``for_update`` locks its row. Raises NoSession."""
    token = presented_access_token(request)
    if token is None:
        raise NoSession(details={"reason": "missing"})
    claims = await request.app[TOKENS].verify(token)
    row = await conn.fetchrow(
        f"""SELECT {SESSION_COLUMNS}, project_id, now() > expires_at AS expired FROM sessions
            WHERE id = $1 {"FOR UPDATE" if for_update else ""}""",
        claims.sid,
    )
    if row is None or row["project_id"] != claims.pid or row["user_id"] != claims.sub:
        raise NoSession("The session no longer exists.", details={"reason": "session_revoked"})
    if row["status"] != "active":
        raise NoSession("The session was revoked.", details={"reason": "session_revoked"})
    if row["expired"]:
        raise NoSession("The session expired.", details={"reason": "session_expired"})
    session = dict(row)
    del session["expired"]
    return session


async def _user(conn: asyncpg.Connection, user_id: str) -> dict[str, Any]:
    row = await conn.fetchrow(f"SELECT {users.USER_COLUMNS} FROM users WHERE id = $1", user_id)
    if row is None:
        raise NoSession("The user no longer exists.", details={"reason": "session_revoked"})
    return dict(row)


class OrgBody(RequestModel):
    organization_id: str


async def _org_change(request: web.Request, *, switch: bool) -> web.Response:
    settings, tokens = request.app[SETTINGS], request.app[TOKENS]
    iat = int(time.time())
    async with request.app[PG_POOL].acquire() as conn, conn.transaction():
        s = await current_session(request, conn, for_update=True)  # no_session comes first
        require_json(request)
        body = await parse_body(request, OrgBody)
        previous = s["organization_id"]
        if switch and previous is None:
            raise NoOrgSelected()
        if not switch and previous is not None and previous != body.organization_id:
            raise OrgAlreadySelected(details={"organization_id": previous})
        role = None
        if is_id(body.organization_id, "org"):
            role = await conn.fetchval(
                """SELECT m.role FROM memberships m JOIN organizations o ON o.id = m.organization_id
                   WHERE m.user_id = $1 AND m.organization_id = $2 AND m.status = 'active'
                     AND o.project_id = $3""",
                s["user_id"], body.organization_id, s["project_id"],
            )
        if role is None:
            raise NotAMember(details={"organization_id": body.organization_id})
        row = await conn.fetchrow(
            f"""UPDATE sessions SET organization_id = $2,
                       access_expires_at = greatest(access_expires_at, to_timestamp($3))
                WHERE id = $1 RETURNING {SESSION_COLUMNS}""",
            s["id"], body.organization_id, iat + settings.access_token_ttl_seconds,
        )
        assert row is not None
        if switch and previous != body.organization_id:
            await audit.record(
                conn, _user_actor(request, s["user_id"]), action="session.org_switched",
                project_id=s["project_id"], target_type="session", target_id=s["id"],
                user_id=s["user_id"],
                description=f"Switched organization from {previous} to {body.organization_id}",
                metadata={"from_organization_id": previous,
                          "to_organization_id": body.organization_id, "role": role},
            )
        user = await _user(conn, s["user_id"])
    g = await grant(tokens, settings, project_id=s["project_id"], session=_session_body(row, role),
                    user=user, role=role, iat=iat, refresh_token=None)
    return grant_response(request, g)


def _user_actor(request: web.Request, user_id: str) -> audit.Actor:
    return audit.actor_from_request(request, actor_type="user", actor_id=user_id)


async def post_select_org(request: web.Request) -> web.Response:
    return await _org_change(request, switch=False)


async def post_switch_org(request: web.Request) -> web.Response:
    return await _org_change(request, switch=True)


class RefreshBody(RequestModel):
    refresh_token: str


@dataclass(frozen=True, slots=True)
class _Rotated:
    session: dict[str, Any]
    user: dict[str, Any]
    project_id: str
    role: str | None
    refresh_token: str


async def refresh(conn: asyncpg.Connection, settings: Settings, request: web.Request,
                  token: str, iat: int) -> _Rotated | Revoked:
    """Rotate ``token``; returns the new state, or the Revoked session when ``token`` was a
    rotated one presented again (the revocation is committed with its ``session.revoked``
    event; the caller publishes it and raises NoSession).

    The rotation is one statement, ``authio_refresh_session`` (migration 0003): it locks the
    session, then reads the token's state. A current token rotates every current generation of
    the session. A rotated token is forgiven (a new generation is added, the others left as
    they are) only if the client presented it before, less than the grace period ago, and no
    newer generation has been presented since: the client retrying after a lost response, or its
    requests racing (each racing answer stays usable until one of them is presented). A token
    that was superseded without ever being presented, or one older than a presented successor,
    means two parties hold the session's tokens.
    Raises NoSession for an unknown token or an inactive session.
    """
    new_token, new_digest = new_refresh_token()
    row = await conn.fetchrow(
        "SELECT * FROM authio_refresh_session($1, $2, $3, to_timestamp($4))",
        token_digest(token), new_digest, timedelta(seconds=settings.refresh_reuse_grace_seconds),
        iat + settings.access_token_ttl_seconds,
    )
    assert row is not None
    outcome, sess = row["outcome"], row["sess"]
    if outcome == "unknown":
        raise NoSession("Unknown refresh token.", details={"reason": "unknown_refresh_token"})
    if outcome == "revoked":
        raise NoSession("The session was revoked.", details={"reason": "session_revoked"})
    if outcome == "expired":
        raise NoSession("The session expired.", details={"reason": "session_expired"})
    if outcome == "reused":
        async with conn.transaction():
            revoked = await revoke_session(conn, sess["id"], reason="refresh_token_reused")
            if revoked is None:  # revoked meanwhile by another request
                raise NoSession("The session was revoked.", details={"reason": "session_revoked"})
            await audit.record(
                conn, _user_actor(request, sess["user_id"]), action="session.revoked",
                project_id=sess["project_id"], target_type="session", target_id=sess["id"],
                user_id=sess["user_id"],
                description="Revoked the session: a rotated refresh token was presented again",
                metadata={"reason": "refresh_token_reused", "generation": row["generation"],
                          "latest_generation": row["latest"]},
            )
        return revoked[1]
    assert outcome == "rotated"
    role = row["role"]  # None: the membership ended since, the org context was dropped
    session = _session_body({k: sess[k] for k in _SESSION_FIELDS}, role)
    user = {k: row[k] for k in users.USER_FIELDS}
    return _Rotated(session, user, sess["project_id"], role, new_token)


async def post_refresh(request: web.Request) -> web.Response:
    data = await read_json(request) if request.body_exists else {}
    if not data.get("refresh_token"):
        raise NoSession('Send the refresh token as {"refresh_token": "rt_..."}.',
                        details={"reason": "missing"})
    require_json(request)
    body = parse_model(RefreshBody, data)
    settings = request.app[SETTINGS]
    iat = int(time.time())
    async with request.app[PG_POOL].acquire() as conn:
        result = await refresh(conn, settings, request, body.refresh_token, iat)
    if isinstance(result, Revoked):
        await publish_revocations(request.app[REDIS], settings, [result])
        raise NoSession("This refresh token was already used; the session has been revoked.",
                        details={"reason": "refresh_token_reused"})
    g = await grant(request.app[TOKENS], settings, project_id=result.project_id,
                    session=result.session, user=result.user, role=result.role, iat=iat,
                    refresh_token=result.refresh_token)
    return grant_response(request, g)


async def post_revoke(request: web.Request) -> web.Response:
    async with request.app[PG_POOL].acquire() as conn, conn.transaction():
        s = await current_session(request, conn, for_update=True)
        revoked = await revoke_session(conn, s["id"], reason="revoked")
        assert revoked is not None  # locked and active above
        await audit.record(
            conn, _user_actor(request, s["user_id"]), action="session.revoked",
            project_id=s["project_id"], target_type="session", target_id=s["id"],
            user_id=s["user_id"], description="Revoked the session",
            metadata={"reason": "revoked", "organization_id": s["organization_id"]},
        )
    session, until = revoked
    await publish_revocations(request.app[REDIS], request.app[SETTINGS], [until])
    response = json_response(request, {"session": _session_body(session, None), "revoked": True})
    response.del_cookie(COOKIE, path="/")
    return response


async def get_me(request: web.Request) -> web.Response:
    async with request.app[PG_POOL].acquire() as conn:
        s = await current_session(request, conn)
        user = await _user(conn, s["user_id"])
        role = await _active_role(conn, s["user_id"], s["organization_id"]) if s["organization_id"] else None
    del s["project_id"]
    return json_response(request, {"session": _session_body(s, role), "user": user})


def setup(app: web.Application) -> None:
    r = app.router
    r.add_post("/v1/sessions/select-org", post_select_org)
    r.add_post("/v1/sessions/switch-org", post_switch_org)
    r.add_post("/v1/sessions/refresh", post_refresh)
    r.add_post("/v1/sessions/revoke", post_revoke)
    r.add_get("/v1/sessions/me", get_me)

