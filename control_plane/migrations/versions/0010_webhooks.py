"""Webhooks (issue 20): endpoints, their deliveries, and the audit log's commit-safe position.

* ``audit_events.tx``: the writing transaction's id (``pg_current_xact_id()``, an ``xid8``).
  A reader of the log in ``(tx, id)`` order that stops below the oldest transaction still
  running (``pg_snapshot_xmin(pg_current_snapshot())``) never passes an event whose transaction
  commits late: every transaction below that horizon has ended. Rows written before this
  migration keep a null ``tx`` (readers start after them). The index serves those readers.
* ``webhook_endpoints`` (``whep_``): a project's subscriptions: ``url``, ``events`` (action
  names or ``*``), the signing secret sealed by the KMS (and, for 24 hours after a rotation,
  the previous one), ``status`` with ``disabled_reason`` (``gone`` after a 410, ``failing``
  after five days of nothing but failures), and ``failing_since``: the first failure since
  the last success.
* ``webhook_deliveries`` (``dlv_``): one per (event, endpoint subscribed when the event
  committed), made by the fan-out from the log; ``attempts`` is every attempt's ``at``,
  ``status_code``, ``duration_ms`` and ``error``; ``round`` counts the attempts since the
  delivery was last (re)queued, which is what the retry schedule is indexed by.
* ``webhook_fanout``: the fan-out's position in the log (one row).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from control_plane.migrate import run_sql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql("""
ALTER TABLE audit_events ADD COLUMN tx xid8;
ALTER TABLE audit_events ALTER COLUMN tx SET DEFAULT pg_current_xact_id();
CREATE INDEX audit_events_tx ON audit_events (tx, id);

CREATE TABLE webhook_endpoints (
    id                      text PRIMARY KEY,
    project_id              text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    url                     text NOT NULL,
    events                  text[] NOT NULL,
    description             text,
    status                  text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'disabled')),
    disabled_reason         text CHECK (disabled_reason IN ('gone', 'failing')),
    secret_sealed           bytea NOT NULL,
    previous_secret_sealed  bytea,
    previous_secret_until   timestamptz,
    failing_since           timestamptz,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_endpoints_project ON webhook_endpoints (project_id, id DESC);
CREATE INDEX webhook_endpoints_active ON webhook_endpoints (project_id) WHERE status = 'active';

CREATE TABLE webhook_deliveries (
    id                text PRIMARY KEY,
    endpoint_id       text NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    project_id        text NOT NULL,
    event_id          text NOT NULL,
    event_type        text NOT NULL,
    event_created_at  timestamptz NOT NULL,
    status            text NOT NULL DEFAULT 'pending'
                      CHECK (status IN ('pending', 'succeeded', 'failed')),
    attempts          jsonb NOT NULL DEFAULT '[]'::jsonb,
    round             integer NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz,
    locked_until      timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (endpoint_id, event_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE status = 'pending';
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, id DESC);
CREATE INDEX webhook_deliveries_failed ON webhook_deliveries (endpoint_id, created_at)
    WHERE status = 'failed';

CREATE TABLE webhook_fanout (
    one       boolean PRIMARY KEY DEFAULT true CHECK (one),
    tx        xid8 NOT NULL,
    event_id  text NOT NULL
);
INSERT INTO webhook_fanout (tx, event_id) VALUES (pg_snapshot_xmin(pg_current_snapshot()), '');
    """)


def downgrade() -> None:
    run_sql("""
DROP TABLE webhook_fanout;
DROP TABLE webhook_deliveries;
DROP TABLE webhook_endpoints;
DROP INDEX audit_events_tx;
ALTER TABLE audit_events DROP COLUMN tx;
    """)
