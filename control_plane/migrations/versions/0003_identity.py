"""Identity: users, organizations, memberships, invitations, magic links, the message outbox,
signing keys, sessions and refresh tokens.

* Emails are kept as given and matched case-insensitively: the unique index is on
  ``lower(email)`` per project (SPEC.md 2 "User": unique on (project_id, email)). A user may be
  reachable by phone only (an SMS sign-in by an unknown number), hence the CHECK.
* Magic-link and refresh tokens are stored as SHA-256 digests only; the plaintext exists in the
  message that carries it and in the response that returns it.
* ``messages`` is the transactional outbox: a row is inserted in the same transaction as the
  change that needs it (a new user, an invitation, a sign-in request) and delivered by the outbox
  worker, which claims rows with a lease (``locked_until``), so a crash mid-delivery leaves the
  row to be claimed again once the lease runs out. The body is envelope-encrypted (it holds a live
  sign-in link) and wiped once delivered. ``expires_at`` (null: never) is when the message stops
  being useful (its link expires): until then transient failures are retried, after it the
  message fails undelivered.
* ``signing_keys``: one ``active`` key per project (a partial unique index), a ``pending`` key
  published ahead of its use, ``retired`` keys published until ``publish_until``. Private keys
  are envelope-encrypted (``common.kms``).
* ``sessions.access_expires_at`` is the latest ``exp`` of any access token issued for the
  session: a revocation must outlive it (the Redis revocation set's member expiry).
* ``refresh_tokens`` keeps every generation of a session's refresh token so that a rotated one
  presented again is recognised (reuse detection) rather than merely unknown. ``used_at`` tells
  a token the client presented from one that was only superseded: a rotated token is forgiven
  within the grace period only while no newer generation has been presented.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from control_plane.migrate import run_sql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


REFRESH_FUNCTION = """
-- Refresh token rotation in one round trip (control_plane.sessions.refresh). Each statement of a
-- plpgsql function takes a fresh snapshot, so the token's state is read after the session's row
-- lock is held: concurrent refreshes of one session are serialised and each sees the last one's
-- rotation. Outcomes: 'unknown', 'revoked', 'expired', 'reused' (nothing changed: the caller
-- revokes the session and records it), 'rotated' (with the session row after it, and the user's
-- fields: control_plane.users.USER_COLUMNS, spelled out since asyncpg cannot decode a composite
-- holding jsonb, which the pool decodes as text).
CREATE FUNCTION authio_refresh_session(p_token bytea, p_new_token bytea, p_grace interval,
                                       p_access_expires timestamptz)
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
BEGIN
    SELECT * INTO s FROM sessions
    WHERE id = (SELECT t.session_id FROM refresh_tokens t WHERE t.token_hash = p_token)
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'unknown'::text, NULL::integer, NULL::integer, NULL::text,
                            NULL::sessions, NULL, NULL, NULL::boolean, NULL, NULL::boolean, NULL,
                            NULL::jsonb, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz;
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
                            NULL::sessions, NULL, NULL, NULL::boolean, NULL, NULL::boolean, NULL,
                            NULL::jsonb, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;
    -- A rotated token is forgiven only if the client presented it before, within the grace,
    -- and no newer generation has been presented since.
    IF v_rotated AND (NOT v_in_grace OR EXISTS (
            SELECT 1 FROM refresh_tokens t WHERE t.session_id = s.id
               AND t.generation > v_generation AND t.used_at IS NOT NULL)) THEN
        RETURN QUERY SELECT 'reused'::text, v_generation, v_latest, NULL::text, s, NULL, NULL,
                            NULL::boolean, NULL, NULL::boolean, NULL, NULL::jsonb,
                            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;
    -- A current token rotates every current generation of the session (the one presented is
    -- marked used, any others a racing retry left are superseded). A forgiven retry only adds a
    -- generation: the answer that raced it stays usable until one of them is presented.
    IF NOT v_rotated THEN
        UPDATE refresh_tokens t
           SET rotated_at = now(),
               used_at = CASE WHEN t.token_hash = p_token THEN now() ELSE t.used_at END
         WHERE t.session_id = s.id AND t.rotated_at IS NULL;
    END IF;
    INSERT INTO refresh_tokens (token_hash, session_id, generation)
    VALUES (p_new_token, s.id, v_latest + 1);
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
    RETURN QUERY SELECT 'rotated'::text, v_generation, v_latest + 1, v_role, x, u.id, u.email,
                        u.email_verified, u.phone_number, u.phone_verified, u.name, u.metadata,
                        u.created_at, u.updated_at, u.last_sign_in_at
                   FROM sessions x JOIN users u ON u.id = x.user_id WHERE x.id = s.id;
END
$fn$;
"""
"""The refresh function as this revision made it (0005 replaces it; its downgrade restores
this)."""


def upgrade() -> None:
    run_sql("""
ALTER TABLE projects
    ADD COLUMN signing_alg text NOT NULL DEFAULT 'EdDSA' CHECK (signing_alg IN ('EdDSA', 'RS256'));

