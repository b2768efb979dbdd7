"""Dashboard operators and their console (issue 23; events ``dashboard_operator.bootstrapped``,
``.added``, ``.removed``).

* ``projects.kind``: ``application`` (every project so far, and every project an API caller
  works in) or ``operators``: the tenant's operator project, at most one per tenant, made the
  first time the tenant gets an operator. Its users are the tenant's operators, who sign in
  there (magic link) like any user of a project; nobody holds an API key of it.
* ``operators`` (``opr_``): an operator of a tenant, which is a user of the tenant's operator
  project (``user_id``; the row goes with the user) with the e-mail address the operator was
  added with, unique in the tenant whatever its case.
* ``device_authorizations.approved_by_operator_id``: a device (``authio login``) approved in the
  console by an operator rather than with an API key (``approved_by_key_id`` stays null then).

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-30
"""

from control_plane.migrate import run_sql

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql("""
ALTER TABLE projects
    ADD COLUMN kind text NOT NULL DEFAULT 'application'
        CHECK (kind IN ('application', 'operators'));
CREATE UNIQUE INDEX projects_one_operator_project ON projects (tenant_id)
    WHERE kind = 'operators';

CREATE TABLE operators (
    id          text PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    project_id  text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    user_id     text NOT NULL UNIQUE REFERENCES users (id) ON DELETE CASCADE,
    email       text NOT NULL,
    name        text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX operators_tenant_email ON operators (tenant_id, lower(email));
CREATE INDEX operators_email ON operators (lower(email));
CREATE INDEX operators_project ON operators (project_id, id);

ALTER TABLE device_authorizations ADD COLUMN approved_by_operator_id text;
    """)


def downgrade() -> None:
    run_sql("""
ALTER TABLE device_authorizations DROP COLUMN approved_by_operator_id;
DROP TABLE operators;
DELETE FROM projects WHERE kind = 'operators';
DROP INDEX projects_one_operator_project;
ALTER TABLE projects DROP COLUMN kind;
    """)
