"""Live-mode credentials of the multi-tenant importer (issue 22; SPEC.md 4 rule 6).

``import_credentials`` (``impc_``): a management token of an origin provider's project
(``provider`` ``descope``, ``source_project_id``) handed to the service so that it reads the
origin's management API for ``authio import descope --live-token``. The token is sealed by the
KMS (envelope encryption, bound to the row's id and project: ``token_sealed``) and never shown
again; the CLI deletes the row when its import has what it needs, and the imports worker
deletes any row older than 24 hours (``expires_at``) whatever happened to the CLI.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-29
"""

from control_plane.migrate import run_sql

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql("""
CREATE TABLE import_credentials (
    id                 text PRIMARY KEY,
    project_id         text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    provider           text NOT NULL CHECK (provider IN ('descope')),
    source_project_id  text NOT NULL,
    token_sealed       bytea NOT NULL,
    created_by_key_id  text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    expires_at         timestamptz NOT NULL
);
CREATE INDEX import_credentials_project ON import_credentials (project_id, id);
CREATE INDEX import_credentials_expires ON import_credentials (expires_at);
    """)


def downgrade() -> None:
    run_sql("DROP TABLE import_credentials;")
