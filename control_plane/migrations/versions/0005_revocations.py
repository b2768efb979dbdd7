"""Revocations committed with the revoke; one answer for every presentation of a refresh token.

* ``revocations`` is an outbox: a row is inserted in the transaction that revokes a session or an
  API key, and the announcer (``control_plane.sessions.tasks``) puts it on Redis (the revocation
  set and channel for sessions, the key channel for API keys), retrying until Redis has it. The
  row outlives the session or key it names (no foreign key: deleting a user deletes its
  sessions), so the set can be rebuilt from the rows whose ``until`` has not passed when Redis
  comes back empty. ``subject`` is the session id, or the API key's secret hash.
* ``authio_refresh_session`` answers every presentation of a refresh token within the grace
  period with the same successor: the successor is derived from the token (an HMAC under a key
  of the KMS, ``sessions.service.successor_of``), so a second presentation derives it again and,
  while it is still current, it is answered again (outcome ``replayed``) instead of a new
  generation. Two tabs that refresh at once end with one pair, and nothing but digests is
  stored.
* ``revocations.claimed_until``: an announcer's lease on the rows it is putting on Redis (it
  holds no transaction meanwhile); a lease that lapses (the announcer died) frees the rows.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

import importlib

from control_plane.migrate import run_sql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# The refresh function of 0003 (same signature) with one more outcome, 'replayed': see the
# docstring. ``p_new_token`` is the digest of the presented token's derived successor.
_REFRESH = """
-- Refresh token rotation in one round trip (control_plane.sessions.service.refresh); each
-- statement takes a fresh snapshot, so the token's state is read after the session's row lock is
-- held. Outcomes: 'unknown', 'revoked', 'expired', 'reused' (nothing changed: the caller revokes
-- the session), 'rotated' (a new generation), 'replayed' (the current successor answered again);
-- the last two with the session row after it and the user's fields.
CREATE OR REPLACE FUNCTION authio_refresh_session(p_token bytea, p_new_token bytea,
                                                  p_grace interval, p_access_expires timestamptz)
RETURNS TABLE (outcome text, generation integer, latest integer, role text, sess sessions,
               id text, email text, email_verified boolean, phone_number text,
               phone_verified boolean, name text, metadata jsonb, created_at timestamptz,
               updated_at timestamptz, last_sign_in_at timestamptz)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    s sessions;
    v_generation integer;
    v_rotated boolean;
    v_in_grace boolean;
    v_latest integer;
    v_role text;
    v_outcome text := 'rotated';
