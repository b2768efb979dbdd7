"""Audit streams (issue 20): the whole audit log forwarded to a log platform or an HTTP endpoint.

``audit_streams`` (``strm_``): a project's stream, its destination (``destination_type``; the
full configuration sealed by the KMS, credentials included; ``destination_shown`` with every
credential replaced by ``"***"``), an optional action filter, and its position in the log,
``(tx, event_id)`` as the webhook fan-out reads it (migration 0010): the stream carries the
events after it, in that order. ``batch`` holds the ids of the batch sent and not yet
acknowledged: a retry sends exactly those events again, and the position moves past them only
once the destination acknowledged them (``audit_events_project_tx`` serves that read).
``status`` ``active``/``paused`` is the customer's;
``failing`` is set while the batch keeps failing (``last_error``, ``next_attempt_at``).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28
"""

from control_plane.migrate import run_sql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql("""
CREATE TABLE audit_streams (
    id                  text PRIMARY KEY,
    project_id          text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    destination_type    text NOT NULL,
    destination_sealed  bytea NOT NULL,
    destination_shown   jsonb NOT NULL,
    actions             text[],
    description         text,
    status              text NOT NULL DEFAULT 'active'
                        CHECK (status IN ('active', 'paused', 'failing')),
    tx                  xid8 NOT NULL,
    event_id            text NOT NULL DEFAULT '',
    batch               text[],
    batch_created_at    timestamptz[],
    batch_last_tx       xid8,
    failures            integer NOT NULL DEFAULT 0,
    last_error          text,
    last_delivered_at   timestamptz,
    next_attempt_at     timestamptz NOT NULL DEFAULT now(),
    locked_until        timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX audit_streams_project ON audit_streams (project_id, id);
-- A stream reads its project's events in (tx, id) order from its position: this index hands
-- them over in that order, so a batch costs its own rows, not a sort of everything after it.
CREATE INDEX audit_events_project_tx ON audit_events (project_id, tx, id);
CREATE INDEX audit_streams_due ON audit_streams (next_attempt_at) WHERE status <> 'paused';
    """)


def downgrade() -> None:
    run_sql("DROP INDEX audit_events_project_tx; DROP TABLE audit_streams;")
