"""Tuple writes remembered by key: the outcome of each write, so that a write whose answer was
lost can be answered with the truth.

``tuple_writes`` holds one row per effective tuple write, and per write sent with an
``Idempotency-Key`` even when it changed nothing, under the client's key or, without one, a key
the server made up for the request. It is written in the write's own transaction, so it exists
exactly when the write committed:

* the server reads it back when the connection is lost while ``COMMIT`` is in flight (did the
  write take effect?), and
* a client that retries with the same ``Idempotency-Key`` gets the first outcome again
  (``request_hash``, the SHA-256 of the write's tuples, refuses a key reused for another write).

Rows older than a day are purged (``control_plane.authz.tasks``): a key is honoured for 24 hours
at least, as Stripe does.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from control_plane.migrate import run_sql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql("""
CREATE TABLE tuple_writes (
    store_id      text NOT NULL REFERENCES stores (id) ON DELETE CASCADE,
    write_key     text NOT NULL,
    request_hash  bytea NOT NULL,
    revision      bigint NOT NULL,
    written       integer NOT NULL,
    deleted       integer NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (store_id, write_key)
);
CREATE INDEX tuple_writes_created ON tuple_writes (created_at);
    """)


def downgrade() -> None:
    run_sql("DROP TABLE tuple_writes;")
