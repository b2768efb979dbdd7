"""The audit log's read side: an index per filter, trigram search, the cursor-signing secret.

Indexes are created on the partitioned ``audit_events``; PostgreSQL creates them on every
partition, and on every partition attached later (the partition manager's ``ATTACH``).

* ``type`` / ``user`` / ``actor``: ``(project_id, <column>, created_at DESC, id DESC)``, so each
  filter alone reads its newest rows in listing order and stops at the page's ``LIMIT``. ``user``
  and ``actor`` are partial (``IS NOT NULL``): an equality filter never matches NULL, and system
  events without a user or actor cost nothing.
* ``q``: a GIN trigram index over the lower-cased concatenation of action, actor_id, target_id
  and metadata description joined by U+001F (a separator a query can never contain, so a match
  never spans two fields). ``control_plane.audit.repository.SEARCH_EXPR`` is the same expression,
  character for character; a test proves the planner picks this index for it.
* ``service_secrets``: per-deployment secrets shared by every process, created on first use
  (``cursor_hmac`` signs pagination cursors, ``control_plane.web.pagination``).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-28
"""

from control_plane.migrate import run_sql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql(r"""
CREATE EXTENSION IF NOT EXISTS pg_trgm;

CREATE INDEX audit_events_project_action
    ON audit_events (project_id, action, created_at DESC, id DESC);
CREATE INDEX audit_events_project_user
    ON audit_events (project_id, user_id, created_at DESC, id DESC) WHERE user_id IS NOT NULL;
CREATE INDEX audit_events_project_actor
    ON audit_events (project_id, actor_id, created_at DESC, id DESC) WHERE actor_id IS NOT NULL;
CREATE INDEX audit_events_search ON audit_events USING gin (
    lower(action || E'\x1f' || coalesce(actor_id, '') || E'\x1f' || coalesce(target_id, '')
          || E'\x1f' || coalesce(metadata ->> 'description', '')) gin_trgm_ops
);

CREATE TABLE service_secrets (
    name        text PRIMARY KEY,
    value       bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
    """)


def downgrade() -> None:
    # pg_trgm stays: other schema objects may have come to depend on it.
    run_sql("""
DROP TABLE service_secrets;
DROP INDEX audit_events_search;
DROP INDEX audit_events_project_actor;
DROP INDEX audit_events_project_user;
DROP INDEX audit_events_project_action;
    """)