-- Hosts that resolve to a project on public endpoints (DESIGN.md "project of public endpoints").
CREATE TABLE project_domains (
    domain      text PRIMARY KEY CHECK (domain = lower(domain)),
    project_id  text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX project_domains_project ON project_domains (project_id);

CREATE TABLE users (
    id              text PRIMARY KEY,
    project_id      text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    email           text,
    email_verified  boolean NOT NULL DEFAULT false,
    phone_number    text,
    phone_verified  boolean NOT NULL DEFAULT false,
    name            text NOT NULL DEFAULT '',
    metadata        jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    last_sign_in_at timestamptz,
    CHECK (email IS NOT NULL OR phone_number IS NOT NULL)
);
CREATE UNIQUE INDEX users_project_email ON users (project_id, lower(email)) WHERE email IS NOT NULL;
CREATE UNIQUE INDEX users_project_phone ON users (project_id, phone_number) WHERE phone_number IS NOT NULL;
CREATE INDEX users_project ON users (project_id, id);

CREATE TABLE organizations (
    id          text PRIMARY KEY,
    project_id  text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name        text NOT NULL,
    slug        text NOT NULL,
    metadata    jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (project_id, slug)
);
CREATE INDEX organizations_project ON organizations (project_id, id);

CREATE TABLE memberships (
    id              text PRIMARY KEY,
    project_id      text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    organization_id text NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    user_id         text NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    role            text NOT NULL,
    status          text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'suspended')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (organization_id, user_id)
);
CREATE INDEX memberships_org ON memberships (organization_id, id);
CREATE INDEX memberships_user ON memberships (user_id) WHERE status = 'active';

CREATE TABLE invitations (
    id                  text PRIMARY KEY,
    project_id          text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    organization_id     text NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    email               text NOT NULL,
    role                text NOT NULL,
    status              text NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'accepted', 'revoked')),
    expires_at          timestamptz NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    accepted_at         timestamptz,
    accepted_user_id    text,
    revoked_at          timestamptz,
    created_by          text
);
CREATE INDEX invitations_org ON invitations (organization_id, id);
-- At most one pending invitation per (organization, email).
CREATE UNIQUE INDEX invitations_pending_email ON invitations (organization_id, lower(email))
    WHERE status = 'pending';

CREATE TABLE magic_link_tokens (
    token_hash      bytea PRIMARY KEY,
    project_id      text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    purpose         text NOT NULL CHECK (purpose IN ('signin', 'enrollment', 'invitation')),
    channel         text NOT NULL CHECK (channel IN ('email', 'sms')),
    destination     text NOT NULL,
    user_id         text REFERENCES users (id) ON DELETE CASCADE,
    invitation_id   text REFERENCES invitations (id) ON DELETE CASCADE,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    consumed_at     timestamptz
);
CREATE INDEX magic_link_tokens_expiry ON magic_link_tokens (expires_at);

CREATE TABLE messages (
    id              text PRIMARY KEY,
    project_id      text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    channel         text NOT NULL CHECK (channel IN ('email', 'sms')),
    kind            text NOT NULL,
    destination     text NOT NULL,
    body_sealed     bytea,
    status          text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'failed')),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    locked_until    timestamptz,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz,
    sent_at         timestamptz
);
CREATE INDEX messages_due ON messages (next_attempt_at) WHERE status = 'pending';
CREATE INDEX messages_project ON messages (project_id, id);

CREATE TABLE signing_keys (
    kid             text PRIMARY KEY,
    project_id      text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    alg             text NOT NULL CHECK (alg IN ('EdDSA', 'RS256')),
    public_jwk      jsonb NOT NULL,
    private_sealed  bytea NOT NULL,
    status          text NOT NULL CHECK (status IN ('pending', 'active', 'retired')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    activated_at    timestamptz,
    retired_at      timestamptz,
    publish_until   timestamptz
);
CREATE UNIQUE INDEX signing_keys_one_active ON signing_keys (project_id) WHERE status = 'active';
CREATE UNIQUE INDEX signing_keys_one_pending ON signing_keys (project_id) WHERE status = 'pending';
CREATE INDEX signing_keys_project ON signing_keys (project_id, created_at);

CREATE TABLE sessions (
    id                  text PRIMARY KEY,
    project_id          text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    user_id             text NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    organization_id     text REFERENCES organizations (id) ON DELETE SET NULL,
    status              text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'revoked')),
    auth_method         text NOT NULL,
    ip                  text,
    user_agent          text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    expires_at          timestamptz NOT NULL,
    last_refreshed_at   timestamptz,
    access_expires_at   timestamptz NOT NULL,
    revoked_at          timestamptz,
    revoke_reason       text
);
CREATE INDEX sessions_user ON sessions (user_id);

CREATE TABLE refresh_tokens (
    token_hash      bytea PRIMARY KEY,
    session_id      text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    generation      integer NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    rotated_at      timestamptz,  -- replaced by a newer generation
    used_at         timestamptz,  -- presented by the client (and so rotated)
    UNIQUE (session_id, generation)
);
CREATE INDEX refresh_tokens_current ON refresh_tokens (session_id) WHERE rotated_at IS NULL;

""" + REFRESH_FUNCTION)


def downgrade() -> None:
    run_sql("""
DROP FUNCTION authio_refresh_session;
DROP TABLE refresh_tokens;
DROP TABLE sessions;
DROP TABLE signing_keys;
DROP TABLE messages;
DROP TABLE magic_link_tokens;
DROP TABLE invitations;
DROP TABLE memberships;
DROP TABLE organizations;
DROP TABLE users;
DROP TABLE project_domains;
ALTER TABLE projects DROP COLUMN signing_alg;
    """)
