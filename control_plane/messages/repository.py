"""Outbox SQL (table ``messages``). A message is ``pending`` until a worker delivered it
(``sent``) or gave up (``failed``); a claim takes a lease (``locked_until``) and counts an
attempt in one statement."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

import asyncpg

from common.db import Params

NOTIFY_CHANNEL: Final = "authio_outbox"

# Due, unleased messages, oldest due first; the lease and the attempt count commit with the claim.
# An expired message is claimed only to be failed, unsent: that claim is not a delivery attempt.
CLAIM: Final = """
WITH due AS (
    SELECT id FROM messages
     WHERE status = 'pending' AND next_attempt_at <= now()
       AND (locked_until IS NULL OR locked_until < now())
     ORDER BY next_attempt_at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
)
UPDATE messages AS m
   SET locked_until = now() + $2::interval,
       attempts = m.attempts + CASE WHEN m.expires_at <= now() THEN 0 ELSE 1 END
  FROM due
 WHERE m.id = due.id
RETURNING m.id, m.project_id, m.channel, m.kind, m.destination, m.body_sealed, m.attempts,
          m.expires_at, m.expires_at <= now() AS expired, m.last_error
"""
# Delivered: whoever delivered it, it is sent (a slower duplicate of ours changes nothing).
SENT: Final = """
UPDATE messages SET status = 'sent', sent_at = now(), body_sealed = NULL, locked_until = NULL
 WHERE id = $1 AND status = 'pending'
"""
# Failures apply only while our claim is the current one (``attempts`` unchanged): a worker
# whose lease ran out must not reschedule a message another worker now holds. A retry is never
# later than the message's expiry (LEAST ignores a null one), when it fails as expired.
RETRY: Final = """
UPDATE messages SET next_attempt_at = LEAST(now() + $3::interval, expires_at),
                    locked_until = NULL, last_error = $4
 WHERE id = $1 AND status = 'pending' AND attempts = $2
"""
FAILED: Final = """
UPDATE messages SET status = 'failed', locked_until = NULL, last_error = $3, body_sealed = NULL
 WHERE id = $1 AND status = 'pending' AND attempts = $2
"""
# Kept a week for operators (bodies are wiped on delivery), then deleted in batches of $1.
PURGE: Final = """
DELETE FROM messages WHERE id IN (
    SELECT id FROM messages
    WHERE status IN ('sent', 'failed')
      AND coalesce(sent_at, created_at) < now() - interval '7 days' LIMIT $1)"""


INSERT_FROM_COLUMNS: Final = ("id", "project_id", "channel", "kind", "destination", "body_sealed")
"""A queued message's columns besides ``expires_at``, in the order both inserts give them."""
_COLUMNS: Final = ", ".join(INSERT_FROM_COLUMNS)


async def insert(conn: asyncpg.Connection, *, message_id: str, project_id: str, channel: str,
                 kind: str, destination: str, body_sealed: bytes,
                 expires_at: datetime | timedelta | None) -> None:
    """Queue one message (``expires_at`` an aware time or a delay from the transaction's
    ``now()``) and wake the workers (``NOTIFY``, delivered at commit), in one round trip."""
    at, after = (None, expires_at) if isinstance(expires_at, timedelta) else (expires_at, None)
    await conn.execute(
        f"""WITH queued AS (
               INSERT INTO messages ({_COLUMNS}, expires_at)
               VALUES ($1, $2, $3, $4, $5, $6, coalesce($7::timestamptz, now() + $8::interval))
               RETURNING id)
           SELECT pg_notify($9, id) FROM queued""",
        message_id, project_id, channel, kind, destination, body_sealed, at, after,
        NOTIFY_CHANNEL,
    )


def insert_from(source: str, p: Params, *, name: str = "message") -> str:
    """SQL queueing one message per row of ``source`` (a CTE of the same statement), from the
    named parameters ``<name>_<column>`` of ``p`` for ``INSERT_FROM_COLUMNS`` and
    ``<name>_ttl`` (an interval from the transaction's ``now()``: ``expires_at``): the row
    :func:`insert` writes, committed with the statement's change and without a round trip of
    its own. It sends no ``NOTIFY``: transactions that notify commit one at a time (PostgreSQL
    holds one lock over the notification queue from their pre-commit to their end), which
    capped an import at the speed of one WAL flush per user; the caller wakes this process's
    worker once the statement committed (``OUTBOX_WAKE``), and the others poll."""
    values = ", ".join(p[f"{name}_{c}"] for c in INSERT_FROM_COLUMNS)
    return (f"INSERT INTO messages ({_COLUMNS}, expires_at) "
            f"SELECT {values}, now() + {p[f'{name}_ttl']}::interval FROM {source}")
