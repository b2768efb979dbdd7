"""SQL of the device authorization grant (table ``device_authorizations``, migration 0015)."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

import asyncpg

INSERT: Final = """
INSERT INTO device_authorizations (id, device_code_hash, user_code, client_id, requested_scopes,
                                   interval_seconds, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7))
ON CONFLICT (user_code) DO NOTHING
RETURNING id"""
"""A new pending request; nothing when its user code is taken (the caller draws another)."""

BY_DEVICE_CODE: Final = """
SELECT id, status, client_id, project_id, scopes, approved_by_key_id, approved_by_operator_id,
       key_id, interval_seconds,
       last_polled_at, now() AS now, expires_at <= now() AS expired
FROM device_authorizations WHERE device_code_hash = $1 FOR UPDATE"""

POLLED: Final = """
UPDATE device_authorizations SET last_polled_at = now(), interval_seconds = $2 WHERE id = $1"""

REDEEMED: Final = """
UPDATE device_authorizations SET status = 'redeemed', key_id = $2, redeemed_at = now()
WHERE id = $1"""

BY_USER_CODE: Final = """
SELECT id, status, client_id, requested_scopes, project_id,
       GREATEST(0, ceil(extract(epoch FROM expires_at - now())))::int AS expires_in,
       expires_at <= now() AS expired
FROM device_authorizations WHERE user_code = $1 FOR UPDATE"""

DECIDED: Final = """
UPDATE device_authorizations
SET status = $2, project_id = $3, scopes = $4, approved_by_key_id = $5,
    approved_by_operator_id = $6, decided_at = now()
WHERE id = $1"""


async def purge(pool: asyncpg.Pool, *, older_than: timedelta) -> int:
    """Delete the requests that expired more than ``older_than`` ago; how many."""
    status = await pool.execute(
        "DELETE FROM device_authorizations WHERE expires_at < now() - $1::interval", older_than)
    return int(status.split()[-1])


CREDENTIAL_COLUMNS: Final = "id, provider, source_project_id, created_at, expires_at"

INSERT_CREDENTIAL: Final = f"""
INSERT INTO import_credentials (id, project_id, provider, source_project_id, token_sealed,
                                created_by_key_id, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, now() + $7::interval)
RETURNING {CREDENTIAL_COLUMNS}"""

CREDENTIAL: Final = f"""
SELECT {CREDENTIAL_COLUMNS}, token_sealed FROM import_credentials
WHERE id = $1 AND project_id = $2 AND expires_at > now()"""

DELETE_CREDENTIAL: Final = f"""
DELETE FROM import_credentials WHERE id = $1 AND project_id = $2 RETURNING {CREDENTIAL_COLUMNS}"""


async def purge_credentials(pool: asyncpg.Pool) -> int:
    """Delete every live-mode credential past its ``expires_at``; how many."""
    status = await pool.execute("DELETE FROM import_credentials WHERE expires_at <= now()")
    return int(status.split()[-1])
