"""Webhook SQL: endpoints, the fan-out from the audit log into deliveries, and the deliveries'
claims, outcomes, listing and requeues (tables of migration 0010)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Final

import asyncpg

from common.db import Params
from control_plane.audit.service import EVENT_COLUMNS, LOG_HORIZON

NOTIFY_CHANNEL: Final = "authio_webhooks"
"""NOTIFY'd when deliveries are made or requeued: the delivery workers wake up."""
ENDPOINT_COLUMNS: Final = "id, url, events, description, status, disabled_reason, created_at"
DELIVERY_COLUMNS: Final = "id, event_id, event_type, status, attempts, next_attempt_at, created_at"


# --- endpoints --------------------------------------------------------------------------------


async def insert_endpoint(conn: asyncpg.Connection, *, endpoint_id: str, project_id: str,
                          url: str, events: list[str], description: str | None,
                          secret_sealed: bytes) -> asyncpg.Record:
    row: asyncpg.Record = await conn.fetchrow(
        f"""INSERT INTO webhook_endpoints (id, project_id, url, events, description, secret_sealed)
            VALUES ($1, $2, $3, $4, $5, $6) RETURNING {ENDPOINT_COLUMNS}""",
        endpoint_id, project_id, url, events, description, secret_sealed)
    return row


async def find_endpoint(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                        endpoint_id: str, *, lock: bool = False) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(
        f"""SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints WHERE id = $1 AND project_id = $2
            {'FOR UPDATE' if lock else ''}""", endpoint_id, project_id)
    return row


async def update_endpoint(conn: asyncpg.Connection, endpoint_id: str,
                          changes: dict[str, Any]) -> asyncpg.Record:
    """Set ``changes`` (column -> value, columns of the caller's constants); enabling again
    clears ``disabled_reason`` and ``failing_since``."""
    p = Params()
    sets = [f"{column} = {p(value)}" for column, value in changes.items()]
    if changes.get("status") == "active":
        sets += ["disabled_reason = NULL", "failing_since = NULL"]
    row: asyncpg.Record = await conn.fetchrow(
        f"""UPDATE webhook_endpoints SET {', '.join(sets)}, updated_at = now()
            WHERE id = {p(endpoint_id)} RETURNING {ENDPOINT_COLUMNS}""", *p.values)
    return row


async def rotate_secret(conn: asyncpg.Connection, endpoint_id: str, secret_sealed: bytes,
                        overlap: timedelta) -> asyncpg.Record:
    """The new secret signs from now on; the current one signs beside it for ``overlap``."""
    row: asyncpg.Record = await conn.fetchrow(
        f"""UPDATE webhook_endpoints SET previous_secret_sealed = secret_sealed,
                   previous_secret_until = now() + $3, secret_sealed = $2, updated_at = now()
            WHERE id = $1 RETURNING {ENDPOINT_COLUMNS}""", endpoint_id, secret_sealed, overlap)
    return row


async def delete_endpoint(conn: asyncpg.Connection, project_id: str, endpoint_id: str) -> bool:
    """Delete the endpoint's deliveries, then the endpoint (the order in which the delivery
    worker locks them: a delivery, then its endpoint); whether it existed."""
    await conn.execute(
        """DELETE FROM webhook_deliveries WHERE endpoint_id = $1
           AND EXISTS (SELECT 1 FROM webhook_endpoints WHERE id = $1 AND project_id = $2)""",
        endpoint_id, project_id)
    found = await conn.fetchval(
        "DELETE FROM webhook_endpoints WHERE id = $1 AND project_id = $2 RETURNING 1",
        endpoint_id, project_id)
    return found is not None


# --- the fan-out ------------------------------------------------------------------------------

