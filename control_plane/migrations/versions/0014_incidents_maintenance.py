"""Incidents and maintenance windows (issue 21; SPEC.md 6 ``incident.*``, ``maintenance.*``, 8
breach notification).

``incidents`` (``inc_``): a project's record of a security or availability incident. ``severity``
``sev1`` (highest) to ``sev4``; ``personal_data`` whether personal data was affected (a breach);
``affected_projects`` the project ids it names (the caller's by default: ids, not references, so
an incident outlives a deleted project it named). ``detected_at`` is when it was detected (given,
or the creation time); ``notify_by`` the notification deadline it implies, stored by each write
that changes severity or ``personal_data`` (the earliest of ``detected_at`` + 4 hours for
``sev1`` and + 72 hours for a personal-data breach; null when neither applies), so the overdue
filter reads a column; ``notified_at`` when the authorities or customers were told. ``status``
``open`` until resolved (``resolved_at``); a resolved incident is never reopened.

``maintenance_windows`` (``mw_``): a project's planned maintenance, ``scheduled`` for
``starts_at`` to ``ends_at``, then ``in_progress`` (``started_at``) and ``completed``
(``completed_at``), in that order only. ``maintenance_windows_in_progress`` is what ``GET
/readyz`` reads (service-wide, every project's started windows): partial, so it holds only the
few windows under way and the probe's statement never reads the history.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-30
"""

from control_plane.migrate import run_sql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql("""
CREATE TABLE incidents (
    id                 text PRIMARY KEY,
    project_id         text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    severity           text NOT NULL CHECK (severity IN ('sev1', 'sev2', 'sev3', 'sev4')),
    title              text NOT NULL,
    description        text,
    personal_data      boolean NOT NULL DEFAULT false,
    affected_projects  text[] NOT NULL,
    status             text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'resolved')),
    detected_at        timestamptz NOT NULL,
    notify_by          timestamptz,
    notified_at        timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    resolved_at        timestamptz,
    CHECK ((status = 'resolved') = (resolved_at IS NOT NULL))
);
CREATE INDEX incidents_project ON incidents (project_id, id);

CREATE TABLE maintenance_windows (
    id            text PRIMARY KEY,
    project_id    text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    title         text NOT NULL,
    description   text,
    status        text NOT NULL DEFAULT 'scheduled'
                  CHECK (status IN ('scheduled', 'in_progress', 'completed')),
    starts_at     timestamptz NOT NULL,
    ends_at       timestamptz NOT NULL,
    started_at    timestamptz,
    completed_at  timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CHECK (ends_at > starts_at)
);
CREATE INDEX maintenance_windows_project ON maintenance_windows (project_id, id);
CREATE INDEX maintenance_windows_in_progress ON maintenance_windows (started_at, id)
    WHERE status = 'in_progress';
    """)


def downgrade() -> None:
    run_sql("""
DROP TABLE maintenance_windows;
DROP TABLE incidents;
    """)
