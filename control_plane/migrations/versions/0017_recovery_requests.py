"""Account recovery requests (issue 23; SPEC.md 2 "recovery request", events
``recovery.request.*``).

``recovery_requests`` (``rcv_``): a user who lost every passkey and their e-mail asks, through
the application, to be let back in at a new destination (``channel`` ``email`` or ``sms``,
``destination``). An operator approves or denies it once (``status``); approval makes the
destination the user's (unverified until its link is used), revokes every session and sends a
one-time recovery link there (``magic_link_tokens.purpose`` ``recovery``; ``message_id``). At most
one request of a user is pending. The rows go with the user (a data-subject deletion deletes
them first, as its own count).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-29
"""

from control_plane.migrate import run_sql

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql("""
CREATE TABLE recovery_requests (
    id             text PRIMARY KEY,
    project_id     text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    user_id        text NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    channel        text NOT NULL CHECK (channel IN ('email', 'sms')),
    destination    text NOT NULL,
    reason         text,
    status         text NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'approved', 'denied')),
    decision_note  text,
    decided_by     text,
    decided_at     timestamptz,
    message_id     text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    CHECK ((status = 'pending') = (decided_at IS NULL))
);
CREATE INDEX recovery_requests_project ON recovery_requests (project_id, id);
CREATE INDEX recovery_requests_user ON recovery_requests (user_id);
CREATE UNIQUE INDEX recovery_requests_one_pending ON recovery_requests (user_id)
    WHERE status = 'pending';

ALTER TABLE magic_link_tokens
    DROP CONSTRAINT magic_link_tokens_purpose_check,
    ADD CONSTRAINT magic_link_tokens_purpose_check
        CHECK (purpose IN ('signin', 'enrollment', 'invitation', 'step_up', 'recovery'));
    """)


def downgrade() -> None:
    run_sql("""
DELETE FROM magic_link_tokens WHERE purpose = 'recovery';
ALTER TABLE magic_link_tokens
    DROP CONSTRAINT magic_link_tokens_purpose_check,
    ADD CONSTRAINT magic_link_tokens_purpose_check
        CHECK (purpose IN ('signin', 'enrollment', 'invitation', 'step_up'));
DROP TABLE recovery_requests;
    """)