FANOUT_LOCK: Final = 0x77686570  # "whep": one fan-out at a time across processes
FANOUT: Final = f"""
WITH lock AS (
    SELECT pg_try_advisory_xact_lock($1) AS got
), b AS (
    SELECT e.tx, e.id, e.project_id, e.action, e.created_at FROM audit_events e
    WHERE (SELECT got FROM lock) AND e.tx < {LOG_HORIZON}
      AND (e.tx, e.id) > ((SELECT tx FROM webhook_fanout), (SELECT event_id FROM webhook_fanout))
    ORDER BY e.tx, e.id LIMIT $2
), made AS (
    INSERT INTO webhook_deliveries (id, endpoint_id, project_id, event_id, event_type,
                                    event_created_at, next_attempt_at)
    SELECT 'dlv_' || substr(b.id, 5, 10) || left(md5(w.id || ':' || b.id), 16), w.id,
           b.project_id, b.id, b.action, b.created_at, now()
    FROM b JOIN webhook_endpoints w
      ON w.project_id = b.project_id AND w.status = 'active' AND w.created_at <= b.created_at
     AND w.events && ARRAY[b.action, '*']
    ON CONFLICT (endpoint_id, event_id) DO NOTHING
    RETURNING 1
), last AS (
    SELECT tx, id FROM b ORDER BY tx DESC, id DESC LIMIT 1
), moved AS (
    UPDATE webhook_fanout f SET tx = last.tx, event_id = last.id FROM last
    WHERE (f.tx, f.event_id) < (last.tx, last.id)
    RETURNING 1
)
SELECT (SELECT got FROM lock) AS got, (SELECT count(*) FROM b)::int AS passed,
       (SELECT count(*) FROM made)::int AS made,
       (SELECT count(*) FROM moved)::int AS moved"""
"""One fan-out pass in one statement (autocommit: the lock ``$1`` is never held across round
trips, so a process that stalls cannot keep it): the next events of the log after the
position (values, so the index on ``(tx, id)`` starts there: a join with the position's row
read the whole log on every pass), at most ``$2`` and below the log's horizon (``audit.service.LOG_HORIZON``: none can
commit later below it), each delivered to the project's active endpoints subscribed to its
action and created at or before it, and the position moved past them (never backwards: a pass
that raced another one does no harm, the unique (endpoint, event) makes no delivery twice).
A delivery's id is ``dlv_`` + the event's ULID time + 16 hex digits of the MD5 of the endpoint
and event ids: sorted by the event's time, and the same whichever pass makes it. Answers
whether the lock was taken, how many events were passed, deliveries made, and whether the
position moved."""
NOTIFY: Final = f"SELECT pg_notify('{NOTIFY_CHANNEL}', '')"


# --- delivering -------------------------------------------------------------------------------

CLAIM: Final = """
UPDATE webhook_deliveries d SET locked_until = now() + $2, round = d.round + 1
WHERE d.id IN (
    SELECT id FROM webhook_deliveries
    WHERE status = 'pending' AND next_attempt_at <= now()
      AND (locked_until IS NULL OR locked_until < now())
    ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING d.id, d.endpoint_id, d.event_id, d.event_created_at, d.round"""
"""Claim up to ``$1`` due deliveries for ``$2`` (an interval), counting the attempt."""

CLAIMED_ENDPOINTS: Final = """
SELECT id, project_id, url, status, secret_sealed,
       CASE WHEN previous_secret_until > now() THEN previous_secret_sealed END
           AS previous_secret_sealed
FROM webhook_endpoints WHERE id = ANY($1::text[])"""
CLAIMED_EVENTS: Final = f"""
SELECT {EVENT_COLUMNS} FROM audit_events e
JOIN unnest($1::timestamptz[], $2::text[]) AS k (created_at, id)
  ON e.created_at = k.created_at AND e.id = k.id"""

