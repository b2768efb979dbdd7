"""Magic-link sign-in endpoints (SPEC.md 3, 4, 5, 7; issue 4).

* ``POST /v1/auth/magic-link/send`` ``{"destination"}`` queues a sign-in link.
* ``GET /v1/auth/magic-link/verify?project_id=...#token=...`` is the landing page the link
  opens: a button, never a redemption, because mail scanners follow links. The token is in the
  fragment, so the server never receives it with the page.
* ``POST /v1/auth/magic-link/verify`` ``{"token"}`` redeems it: a sign-in (session envelope and
  ``service_session`` cookie).
"""

from __future__ import annotations

import ipaddress
import secrets
import time
from dataclasses import dataclass, replace
from typing import Annotated, Any, Final

import asyncpg
from aiohttp import web
from pydantic import StringConstraints

from common.appkeys import PG_POOL, SETTINGS
from common.auth import token_digest
from common.errors import ServiceError, TokenConsumed, TokenExpired, TokenInvalidOrExpired
from common.http import client_ip, json_response
from common.ids import new_id
from common.schemas import RequestModel, parse_body
from control_plane import audit, invitations, sessions, users
from control_plane.appkeys import KMS, TOKENS
from control_plane.destinations import Channel, classify_destination
from control_plane.magic_links import VERIFY_PATH, issue_link
from control_plane.public_project import HEADER as PROJECT_HEADER
from control_plane.public_project import resolve_project
from control_plane.ratelimit import RateLimit, RateLimits


class SendBody(RequestModel):
    destination: Annotated[str, StringConstraints(max_length=320)]


class VerifyBody(RequestModel):
    token: Annotated[str, StringConstraints(min_length=1, max_length=256)]


async def _user_by_destination(
    conn: asyncpg.Connection, project_id: str, channel: Channel, destination: str
) -> asyncpg.Record | None:
    if channel == "email":
        return await users.find_by_email(conn, project_id, destination)
    return await users.find_by_phone(conn, project_id, destination)


def client_bucket(ip: str) -> str:
    """What a per-IP limit counts: the address, or for IPv6 its /64, which one subscriber
    usually holds whole (RFC 6177) and could otherwise rotate through."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return ip
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


async def post_send(request: web.Request) -> web.Response:
    """``POST /v1/auth/magic-link/send`` ``{"destination"}``: queue a sign-in link.

    The answer is the same whether or not a user has that destination (no enumeration); a user
    who does not exist yet is created when the link is redeemed. Limited per destination (per
    project) and per client IP (``rate_limited``, 429, ``Retry-After``). Raises
    InvalidDestination (400), InvalidEmail (422), ProjectNotFound, RateLimited.
    """
    project_id = await resolve_project(request)
    body = await parse_body(request, SendBody)
    channel, destination = classify_destination(body.destination)
    app, settings = request.app, request.app[SETTINGS]
    ip = client_ip(request, settings.trusted_proxy_networks)
    limits = app[MAGIC_LINK_LIMITS]
    if ip:
        await limits.per_ip.hit(client_bucket(ip))
    await limits.per_destination.hit(f"{project_id}:{destination.lower()}")
    async with app[PG_POOL].acquire() as conn, conn.transaction():
        user = await _user_by_destination(conn, project_id, channel, destination)
        await issue_link(
            conn, app[KMS], settings, project_id=project_id, purpose="signin", channel=channel,
            destination=destination, ttl_seconds=settings.magic_link_ttl_seconds,
            user_id=user["id"] if user else None,
        )
    return json_response(request, {"sent": True, "channel": channel,
                                   "expires_in": settings.magic_link_ttl_seconds})


def _device(request: web.Request) -> dict[str, Any]:
    """What the client says about its device: the User-Agent and the User-Agent Client Hints
    (RFC 8942) it sent, verbatim; the risk engine scores these."""
    h = request.headers
    hints = {"platform": h.get("Sec-CH-UA-Platform"), "mobile": h.get("Sec-CH-UA-Mobile"),
             "brands": h.get("Sec-CH-UA")}
    return {"user_agent": h.get("User-Agent"), **{k: v for k, v in hints.items() if v}}


@dataclass(frozen=True, slots=True)
class SignIn:
    project_id: str
    session: dict[str, Any]
    user: dict[str, Any]
    role: str | None
    refresh_token: str


_FAILURES: Final = {"consumed": TokenConsumed, "expired": TokenExpired}


# The user a token's destination names (the token as ``t``).
_FOUND_USER: Final = """LEFT JOIN LATERAL (
    SELECT id FROM users
    WHERE t.channel = 'email' AND project_id = t.project_id AND lower(email) = lower(t.destination)
    UNION ALL
    SELECT id FROM users
    WHERE t.channel = 'sms' AND project_id = t.project_id AND phone_number = t.destination
) found ON true"""

# The token is used up and its user looked up in one statement (the general path).
_CONSUME: Final = f"""
WITH t AS (
    UPDATE magic_link_tokens SET consumed_at = now()
    WHERE token_hash = $1 AND consumed_at IS NULL AND expires_at > now()
      AND ($2::text IS NULL OR project_id = $2)
    RETURNING project_id, purpose, channel, destination, user_id, invitation_id
)
SELECT t.*, found.id AS found_user_id FROM t {_FOUND_USER}
"""

# The fast path: a usable sign-in or enrollment link (not an invitation's), read without a lock.
_LOOKUP: Final = f"""
SELECT t.project_id, t.purpose, t.channel, t.destination, t.user_id, found.id AS found_user_id
FROM magic_link_tokens t {_FOUND_USER}
WHERE t.token_hash = $1 AND t.consumed_at IS NULL AND t.expires_at > now()
  AND ($2::text IS NULL OR t.project_id = $2) AND t.purpose <> 'invitation'
