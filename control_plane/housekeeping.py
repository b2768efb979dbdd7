"""Housekeeping of identity records that outlived their use (a control-plane worker).

Every ``SERVICE_HOUSEKEEPING_INTERVAL_SECONDS`` (and once at start) it deletes, in batches so no
pass holds long locks:

* magic-link tokens a day past their expiry (until then a late click still hears "expired"
  rather than "not valid");
* messages delivered or failed more than 7 days ago (their bodies were wiped on delivery; the
  rows are kept a week for operators);
* sessions a day past their end: expired, or revoked with no access token of theirs still valid
  (the Redis revocation set covers those until then); their refresh tokens go with them;
* refresh-token generations more than ``KEEP_GENERATIONS`` behind a live session's newest: a
  token that old presented again is then merely unknown (refused) instead of recognised as
  reuse (refused, and the session revoked).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

import asyncpg

log = logging.getLogger("authio.housekeeping")

BATCH: Final = 5000
KEEP_GENERATIONS: Final = 100

# Each statement deletes at most BATCH rows and returns how many; it is repeated until a batch
# comes back short.
_PURGES: Final = {
    "magic_link_tokens": """
        DELETE FROM magic_link_tokens WHERE token_hash IN (
            SELECT token_hash FROM magic_link_tokens
            WHERE expires_at < now() - interval '1 day' LIMIT $1)""",
    "messages": """
        DELETE FROM messages WHERE id IN (
            SELECT id FROM messages
            WHERE status IN ('sent', 'failed')
              AND coalesce(sent_at, created_at) < now() - interval '7 days' LIMIT $1)""",
    "sessions": """
        DELETE FROM sessions WHERE id IN (
            SELECT id FROM sessions
            WHERE expires_at < now() - interval '1 day'
               OR (status = 'revoked' AND access_expires_at < now() - interval '1 day') LIMIT $1)""",
    "refresh_tokens": f"""
        DELETE FROM refresh_tokens WHERE token_hash IN (
            SELECT t.token_hash FROM refresh_tokens t
            JOIN (SELECT session_id, max(generation) AS latest FROM refresh_tokens
                  GROUP BY session_id HAVING max(generation) > {KEEP_GENERATIONS}) s
              ON s.session_id = t.session_id
            WHERE t.generation <= s.latest - {KEEP_GENERATIONS} LIMIT $1)""",
}


async def purge(pool: asyncpg.Pool, *, batch: int = BATCH) -> dict[str, int]:
    """One pass; returns the rows deleted per table."""
    deleted: dict[str, int] = {}
    for table, sql in _PURGES.items():
        total = 0
        while True:
            status = await pool.execute(sql, batch)
            n = int(status.rsplit(" ", 1)[-1])
            total += n
            if n < batch:
                break
        deleted[table] = total
    return deleted


async def run_housekeeping(pool: asyncpg.Pool, *, interval_seconds: float) -> None:
    """``purge`` now and every ``interval_seconds``; a failed pass is logged and retried at the
    next interval."""
    while True:
        try:
            deleted = await purge(pool)
            if any(deleted.values()):
                log.info("housekeeping deleted expired identity records", extra={"deleted": deleted})
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            log.warning("housekeeping pass failed; retrying at the next interval", exc_info=True)
        await asyncio.sleep(interval_seconds)
