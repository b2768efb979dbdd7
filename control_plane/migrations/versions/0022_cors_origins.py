"""A project's CORS origins (``PATCH /v1/projects/me`` ``cors_origins``; DESIGN.md "the browser
(CORS)"): the origins, besides its WebAuthn ``origins``, whose pages may call the public routes
(``/v1/auth/*``, ``/v1/sessions/*``) with credentials. Exact ``scheme://host[:port]`` values,
validated by ``control_plane.tenancy.schemas``; empty by default (no origin but the WebAuthn ones).

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-29
"""

from control_plane.migrate import run_sql

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql("ALTER TABLE projects ADD COLUMN cors_origins text[] NOT NULL DEFAULT '{}';")


def downgrade() -> None:
    run_sql("ALTER TABLE projects DROP COLUMN cors_origins;")
