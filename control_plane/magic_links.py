"""Magic links: single-use tokens sent by email or SMS (SPEC.md 1, 4, 5; issue 4).

A token is 32 random bytes (base64url), stored as its SHA-256 digest only, valid once and for a
limited time (15 minutes for sign-in links; invitations and enrollments last
``SERVICE_INVITATION_TTL_SECONDS``). ``issue_link`` creates one and queues the message that
carries it; ``control_plane.signin`` redeems it.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Final, Literal
from urllib.parse import urlencode

import asyncpg

from common.auth import token_digest
from common.settings import Settings
from control_plane import outbox
from control_plane.destinations import Channel
from control_plane.kms import LocalKms

Purpose = Literal["signin", "enrollment", "invitation"]
VERIFY_PATH: Final = "/v1/auth/magic-link/verify"


def link_url(settings: Settings, project_id: str, token: str) -> str:
    """The landing-page address carried by a message. The token rides in the fragment
    (``#token=``), which browsers never send: no access log, proxy, trace span or ``Referer``
    ever holds it; the page's script reads it and posts it."""
    return (f"{settings.public_base_url}{VERIFY_PATH}?{urlencode({'project_id': project_id})}"
            f"#{urlencode({'token': token})}")


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
}


def _lifetime(seconds: int) -> str:
    if seconds >= 2 * 86_400:
        return f"{seconds // 86_400} days"
    if seconds >= 2 * 3600:
        return f"{seconds // 3600} hours"
    return f"{max(1, seconds // 60)} minutes"


async def issue_link(
    conn: asyncpg.Connection, kms: LocalKms, settings: Settings, *, project_id: str,
    purpose: Purpose, channel: Channel, destination: str, ttl_seconds: int,
    user_id: str | None = None, invitation_id: str | None = None,
    organization_name: str | None = None,
) -> str:
    """Create a token and queue the message carrying its link, in ``conn``'s transaction.

    Returns the message id. The plaintext token exists only inside the sealed message body.
    """
    token = secrets.token_urlsafe(32)
    await conn.execute(
        """INSERT INTO magic_link_tokens (token_hash, project_id, purpose, channel, destination,
                                          user_id, invitation_id, expires_at)
           VALUES ($1, $2, $3, $4, $5, $6, $7, now() + $8::interval)""",
        token_digest(token), project_id, purpose, channel, destination, user_id, invitation_id,
        timedelta(seconds=ttl_seconds),
    )
    project = await conn.fetchval("SELECT name FROM projects WHERE id = $1", project_id)
    url = link_url(settings, project_id, token)
    subject, text = _TEXTS[purpose]
    fields = {"project": project, "organization": organization_name or "an organization",
              "lifetime": _lifetime(ttl_seconds), "url": url}
    body = text.format(**fields)
    if channel == "sms":  # one short segment-friendly line
        body = f"{subject.format(**fields)}: {url}"
    return await outbox.enqueue(
        conn, kms, project_id=project_id, channel=channel, destination=destination, kind=purpose,
        subject=subject.format(**fields), text=body,
        expires_at=timedelta(seconds=ttl_seconds),  # now() + ttl: the token's own expires_at
    )

