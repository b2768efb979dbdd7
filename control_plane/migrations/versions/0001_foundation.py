"""Foundation: tenants, projects, API keys, stores, tuples, the change log, the audit log.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from control_plane.migrate import run_sql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql("""
CREATE TABLE tenants (
    id          text PRIMARY KEY,
    name        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE projects (
    id          text PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name        text NOT NULL,
    environment text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX projects_tenant ON projects (tenant_id);

CREATE TABLE api_keys (
    id                text PRIMARY KEY,
    project_id        text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name              text NOT NULL,
    prefix            text NOT NULL CHECK (prefix IN ('sk_live_', 'sk_test_')),
    secret_hash       text NOT NULL UNIQUE,
    last_four         text NOT NULL,
    scopes            text[] NOT NULL DEFAULT '{}',
    created_by_key_id text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    revoked_at        timestamptz
);
CREATE INDEX api_keys_project ON api_keys (project_id, id);

-- A store's revision increases by one per effective write. The write transaction locks the store
-- row (SELECT ... FOR UPDATE) before it takes the next revision, so revisions commit in order
-- with no gaps and a reader following "revision > cursor" never skips a change.
CREATE TABLE stores (
    id          text PRIMARY KEY,
    project_id  text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name        text NOT NULL,
    revision    bigint NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX stores_project ON stores (project_id, id);

-- "subject" is the tuple's user (SPEC.md 2); USER is a reserved word in SQL.
CREATE TABLE tuples (
    store_id    text NOT NULL REFERENCES stores (id) ON DELETE CASCADE,
    object      text NOT NULL,
    relation    text NOT NULL,
    subject     text NOT NULL,
    revision    bigint NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (store_id, object, relation, subject)
);
CREATE INDEX tuples_by_subject ON tuples (store_id, subject, object, relation);
CREATE INDEX tuples_by_relation ON tuples (store_id, relation, object, subject);

CREATE TABLE tuple_changes (
    store_id    text NOT NULL REFERENCES stores (id) ON DELETE CASCADE,
    revision    bigint NOT NULL,
    seq         integer NOT NULL,
    operation   text NOT NULL CHECK (operation IN ('write', 'delete')),
    object      text NOT NULL,
    relation    text NOT NULL,
    subject     text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (store_id, revision, seq)
);

-- The platform-wide audit log (SPEC.md 2 "Audit event"): monthly range partitions made ahead by
-- the partition manager; the DEFAULT partition guarantees no insert ever fails for want of one.
CREATE TABLE audit_events (
    id          text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    action      text NOT NULL,
    actor_type  text NOT NULL,
    actor_id    text,
    user_id     text,
    project_id  text,
    target_type text,
    target_id   text,
    ip          text,
    user_agent  text,
    description text,
    api_key_id  text,
    metadata    jsonb NOT NULL DEFAULT '{}'::jsonb,
    PRIMARY KEY (created_at, id)
) PARTITION BY RANGE (created_at);
CREATE TABLE audit_events_default PARTITION OF audit_events DEFAULT;
CREATE INDEX audit_events_project_time ON audit_events (project_id, created_at DESC, id DESC);
    """)


def downgrade() -> None:
    run_sql("""
DROP TABLE audit_events;
DROP TABLE tuple_changes;
DROP TABLE tuples;
DROP TABLE stores;
DROP TABLE api_keys;
DROP TABLE projects;
DROP TABLE tenants;
    """)