OUTCOME: Final = """
WITH d AS (
    UPDATE webhook_deliveries SET
        status = $2, next_attempt_at = $3, locked_until = NULL,
        attempts = attempts || jsonb_build_array($4::jsonb)
    WHERE id = $1 RETURNING endpoint_id
), w AS (
    UPDATE webhook_endpoints w SET
        failing_since = CASE WHEN $5 THEN NULL ELSE coalesce(w.failing_since, now()) END,
        status = CASE WHEN $6::text IS NOT NULL
                        OR (NOT $5 AND coalesce(w.failing_since, now()) < now() - $7::interval)
                      THEN 'disabled' ELSE w.status END,
        disabled_reason = CASE
            WHEN $6::text IS NOT NULL THEN $6::text
            WHEN NOT $5 AND coalesce(w.failing_since, now()) < now() - $7::interval
                 AND w.status = 'active' THEN 'failing'
            ELSE w.disabled_reason END
    FROM d WHERE w.id = d.endpoint_id AND $8 AND (NOT $5 OR w.failing_since IS NOT NULL)
    RETURNING w.status
)
SELECT (SELECT status FROM w) AS endpoint_status"""
"""Record an attempt of delivery ``$1``: its new status ``$2`` and next attempt ``$3``, the
attempt ``$4`` (JSON), and on its endpoint whether it succeeded (``$5``: clears
``failing_since``), a reason to disable it at once (``$6``: ``gone``), and the failing period
after which failures alone disable it (``$7``); ``$8`` false: no request went out (the
endpoint's health is left alone). A success touches the endpoint only when it was failing:
the common case locks and writes one row, not two."""


# --- reading and requeueing deliveries --------------------------------------------------------


async def list_deliveries(conn: asyncpg.Connection | asyncpg.Pool, endpoint_id: str, *,
                          status: str | None, before: str | None, limit: int) -> list[asyncpg.Record]:
    """Up to ``limit`` deliveries of the endpoint newest first, older than the id ``before``."""
    p = Params()
    conds = [f"endpoint_id = {p(endpoint_id)}"]
    if status is not None:
        conds.append(f"status = {p(status)}")
    if before is not None:
        conds.append(f"id < {p(before)}")
    rows: list[asyncpg.Record] = await conn.fetch(
        f"""SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE {' AND '.join(conds)}
            ORDER BY id DESC LIMIT {p(limit)}::int""", *p.values)
    return rows


async def find_delivery(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                        delivery_id: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(
        f"""SELECT {DELIVERY_COLUMNS}, endpoint_id FROM webhook_deliveries
            WHERE id = $1 AND project_id = $2""", delivery_id, project_id)
    return row


async def requeue(conn: asyncpg.Connection, delivery_id: str) -> asyncpg.Record:
    """Send the delivery again now, with a fresh retry schedule."""
    row: asyncpg.Record = await conn.fetchrow(
        f"""UPDATE webhook_deliveries SET status = 'pending', next_attempt_at = now(), round = 0,
                   locked_until = NULL
            WHERE id = $1 RETURNING {DELIVERY_COLUMNS}""", delivery_id)
    await conn.execute(NOTIFY)
    return row


async def requeue_failed(conn: asyncpg.Connection, endpoint_id: str, since: datetime) -> int:
    """Queue again every failed delivery of the endpoint made at or after ``since``."""
    status = await conn.execute(
        """UPDATE webhook_deliveries SET status = 'pending', next_attempt_at = now(), round = 0,
                  locked_until = NULL
           WHERE endpoint_id = $1 AND status = 'failed' AND created_at >= $2""",
        endpoint_id, since)
    await conn.execute(NOTIFY)
    return int(status.split()[-1])


KEEP_DAYS: Final = 30
"""How long a delivery that succeeded or failed stays listed (and recoverable)."""
PURGE: Final = f"""
DELETE FROM webhook_deliveries WHERE id IN (
    SELECT id FROM webhook_deliveries
    WHERE status IN ('succeeded', 'failed') AND created_at < now() - interval '{KEEP_DAYS} days'
    LIMIT $1)"""
"""At most ``$1`` deliveries done for longer than :data:`KEEP_DAYS` (``delete_in_batches``)."""

