"""Message rules: queueing in the caller's transaction, and opening a queued body.

:func:`enqueue` inserts a message in the caller's transaction, so a message exists if and only if
the change that needs it commits, and wakes the delivery workers (``tasks``) with ``NOTIFY``
(delivered at commit). :func:`insert_from` queues one within another domain's statement
(``message_params``) and sends no ``NOTIFY``: its caller wakes this process's worker once the
statement committed. The body is sealed with the KMS (it carries a live sign-in link) and
opens only in its own row.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import asyncpg
import orjson

from common.ids import new_id
from control_plane.kms import KmsError, LocalKms
from control_plane.messages import repository
from control_plane.messages.schemas import Mailbox, MailboxItem, MailboxQuery
from control_plane.messages.senders import ConsoleSink, DeliveryError
from control_plane.web.schemas import Channel


def body_aad(message_id: str) -> bytes:
    """The KMS associated data of a message body: it opens only in its own row."""
    return b"message:" + message_id.encode()


async def enqueue(
    conn: asyncpg.Connection, kms: LocalKms, *, project_id: str, channel: Channel,
    destination: str, kind: str, subject: str, text: str, html: str | None = None,
    expires_at: datetime | timedelta | None = None,
) -> str:
    """Queue one message in ``conn``'s transaction and return its ``msg_`` id.

    ``kind`` names the message (``enrollment``, ``signin``, ``invitation``); ``subject`` is used
    by email only; ``text`` is the plain-text body (the whole SMS), ``html`` an optional HTML
    alternative for email. ``expires_at`` is when the message stops being useful (the expiry of
    the link it carries): an aware datetime, or a timedelta counted from the transaction's
    ``now()`` (as ``now() + interval`` expiries of the same transaction are). Until then
    transient delivery failures are retried without limit; None keeps the
    ``SERVICE_OUTBOX_MAX_ATTEMPTS`` limit.
    """
    message_id, sealed = sealed_body(kms, subject=subject, text=text, html=html)
    await repository.insert(conn, message_id=message_id, project_id=project_id, channel=channel,
                            kind=kind, destination=destination, body_sealed=sealed,
                            expires_at=expires_at)
    return message_id


def sealed_body(kms: LocalKms, *, subject: str, text: str,
                html: str | None = None) -> tuple[str, bytes]:
    """A new ``msg_`` id and the message body sealed to it (``enqueue``'s fields)."""
    message_id = new_id("msg")
    return message_id, kms.seal(orjson.dumps({"subject": subject, "text": text, "html": html}),
                                body_aad(message_id))


def message_params(kms: LocalKms, *, project_id: str, channel: Channel, destination: str,
                   kind: str, subject: str, text: str, ttl: timedelta,
                   name: str = "message") -> dict[str, object]:
    """The named parameters of ``insert_from(..., name=name)`` for one new message (fields as
    :func:`enqueue`'s; ``ttl`` its lifetime from the transaction's ``now()``)."""
    message_id, sealed = sealed_body(kms, subject=subject, text=text)
    values = {"id": message_id, "project_id": project_id, "channel": channel, "kind": kind,
              "destination": destination, "body_sealed": sealed, "ttl": ttl}
    return {f"{name}_{column}": value for column, value in values.items()}


insert_from = repository.insert_from
"""SQL queueing a message from another domain's statement, from its ``message_params``
(``repository.insert_from``)."""


def open_body(kms: LocalKms, message_id: str, sealed: bytes | None) -> dict[str, Any]:
    """The sealed body of a message: ``{"subject", "text", "html"}``. Raises DeliveryError
    (transient: a process holding another key-encryption key must not fail the message for
    all) when it cannot be opened."""
    if sealed is None:
        raise DeliveryError("the message body is gone", permanent=True)
    try:
        body = orjson.loads(kms.open(sealed, body_aad(message_id)))
    except KmsError as exc:
        raise DeliveryError(f"the message body cannot be opened: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get("text"), str):
        raise DeliveryError("the message body is malformed", permanent=True)
    return body


def mailbox(sink: ConsoleSink, project_id: str, query: MailboxQuery) -> Mailbox:
    """The messages ``sink`` delivered for the project, newest first."""
    entries = sink.messages(project_id, destination=query.destination, limit=query.limit)
    return Mailbox([MailboxItem(id=e.message.id, channel=e.message.channel, kind=e.message.kind,
                                destination=e.message.destination, subject=e.message.subject,
                                text=e.message.text, html=e.message.html,
                                delivered_at=e.delivered_at) for e in entries])
