"""Magic-link rules: issuing a link (``issue_link``, which users and invitations call too) and
sending a sign-in link (``send_link``). Redeeming one is ``signin``.

A token is 32 random bytes (base64url), stored as its SHA-256 digest only, valid once and for a
limited time (15 minutes for sign-in links; invitations and enrollments last
``SERVICE_INVITATION_TTL_SECONDS``). The token rides in the link's fragment (``#token=``), which
browsers never send: no access log, proxy, trace span or ``Referer`` ever holds it; the landing
page's script reads it and posts it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Final, Literal
from urllib.parse import urlencode

import asyncpg

from common.auth import token_digest
from common.db import Params
from common.errors import InvalidRequest
from common.settings import Settings
from control_plane.kms import LocalKms
from control_plane.magic_links import repository
from control_plane.magic_links.schemas import Sent, redirect_origin
from control_plane.messages import service as messages
from control_plane.tenancy import service as tenancy
from control_plane.web.ratelimit import RateLimit, client_bucket
from control_plane.web.schemas import Channel

Purpose = Literal["signin", "enrollment", "invitation", "step_up", "recovery"]
VERIFY_PATH: Final = "/v1/auth/magic-link/verify"

_TEXTS: Final = {
    "signin": ("Your sign-in link for {project}",
               "Use this link to sign in to {project}. It works once and expires in {lifetime}."
               "\n\n{url}\n\nIf you did not ask for it, ignore this message."),
    "enrollment": ("Welcome to {project}",
                   "An account was created for you at {project}. Use this link to sign in; it "
                   "works once and expires in {lifetime}.\n\n{url}\n"),
    "invitation": ("You are invited to join {organization} on {project}",
                   "You have been invited to join {organization} on {project}. Use this link to "
                   "accept; it works once and expires in {lifetime}.\n\n{url}\n"),
    "recovery": ("Your account recovery link for {project}",
                 "Your request to recover your account at {project} was approved. Use this link "
                 "to sign in and confirm this address; it works once and expires in {lifetime}."
                 "\n\n{url}\n\nIf you did not ask for it, tell {project} at once."),
    "step_up": ("Confirm your sign-in to {project}",
                "Someone, hopefully you, is signing in to {project} and we want to be sure it is "
                "you. Use this link to confirm; it works once and expires in {lifetime}.\n\n"
                "{url}\n\nIf it was not you, ignore this message: nobody can sign in without it."),
}


def link_url(settings: Settings, project_id: str, token: str,
             redirect_url: str | None = None) -> str:
    """The landing-page address a message carries, the token in its fragment: this service's
    page, or ``redirect_url`` (a page of the application, checked by :func:`check_redirect`)."""
    if redirect_url is not None:
        return f"{redirect_url}#{urlencode({'token': token})}"
    return (f"{settings.public_base_url}{VERIFY_PATH}?{urlencode({'project_id': project_id})}"
            f"#{urlencode({'token': token})}")


async def check_redirect(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                         redirect_url: str | None) -> None:
    """Refuse a ``redirect_url`` (already checked in shape by ``schemas.RedirectUrl``) whose
    origin the project does not allow: its ``cors_origins`` and ``webauthn.origins``, the pages
    that may call its public endpoints (DESIGN.md "the browser (CORS)"); else anyone could have
    a project's links land on their own page and read the token. Raises InvalidRequest naming
    ``redirect_url``."""
    if redirect_url is None:
        return
    origin = redirect_origin(redirect_url)
    if origin not in await tenancy.allowed_origins(conn, project_id):
        raise InvalidRequest.field(
            "redirect_url", f"its origin {origin} is not one of the project's allowed origins "
                            "(cors_origins and webauthn.origins, PATCH /v1/projects/me)")


def _lifetime(seconds: int) -> str:
    if seconds >= 2 * 86_400:
        return f"{seconds // 86_400} days"
    if seconds >= 2 * 3600:
        return f"{seconds // 3600} hours"
    minutes = max(1, -(-seconds // 60))  # rounded up: a link left 299 s says 5 minutes
    return "1 minute" if minutes == 1 else f"{minutes} minutes"


async def issue_link(
    conn: asyncpg.Connection, kms: LocalKms, settings: Settings, *, project_id: str,
    purpose: Purpose, channel: Channel, destination: str, ttl_seconds: int,
    user_id: str | None = None, invitation_id: str | None = None,
    organization_name: str | None = None, step_up_id: str | None = None,
    redirect_url: str | None = None,
) -> str:
    """Create a token and queue the message carrying its link, in ``conn``'s transaction
    (``step_up_id``: the step-up challenge a ``step_up`` link satisfies; ``redirect_url``: the
    application's page the link lands on, checked by :func:`check_redirect`, else this
    service's own).

    Returns the message id. The plaintext token exists only inside the sealed message body.
    """
    token = secrets.token_urlsafe(32)
    project = await repository.insert_token(
        conn, token_hash=token_digest(token), project_id=project_id, purpose=purpose,
        channel=channel, destination=destination, user_id=user_id, invitation_id=invitation_id,
        ttl=timedelta(seconds=ttl_seconds), step_up_id=step_up_id)
    subject, text = _message(settings, purpose, channel, project_id=project_id,
                             project_name=project, token=token, ttl_seconds=ttl_seconds,
                             organization_name=organization_name, redirect_url=redirect_url)
    return await messages.enqueue(
        conn, kms, project_id=project_id, channel=channel, destination=destination, kind=purpose,
        subject=subject, text=text,
        expires_at=timedelta(seconds=ttl_seconds),  # now() + ttl: the token's own expires_at
    )


user_of_destination = repository.user_id_by_destination
"""The id of the project's user holding an e-mail address (case-insensitively) or an E.164
number (``channel`` ``email`` or ``sms``), or None."""


def _message(settings: Settings, purpose: Purpose, channel: Channel, *, project_id: str,
             project_name: str, token: str, ttl_seconds: int,
             organization_name: str | None = None,
             redirect_url: str | None = None) -> tuple[str, str]:
    """The subject and text of the message carrying ``token``'s link."""
    url = link_url(settings, project_id, token, redirect_url)
    subject, text = _TEXTS[purpose]
    fields = {"project": project_name, "organization": organization_name or "an organization",
              "lifetime": _lifetime(ttl_seconds), "url": url}
    subject = subject.format(**fields)
    if channel == "sms":  # one short segment-friendly line
        return subject, f"{subject}: {url}"
    return subject, text.format(**fields)


def enrollment_params(kms: LocalKms, settings: Settings, *, project_id: str, project_name: str,
                      email: str) -> dict[str, object]:
    """The named parameters of :func:`enrollment_from` for one new user's enrollment link to
    ``email`` (lasting ``SERVICE_INVITATION_TTL_SECONDS``): the token's and its message's
    (``messages.message_params``), for a statement that creates the user and queues its link
    in one round trip (``users``)."""
    token = secrets.token_urlsafe(32)
    ttl_seconds = settings.invitation_ttl_seconds
    subject, text = _message(settings, "enrollment", "email", project_id=project_id,
                             project_name=project_name, token=token, ttl_seconds=ttl_seconds)
    ttl = timedelta(seconds=ttl_seconds)
    return {"link_token_hash": token_digest(token), "link_ttl": ttl,
            **messages.message_params(kms, project_id=project_id, channel="email",
                                      destination=email, kind="enrollment", subject=subject,
                                      text=text, ttl=ttl)}


def enrollment_from(source: str, p: Params) -> str:
    """SQL (CTEs ``link``, ``link_message``) issuing an enrollment link to each user row of
    ``source`` (columns ``id``, ``project_id``, ``email``) with its message, from
    :func:`enrollment_params`: what :func:`issue_link` writes, within another statement."""
    return (f"link AS ({repository.enrollment_token_from(source, p)}), "
            f"link_message AS ({messages.insert_from(source, p)})")


@dataclass(frozen=True, slots=True)
class SendLimits:
    """The rate limits of ``send_link``: per destination (per project) and per client."""

    per_destination: RateLimit
    per_ip: RateLimit


GMAIL_DOMAINS: Final = frozenset({"gmail.com", "googlemail.com"})


def destination_bucket(channel: Channel, address: str) -> str:
    """What the per-destination limit counts: the mailbox behind ``address``, not its
    spelling. For the limit only (the link still goes to the address as given): letters in
    either case, a sub-address tag (``a+1@x`` and ``a+2@x`` are ``a@x``, RFC 5233 with the
    ``+`` separator nearly every provider uses), and Gmail's ignored dots and second domain
    (``a.b@googlemail.com`` is ``ab@gmail.com``) count as one mailbox. A phone number
    (E.164, already normalized) is itself."""
    if channel != "email":
        return address
    local, _, domain = address.lower().rpartition("@")
    local = local.split("+", 1)[0] or local  # "+tag@x" alone has no base to fold into
    if domain in GMAIL_DOMAINS:
        local, domain = local.replace(".", "") or local, "gmail.com"
    return f"{local}@{domain}"


async def send_link(pool: asyncpg.Pool, *, project_id: str, destination: tuple[Channel, str],
                    ip: str | None, limits: SendLimits, kms: LocalKms, settings: Settings,
                    redirect_url: str | None = None) -> Sent:
    """Queue a sign-in link to ``destination`` (channel, normalized address), landing on
    ``redirect_url`` when given (:func:`check_redirect`), else on this service's page.

    The answer is the same whether or not a user has that destination (no enumeration); a user
    who does not exist yet is created when the link is redeemed. Limited per destination (per
    project, ``destination_bucket``) and per client IP. Raises InvalidRequest (``redirect_url``),
    RateLimited, and ServiceUnavailable while the limits cannot be counted (Redis away; they
    fail closed).
    """
    channel, address = destination
    await check_redirect(pool, project_id, redirect_url)
    if ip:
        await limits.per_ip.hit(client_bucket(ip))
    await limits.per_destination.hit(f"{project_id}:{destination_bucket(channel, address)}")
    async with pool.acquire() as conn, conn.transaction():
        user_id = await repository.user_id_by_destination(conn, project_id, channel, address)
        await issue_link(conn, kms, settings, project_id=project_id, purpose="signin",
                         channel=channel, destination=address,
                         ttl_seconds=settings.magic_link_ttl_seconds, user_id=user_id,
                         redirect_url=redirect_url)
    return Sent(True, channel, settings.magic_link_ttl_seconds)
