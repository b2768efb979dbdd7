"""Step-up: how a challenged sign-in becomes a session (SPEC.md 5.5; DESIGN.md "risk").

A sign-in the risk engine challenged answered 401 ``step_up_required`` with
``details.challenge_id`` (``chal_``, single use, ``SERVICE_STEP_UP_TTL_SECONDS``). The same user
then proves themselves again, either way ending in the session the sign-in would have started
(its method, and the organization an invitation gave), answered as every sign-in is:

* a fresh passkey assertion: :func:`passkey_options` issues WebAuthn request options for the
  challenged user's passkeys, valid for this challenge only; :func:`verify_passkey` verifies the
  assertion (``passkeys.service.sign_in`` with the challenge), and the sign-in statement uses
  the challenge up with ``auth.step_up_satisfied``. A refused assertion uses it up too
  (``failed``): a failed challenge issues nothing, ever.
* a step-up magic link: :func:`send_link` sends a ``step_up`` link to the user's verified
  e-mail address (else phone number); ``POST /v1/auth/magic-link/verify`` redeems it
  (``magic_links.signin``).

An unknown, used, failed or expired challenge, or another project's, is 400
``unknown_or_expired_challenge``; a passkey of another user is ``unknown_or_expired_challenge``
too (the options named the challenged user), and uses the challenge up.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from common.errors import InvalidRequest
from common.settings import Settings
from control_plane.kms import LocalKms
from control_plane.magic_links import service as magic_links
from control_plane.passkeys import service as passkeys
from control_plane.passkeys.schemas import AuthenticationResponseBody
from control_plane.risk.schemas import StepUpSent, StepUpVerifyBody
from control_plane.risk.service import RiskEngine, find_challenge
from control_plane.sessions.schemas import SignIn
from control_plane.web.actor import Actor
from control_plane.web.ratelimit import RateLimit
from control_plane.web.schemas import Channel


def _project(actor: Actor) -> str:
    assert actor.project_id is not None
    return actor.project_id


async def passkey_options(conn: asyncpg.Connection, actor: Actor, *, challenge_id: str,
                          settings: Settings) -> dict[str, Any]:
    """WebAuthn request options for the step-up ``challenge_id``: the challenged user's passkeys
    in ``allowCredentials``. Raises UnknownOrExpiredChallenge, InvalidRequest naming
    ``challenge_id`` when the user has no passkey, or ``webauthn`` when the project has no
    relying party."""
    challenge = await find_challenge(conn, _project(actor), challenge_id)
    if not challenge.has_passkey:  # empty allowCredentials would offer any passkey of the site
        raise InvalidRequest.field("challenge_id", "the user has no passkey; use a step-up link")
    return await passkeys.authentication_options(conn, actor, email=None, settings=settings,
                                                 step_up=challenge)


async def verify_passkey(conn: asyncpg.Connection, actor: Actor, *, body: StepUpVerifyBody,
                         device: dict[str, Any], settings: Settings, iat: int,
                         risk_engine: RiskEngine) -> SignIn:
    """Satisfy the step-up ``body.challenge_id`` with the passkey assertion of ``body`` and start
    the challenged sign-in's session. Raises UnknownOrExpiredChallenge, VerificationFailed,
    InvalidRequest (``webauthn``)."""
    challenge = await find_challenge(conn, _project(actor), body.challenge_id)
    credential = AuthenticationResponseBody.model_validate(
        body.model_dump(exclude={"challenge_id"}, exclude_unset=True))
    return await passkeys.sign_in(conn, actor, credential=credential, device=device,
                                  settings=settings, iat=iat, risk_engine=risk_engine,
                                  step_up=challenge)


def masked(address: str) -> str:
    """An e-mail address or phone number with most of it hidden (``a***@example.com``,
    ``+4*******89``): enough for the user to recognise, too little to harvest."""
    if "@" in address:
        local, _, domain = address.rpartition("@")
        return f"{local[:1]}***@{domain}"
    return address[:2] + "*" * max(0, len(address) - 4) + address[-2:]


async def send_link(pool: asyncpg.Pool, actor: Actor, *, challenge_id: str,
                    per_destination: RateLimit, kms: LocalKms, settings: Settings,
                    redirect_url: str | None = None) -> StepUpSent:
    """Send a step-up link for ``challenge_id`` to the challenged user's verified e-mail
    address, else verified phone number; it lives as long as the challenge has left, and lands
    on ``redirect_url`` when given (``magic_links.check_redirect``). Limited like sign-in links
    per destination. Raises UnknownOrExpiredChallenge, InvalidRequest naming ``challenge_id``
    when the user has no verified destination or ``redirect_url``, RateLimited,
    ServiceUnavailable (the limit cannot be counted)."""
    project_id = _project(actor)
    await magic_links.check_redirect(pool, project_id, redirect_url)
    challenge = await find_challenge(pool, project_id, challenge_id)
    channel: Channel = "email" if challenge.email is not None else "sms"
    address = challenge.email if channel == "email" else challenge.phone_number
    if address is None:
        raise InvalidRequest.field("challenge_id", "the user has no verified e-mail address or "
                                                   "phone number to send a link to; use a passkey")
    await per_destination.hit(f"{project_id}:{magic_links.destination_bucket(channel, address)}")
    async with pool.acquire() as conn, conn.transaction():
        challenge = await find_challenge(conn, project_id, challenge_id)  # still pending
        await magic_links.issue_link(
            conn, kms, settings, project_id=project_id, purpose="step_up", channel=channel,
            destination=address, ttl_seconds=challenge.expires_in,
            user_id=challenge.user_id, step_up_id=challenge.id, redirect_url=redirect_url)
    return StepUpSent(True, channel, masked(address), challenge.expires_in)
