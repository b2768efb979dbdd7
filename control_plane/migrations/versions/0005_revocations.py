"""Revocations committed with the revoke; one answer for every presentation of a refresh token.

* ``revocations`` is an outbox: a row is inserted in the transaction that revokes a session or an
  API key, and the announcer (``control_plane.sessions.tasks``) puts it on Redis (the revocation
  set and channel for sessions, the key channel for API keys), retrying until Redis has it. The
  row outlives the session or key it names (no foreign key: deleting a user deletes its
  sessions), so the set can be rebuilt from the rows whose ``until`` has not passed when Redis
  comes back empty. ``subject`` is the session id, or the API key's secret hash.
* ``refresh_tokens.successor_hash`` and ``successor_sealed``: the token that replaced this one
  when it was presented, and its plaintext sealed by the KMS (aad: this token's hash), so that
  presenting this token again within the grace period answers the same new refresh token
  (``authio_refresh_session`` outcome ``replayed``) instead of minting another: two tabs that
  refresh at once end with one pair.

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

# The refresh function of 0003 with one more outcome, 'replayed' (see the docstring).
_REFRESH = """
CREATE FUNCTION authio_refresh_session(p_token bytea, p_new_token bytea, p_new_sealed bytea,
                                       p_grace interval, p_access_expires timestamptz)
RETURNS TABLE (outcome text, generation integer, latest integer, role text, sess sessions,
               successor bytea,
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
    v_successor_hash bytea;
    v_successor bytea;
    v_outcome text := 'rotated';
BEGIN
    SELECT * INTO s FROM sessions
    WHERE id = (SELECT t.session_id FROM refresh_tokens t WHERE t.token_hash = p_token)
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'unknown'::text, NULL::integer, NULL::integer, NULL::text,
                            NULL::sessions, NULL::bytea, NULL, NULL, NULL::boolean, NULL,
                            NULL::boolean, NULL, NULL::jsonb, NULL::timestamptz,
                            NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;
    IF s.status <> 'active' OR now() > s.expires_at THEN
        RETURN QUERY SELECT CASE WHEN s.status <> 'active' THEN 'revoked' ELSE 'expired' END,
                            NULL::integer, NULL::integer, NULL::text, s, NULL::bytea, NULL, NULL,
                            NULL::boolean, NULL, NULL::boolean, NULL, NULL::jsonb,
                            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;
    SELECT t.generation, t.rotated_at IS NOT NULL, coalesce(t.used_at > now() - p_grace, false),
           (SELECT max(l.generation) FROM refresh_tokens l WHERE l.session_id = s.id),
           t.successor_hash, t.successor_sealed
      INTO v_generation, v_rotated, v_in_grace, v_latest, v_successor_hash, v_successor
      FROM refresh_tokens t WHERE t.token_hash = p_token;
    IF NOT FOUND THEN  -- deleted since the lock was taken (housekeeping)
        RETURN QUERY SELECT 'unknown'::text, NULL::integer, NULL::integer, NULL::text,
                            NULL::sessions, NULL::bytea, NULL, NULL, NULL::boolean, NULL,
                            NULL::boolean, NULL, NULL::jsonb, NULL::timestamptz,
                            NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;
    -- A rotated token is forgiven only if the client presented it before, within the grace,
    -- and no newer generation has been presented since.
    IF v_rotated AND (NOT v_in_grace OR EXISTS (
            SELECT 1 FROM refresh_tokens t WHERE t.session_id = s.id
               AND t.generation > v_generation AND t.used_at IS NOT NULL)) THEN
        RETURN QUERY SELECT 'reused'::text, v_generation, v_latest, NULL::text, s, NULL::bytea,
                            NULL, NULL, NULL::boolean, NULL, NULL::boolean, NULL, NULL::jsonb,
                            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;
    IF NOT v_rotated THEN
        -- A current token rotates every current generation of the session (the one presented
        -- is marked used and remembers its successor, any others a racing retry left are
        -- superseded).
        UPDATE refresh_tokens t
           SET rotated_at = now(),
               used_at = CASE WHEN t.token_hash = p_token THEN now() ELSE t.used_at END,
               successor_hash = CASE WHEN t.token_hash = p_token THEN p_new_token END,
               successor_sealed = CASE WHEN t.token_hash = p_token THEN p_new_sealed END
         WHERE t.session_id = s.id AND t.rotated_at IS NULL;
        INSERT INTO refresh_tokens (token_hash, session_id, generation)
        VALUES (p_new_token, s.id, v_latest + 1);
        v_latest := v_latest + 1;
    ELSIF v_successor IS NOT NULL AND EXISTS (
            SELECT 1 FROM refresh_tokens t WHERE t.token_hash = v_successor_hash
               AND t.rotated_at IS NULL) THEN
        -- A forgiven token whose successor is still current: the same successor again, so
        -- that every presentation (two tabs, a retry after a lost answer) ends with one pair.
        v_outcome := 'replayed';
    ELSE
        -- A forgiven token whose successor is gone (superseded by a racing retry): a new
        -- generation; the answer that raced it stays usable until one of them is presented.
        INSERT INTO refresh_tokens (token_hash, session_id, generation)
        VALUES (p_new_token, s.id, v_latest + 1);
        v_latest := v_latest + 1;
        v_successor := NULL;
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
                        CASE WHEN v_outcome = 'replayed' THEN v_successor END,
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
    announced_at  timestamptz
);
CREATE INDEX revocations_unannounced ON revocations (id) WHERE announced_at IS NULL;
CREATE INDEX revocations_live ON revocations (kind, until);

ALTER TABLE refresh_tokens ADD COLUMN successor_hash bytea, ADD COLUMN successor_sealed bytea;
DROP FUNCTION authio_refresh_session(bytea, bytea, interval, timestamptz);
""" + _REFRESH)


def downgrade() -> None:
    identity = importlib.import_module("control_plane.migrations.versions.0003_identity")
    run_sql("""
DROP FUNCTION authio_refresh_session(bytea, bytea, bytea, interval, timestamptz);
ALTER TABLE refresh_tokens DROP COLUMN successor_hash, DROP COLUMN successor_sealed;
DROP TABLE revocations;
""" + identity.REFRESH_FUNCTION)
