"""Data-subject requests (issue 21; SPEC.md 2 "DSR", 4 rules 2 and 3).

``dsr_requests`` (``dsr_``): a project's request to delete or export what it holds about the
end user of ``user_email``, due ``due_days`` after its creation (``due_at``). ``status``
``pending`` until fulfilled; a deletion is ``in_progress`` between the transaction that
hard-deletes the user's rows (``deleted_at``, ``user_id``: the user it found, null when the
project held nothing) and the last anonymization batch; ``locked_until`` is the lease of the
process running those batches (another resumes them once it lapsed). ``result`` holds what the
fulfilment answered (counts, or an export's digest); an export's document is kept in
``document`` as the bytes its SHA-256 (``output_sha256``) was taken of, for a repeated call.

Finding what names the user once the user is gone:

* ``risk_decisions.user_id`` no longer references ``users``: like ``audit_events.user_id`` it is
  history, kept after a user's deletion until a data-subject deletion anonymizes it in batches
  (with ON DELETE SET NULL the deletion would have lost which decisions were the user's).
* ``audit_events_project_email``: the events whose metadata names an ``user_email`` (an
  invitation names an address before any user has it), so a deletion finds them without
  reading the whole log. Partial: events without the key cost nothing to write.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28
"""

from control_plane.migrate import run_sql

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql("""
CREATE TABLE dsr_requests (
    id                   text PRIMARY KEY,
    project_id           text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    request_type         text NOT NULL CHECK (request_type IN ('deletion', 'export')),
    user_email           text NOT NULL,
    notes                text,
    due_days             integer NOT NULL CHECK (due_days BETWEEN 1 AND 90),
    status               text NOT NULL DEFAULT 'pending'
                         CHECK (status IN ('pending', 'in_progress', 'fulfilled')),
    created_at           timestamptz NOT NULL DEFAULT now(),
    due_at               timestamptz NOT NULL,
    fulfilled_at         timestamptz,
    user_id              text,
    deleted_at           timestamptz,
    locked_until         timestamptz,
    result               jsonb,
    output_artifact_url  text,
    output_sha256        text,
    document             bytea
);
CREATE INDEX dsr_requests_project ON dsr_requests (project_id, id);
CREATE INDEX dsr_requests_in_progress ON dsr_requests (locked_until) WHERE status = 'in_progress';

ALTER TABLE risk_decisions DROP CONSTRAINT risk_decisions_user_id_fkey;

CREATE INDEX audit_events_project_email
    ON audit_events (project_id, lower(metadata ->> 'user_email'), created_at)
    WHERE metadata ? 'user_email';
    """)


def downgrade() -> None:
    run_sql("""
DROP INDEX audit_events_project_email;
UPDATE risk_decisions d SET user_id = NULL
WHERE user_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM users u WHERE u.id = d.user_id);
ALTER TABLE risk_decisions ADD CONSTRAINT risk_decisions_user_id_fkey
    FOREIGN KEY (user_id) REFERENCES users (id) ON DELETE SET NULL;
DROP TABLE dsr_requests;
    """)
