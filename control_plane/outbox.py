"""The transactional outbox of messages (enrollment, sign-in, invitation).

``enqueue`` inserts a message in the caller's transaction, so a message exists if and only if
the change that needs it commits, and wakes the delivery worker with ``NOTIFY`` (delivered at
commit). The body is sealed with the KMS (it carries a live sign-in link).
"""

from __future__ import annotations

from typing import Final

import asyncpg
import orjson

from common.ids import new_id
from control_plane.destinations import Channel
from control_plane.kms import LocalKms

CHANNEL: Final = "authio_outbox"


def body_aad(message_id: str) -> bytes:
    """The KMS associated data of a message body: it opens only in its own row."""
    return b"message:" + message_id.encode()


async def enqueue(
    conn: asyncpg.Connection, kms: LocalKms, *, project_id: str, channel: Channel,
    destination: str, kind: str, subject: str, text: str, html: str | None = None,
) -> str:
    """Queue one message in ``conn``'s transaction and return its ``msg_`` id.

    ``kind`` names the message (``enrollment``, ``signin``, ``invitation``); ``subject`` is used
    by email only; ``text`` is the plain-text body (the whole SMS), ``html`` an optional HTML
    alternative for email.
    """
    message_id = new_id("msg")
    sealed = kms.seal(orjson.dumps({"subject": subject, "text": text, "html": html}),
                      body_aad(message_id))
    await conn.execute(
        """INSERT INTO messages (id, project_id, channel, kind, destination, body_sealed)
           VALUES ($1, $2, $3, $4, $5, $6)""",
        message_id, project_id, channel, kind, destination, sealed,
    )
    await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, message_id)
    return message_id