"""

# Used up only if still usable, still the lookup's, and (a known user) its user still has the
# destination: sessions.start_session inserts nothing unless this CTE ``t`` yields a row.
_GATE: Final = """t AS (
    UPDATE magic_link_tokens SET consumed_at = now()
    WHERE token_hash = $26 AND consumed_at IS NULL AND expires_at > now() AND project_id = $2
      AND purpose <> 'invitation' AND {condition}
    RETURNING 1
)"""
# The user is locked before the link (DELETE /v1/users locks the user, then its links through
# the foreign key: the same order cannot deadlock), and a concurrent change of its address is
# seen (the lock re-reads the row): a link proves the address it was sent to, nothing else.
_KNOWN_USER: Final = """(user_id IS NULL OR user_id = $3) AND EXISTS (
        SELECT 1 FROM users x WHERE x.id = $3 AND (
            (channel = 'email' AND lower(x.email) = lower(destination))
            OR (channel = 'sms' AND x.phone_number = destination))
        FOR NO KEY UPDATE OF x)"""
_KNOWN_USER_HEAD: Final = (
    f"{_GATE.format(condition=_KNOWN_USER)}, u AS ("
    + sessions.USER_UPDATE.format(condition="AND EXISTS (SELECT 1 FROM t)",
                                  user_columns=users.USER_COLUMNS) + ")"
)
# A first sign-in creates the user (verified: the link proved the destination) with
# ``user.created``, only while the link is usable (locked first, so it stays so); a concurrent
# creation of the same user wins, and this one writes nothing.
_NEW_USER: Final = f"""u AS (
    INSERT INTO users (id, project_id, email, email_verified, phone_number, phone_verified,
                       last_sign_in_at)
    SELECT $3, $2, $27, $11, $28, $12, now()
    WHERE EXISTS (
        SELECT 1 FROM magic_link_tokens
        WHERE token_hash = $26 AND consumed_at IS NULL AND expires_at > now() AND project_id = $2
          AND user_id IS NULL
        FOR NO KEY UPDATE)
    ON CONFLICT DO NOTHING
    RETURNING {users.USER_COLUMNS}
), {_GATE.format(condition="user_id IS NULL AND EXISTS (SELECT 1 FROM u)")},
uc AS ({audit.insert_from("u", 29)})"""

# The general path locks the user the link names (if any) before the link, as above.
_LOCK_USER: Final = f"""
SELECT 1 FROM users WHERE id = (
    SELECT found.id FROM magic_link_tokens t {_FOUND_USER} WHERE t.token_hash = $1 LIMIT 1)