BEGIN
    SELECT * INTO s FROM sessions
    WHERE id = (SELECT t.session_id FROM refresh_tokens t WHERE t.token_hash = p_token)
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'unknown'::text, NULL::integer, NULL::integer, NULL::text,
                            NULL::sessions, NULL, NULL, NULL::boolean, NULL,
                            NULL::boolean, NULL, NULL::jsonb, NULL::timestamptz,
                            NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;
    IF s.status <> 'active' OR now() > s.expires_at THEN
        RETURN QUERY SELECT CASE WHEN s.status <> 'active' THEN 'revoked' ELSE 'expired' END,
                            NULL::integer, NULL::integer, NULL::text, s, NULL, NULL,
                            NULL::boolean, NULL, NULL::boolean, NULL, NULL::jsonb,
                            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;
    SELECT t.generation, t.rotated_at IS NOT NULL, coalesce(t.used_at > now() - p_grace, false),
           (SELECT max(l.generation) FROM refresh_tokens l WHERE l.session_id = s.id)
      INTO v_generation, v_rotated, v_in_grace, v_latest
      FROM refresh_tokens t WHERE t.token_hash = p_token;
    IF NOT FOUND THEN  -- deleted since the lock was taken (housekeeping)
        RETURN QUERY SELECT 'unknown'::text, NULL::integer, NULL::integer, NULL::text,
                            NULL::sessions, NULL, NULL, NULL::boolean, NULL,
                            NULL::boolean, NULL, NULL::jsonb, NULL::timestamptz,
                            NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;
    -- A rotated token is forgiven only if the client presented it before, within the grace,
    -- and no newer generation has been presented since.
    IF v_rotated AND (NOT v_in_grace OR EXISTS (
            SELECT 1 FROM refresh_tokens t WHERE t.session_id = s.id
               AND t.generation > v_generation AND t.used_at IS NOT NULL)) THEN
        RETURN QUERY SELECT 'reused'::text, v_generation, v_latest, NULL::text, s,
                            NULL, NULL, NULL::boolean, NULL, NULL::boolean, NULL, NULL::jsonb,
                            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;
    IF NOT v_rotated THEN
        -- A current token rotates every current generation of the session (the one presented
        -- is marked used, any others a racing retry left are superseded).
        UPDATE refresh_tokens t
           SET rotated_at = now(),
               used_at = CASE WHEN t.token_hash = p_token THEN now() ELSE t.used_at END
         WHERE t.session_id = s.id AND t.rotated_at IS NULL;
        INSERT INTO refresh_tokens (token_hash, session_id, generation)
        VALUES (p_new_token, s.id, v_latest + 1);
        v_latest := v_latest + 1;
    ELSIF EXISTS (SELECT 1 FROM refresh_tokens t WHERE t.token_hash = p_new_token
                     AND t.session_id = s.id AND t.rotated_at IS NULL) THEN
        -- A forgiven token whose successor (derived from it) is still current: the same
        -- successor again, so every presentation (two tabs, a retry after a lost answer) ends
        -- with one pair.
        v_outcome := 'replayed';
    ELSIF EXISTS (SELECT 1 FROM refresh_tokens t WHERE t.token_hash = p_new_token) THEN
        -- Its successor was rotated without being presented: only a party holding a newer token
        -- could have done that.
        RETURN QUERY SELECT 'reused'::text, v_generation, v_latest, NULL::text, s,
                            NULL, NULL, NULL::boolean, NULL, NULL::boolean, NULL, NULL::jsonb,
                            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz;
        RETURN;
    ELSE
        -- Rotated before successors were derived, or under another KMS key: a new generation,
        -- as before (the answer that raced it stays usable until one of them is presented).
        INSERT INTO refresh_tokens (token_hash, session_id, generation)
        VALUES (p_new_token, s.id, v_latest + 1);
        v_latest := v_latest + 1;
    END IF;
    IF s.organization_id IS NOT NULL THEN
        SELECT m.role INTO v_role FROM memberships m
         WHERE m.user_id = s.user_id AND m.organization_id = s.organization_id
           AND m.status = 'active';
    END IF;
    -- A membership suspended or removed since drops the organization context.
    UPDATE sessions x
       SET last_refreshed_at = now(),
           organization_id = CASE WHEN v_role IS NULL THEN NULL ELSE x.organization_id END,
           access_expires_at = greatest(x.access_expires_at, p_access_expires)
     WHERE x.id = s.id;
    RETURN QUERY SELECT v_outcome, v_generation, v_latest, v_role, x,
                        u.id, u.email, u.email_verified, u.phone_number, u.phone_verified,
                        u.name, u.metadata, u.created_at, u.updated_at, u.last_sign_in_at
                   FROM sessions x JOIN users u ON u.id = x.user_id WHERE x.id = s.id;
END
$fn$;
"""


def upgrade() -> None:
    run_sql("""
CREATE TABLE revocations (
    id            bigserial PRIMARY KEY,
    kind          text NOT NULL CHECK (kind IN ('session', 'api_key')),
    subject       text NOT NULL,
    project_id    text NOT NULL,
    until         timestamptz NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    claimed_until timestamptz,
    announced_at  timestamptz
);
CREATE INDEX revocations_unannounced ON revocations (id) WHERE announced_at IS NULL;
CREATE INDEX revocations_live ON revocations (kind, until);
""" + _REFRESH)


def downgrade() -> None:
    identity = importlib.import_module("control_plane.migrations.versions.0003_identity")
    run_sql("""
DROP FUNCTION authio_refresh_session(bytea, bytea, interval, timestamptz);
DROP TABLE revocations;
""" + identity.REFRESH_FUNCTION)