FOR NO KEY UPDATE"""


async def redeem(request: web.Request, conn: asyncpg.Connection, token: str, iat: int) -> SignIn:
    """Consume ``token`` and sign its owner in, in one transaction: the user (created on first
    sign-in, destination marked verified), an invitation's membership, the session, and
    ``auth.signin_attempt``. A refused token records a failed attempt (when its project is
    known) and raises TokenConsumed, TokenExpired or TokenInvalidOrExpired (410), or
    InvitationNotPending (409) for an invitation revoked or expired since; a link refused
    after it was used up stays used up."""
    named = request.query.get("project_id") or request.headers.get(PROJECT_HEADER)
    actor = audit.actor_from_request(request, actor_type="user")
    attempt = {"method": "magic_link", "device": _device(request), "ip": actor.ip,
               "user_agent": actor.user_agent}
    digest = token_digest(token)
    fast = await _fast_sign_in(request, conn, digest, named, actor, attempt, iat)
    if fast is not None:
        return fast
    failure: ServiceError | None = None
    async with conn.transaction():
        await conn.execute(_LOCK_USER, digest)
        row = await conn.fetchrow(_CONSUME, digest, named)
        if row is None:
            known = await conn.fetchrow(
                """SELECT project_id, user_id, purpose, channel,
                          CASE WHEN consumed_at IS NOT NULL THEN 'consumed'
                               WHEN expires_at <= now() THEN 'expired' END AS state
                   FROM magic_link_tokens WHERE token_hash = $1""", digest,
            )
            if known is None or (named and known["project_id"] != named):
                raise TokenInvalidOrExpired()  # no project of ours to record it in
            failure = _FAILURES[known["state"]]()
            await _refused(conn, actor, attempt, known, failure)
        elif row["user_id"] is not None and row["user_id"] != row["found_user_id"]:
            # The user's address changed since the link was sent: it no longer proves control.
            failure = TokenInvalidOrExpired()
            await _refused(conn, actor, attempt, row, failure)
        elif row["purpose"] == "invitation":
            try:
                async with conn.transaction():  # a savepoint: a refusal keeps the token used up
                    return await _sign_in(request, conn, row, actor, attempt, iat)
            except ServiceError as err:
                failure = err
                await _refused(conn, actor, attempt, row, failure)
        else:
            return await _sign_in(request, conn, row, actor, attempt, iat)
    assert failure is not None
    raise failure


async def _fast_sign_in(
    request: web.Request, conn: asyncpg.Connection, digest: bytes, named: str | None,
    actor: audit.Actor, attempt: dict[str, Any], iat: int,
) -> SignIn | None:
    """The common sign-in in two round trips and no explicit transaction: a lookup, then one
    statement that uses the link up only if it is still usable and signs in (creating the user on
    a first sign-in). None whenever anything is unusual (an invitation link, a refused or raced
    link): the general path then decides and explains, in a transaction of its own."""
    token = await conn.fetchrow(_LOOKUP, digest, named)
    if token is None or (token["user_id"] is not None and token["user_id"] != token["found_user_id"]):
        return None
    project_id, channel, destination = token["project_id"], token["channel"], token["destination"]
    user_id = token["found_user_id"] or new_id("user")
    head_args: list[Any] = [digest]
    if token["found_user_id"] is not None:
        head = _KNOWN_USER_HEAD
    else:
        head = _NEW_USER
        head_args += [
            destination if channel == "email" else None, destination if channel == "sms" else None,
            *audit.event_values(
                replace(actor, id=user_id), action="user.created", project_id=project_id,
                target_type="user", target_id=user_id, user_id=user_id,
                description=f"Created user on first sign-in by {channel}",
                metadata={"source": "magic_link", "channel": channel}),
        ]
    actor = replace(actor, id=user_id)
    session_id = new_id("sess")
    started = await sessions.start_session(
        conn, request.app[SETTINGS], session_id=session_id, project_id=project_id,
        user_id=user_id, auth_method="magic_link", ip=actor.ip, user_agent=actor.user_agent,
        iat=iat, event=_signed_in(actor, attempt, token, session_id), verified=channel, head=head,
        gate=", t", head_args=head_args,
    )
    if started is None:
        return None
    session, role, refresh_token, user = started
    return SignIn(project_id, session, user, role, refresh_token)


def _signed_in(actor: audit.Actor, attempt: dict[str, Any], token: asyncpg.Record,
               session_id: str) -> list[Any]:
    """The values of a successful ``auth.signin_attempt`` (``actor`` is the user)."""
    return audit.event_values(
        actor, action="auth.signin_attempt", project_id=token["project_id"],
        target_type="session", target_id=session_id, user_id=actor.id,
        description="Signed in by magic link",
        metadata={**attempt, "outcome": "success", "channel": token["channel"],
                  "purpose": token["purpose"], "session_id": session_id},
    )


async def _refused(conn: asyncpg.Connection, actor: audit.Actor, attempt: dict[str, Any],
                   token: asyncpg.Record, failure: ServiceError) -> None:
    """``auth.signin_attempt`` with outcome ``failure`` for a refused link."""
    await audit.record(
        conn, replace(actor, id=token["user_id"]), action="auth.signin_attempt",
        project_id=token["project_id"], target_type="user", target_id=token["user_id"],
        user_id=token["user_id"], description=f"Magic-link sign-in refused: {failure.code}",
        metadata={**attempt, "outcome": "failure", "reason": failure.code,
                  "channel": token["channel"], "purpose": token["purpose"]},
    )


async def _create_user(conn: asyncpg.Connection, actor: audit.Actor, project_id: str,
                       channel: Channel, destination: str) -> str:
    """The id of the user a first sign-in by ``destination`` creates (verified: the link proved
    it), with ``user.created`` in the same statement. Another request may be creating the same
    user at this moment (a second link, POST /v1/users): the unique index decides, and the
    loser takes the winner's row."""
    user_id = new_id("user")
    event = audit.event_values(
        replace(actor, id=user_id), action="user.created", project_id=project_id,
        target_type="user", target_id=user_id, user_id=user_id,
        description=f"Created user on first sign-in by {channel}",
        metadata={"source": "magic_link", "channel": channel},
    )
    created = await conn.fetchval(
        f"""WITH u AS (
                INSERT INTO users (id, project_id, email, email_verified, phone_number, phone_verified)
                VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING RETURNING id
            ), e AS ({audit.insert_from("u", 7)})
            SELECT id FROM u""",
        user_id, project_id, destination if channel == "email" else None, channel == "email",
        destination if channel == "sms" else None, channel == "sms", *event,
    )
    if created is not None:
        return str(created)
    existing = await _user_by_destination(conn, project_id, channel, destination)
    assert existing is not None
    return str(existing["id"])


async def _sign_in(
    request: web.Request, conn: asyncpg.Connection, token: asyncpg.Record, actor: audit.Actor,
    attempt: dict[str, Any], iat: int,
) -> SignIn:
    project_id, channel = token["project_id"], token["channel"]
    user_id = token["found_user_id"] or await _create_user(conn, actor, project_id, channel,
                                                           token["destination"])
    actor = replace(actor, id=user_id)
    organization_id = None
    if token["purpose"] == "invitation":
        membership = await invitations.accept(
            conn, actor, project_id=project_id, invitation_id=token["invitation_id"],
            user_id=user_id,
        )
        organization_id = membership["organization_id"]
    session_id = new_id("sess")
    started = await sessions.start_session(
        conn, request.app[SETTINGS], session_id=session_id, project_id=project_id,
        user_id=user_id, auth_method="magic_link", ip=actor.ip, user_agent=actor.user_agent,
        iat=iat, event=_signed_in(actor, attempt, token, session_id),
        organization_id=organization_id, verified=channel,
    )
    assert started is not None  # no head: raises instead
    session, role, refresh_token, user = started
    return SignIn(project_id, session, user, role, refresh_token)


async def post_verify(request: web.Request) -> web.Response:
    """``POST /v1/auth/magic-link/verify`` ``{"token"}``: redeem a link and sign in (SPEC.md 3:
    the session envelope and the ``service_session`` cookie)."""
    sessions.require_json(request)
    body = await parse_body(request, VerifyBody)
    iat = int(time.time())
    async with request.app[PG_POOL].acquire() as conn:
        s = await redeem(request, conn, body.token, iat)
    g = await sessions.grant(request.app[TOKENS], request.app[SETTINGS], project_id=s.project_id,
                             session=s.session, user=s.user, role=s.role, iat=iat,
                             refresh_token=s.refresh_token)
    return sessions.grant_response(request, g)


_LANDING: Final = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>Sign in</title>
<style nonce="{nonce}">
body {{ font-family: system-ui, sans-serif; max-width: 28rem; margin: 4rem auto; padding: 0 1rem; }}
button {{ font-size: 1.1rem; padding: .6rem 1.4rem; cursor: pointer; }}
</style></head>
<body><main>
<h1>Sign in</h1>
<p id="status" role="status" aria-live="polite">Press the button to finish signing in.</p>
<button id="signin" type="button">Sign in</button>
</main>
<script nonce="{nonce}">
document.getElementById("signin").addEventListener("click", async (event) => {{
  const button = event.currentTarget, status = document.getElementById("status");
  const params = new URLSearchParams(window.location.search);
  const token = new URLSearchParams(window.location.hash.slice(1)).get("token") || "";
  button.disabled = true;
  status.textContent = "Signing in…";
  try {{
    const response = await fetch(window.location.pathname + "?" + new URLSearchParams(
        {{project_id: params.get("project_id") || ""}}), {{
      method: "POST", credentials: "same-origin",
      headers: {{"Content-Type": "application/json"}},
      body: JSON.stringify({{token: token}}),
    }});
    const body = await response.json();
    if (response.ok) {{
      status.textContent = "You are signed in" + (body.user.email ? " as " + body.user.email : "") + ".";
      button.hidden = true;
    }} else {{
      status.textContent = body.error.message;
    }}
  }} catch (err) {{
    status.textContent = "Could not reach the server; try again.";
    button.disabled = false;
  }}
}});
</script></body></html>
"""


async def get_landing(request: web.Request) -> web.Response:
    """``GET /v1/auth/magic-link/verify``: a page with a button that redeems the link. It never
    consumes the token itself: mail scanners fetch links, people press buttons."""
    nonce = secrets.token_urlsafe(16)
    return web.Response(
        text=_LANDING.format(nonce=nonce), content_type="text/html",
        headers={
            "Cache-Control": "no-store",
            "Referrer-Policy": "no-referrer",  # the URL holds the token
            "Content-Security-Policy": (
                f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
                "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
            ),
            "X-Content-Type-Options": "nosniff",
        },
    )


@dataclass(frozen=True, slots=True)
class MagicLinkLimits:
    per_destination: RateLimit
    per_ip: RateLimit


MAGIC_LINK_LIMITS: Final = web.AppKey("magic_link_limits", MagicLinkLimits)


def setup(app: web.Application) -> None:
    settings = app[SETTINGS]
    limits = RateLimits(settings.redis_url, settings.redis_prefix)
    app[MAGIC_LINK_LIMITS] = MagicLinkLimits(
        per_destination=limits.limit("magic_link_destination",
                                     settings.magic_link_rate_per_destination),
        per_ip=limits.limit("magic_link_ip", settings.magic_link_rate_per_ip),
    )
    app.router.add_post("/v1/auth/magic-link/send", post_send)
    app.router.add_post(VERIFY_PATH, post_verify)
    app.router.add_get(VERIFY_PATH, get_landing, allow_head=False)
