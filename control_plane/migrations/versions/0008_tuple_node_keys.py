"""No ``#`` in a tuple's object or relation, held by the database too.

The engine reads a store as ``object || '#' || relation`` node keys (``engine.registry``), and
the tuple notation ``object#relation@user`` splits at the first ``#`` (``common.tuples``). Both
are exact only while neither part holds a ``#``: ``('a#b', 'c')`` and ``('a', 'b#c')`` would be
one node. The API's validation has always refused such parts; these constraints make it a rule of
the tables, so that rows written any other way (an operator's SQL, a restore) cannot break it,
and the engine's snapshot load may take a snapshot's rows as distinct pairs
(``StoreGraph.load_nodes(distinct=True)``, issue 12).

Adding them reads each table once (validation); rows written through the API always pass.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from control_plane.migrate import run_sql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql("""
ALTER TABLE tuples
    ADD CONSTRAINT tuples_object_no_hash CHECK (strpos(object, '#') = 0),
    ADD CONSTRAINT tuples_relation_no_hash CHECK (strpos(relation, '#') = 0);
ALTER TABLE tuple_changes
    ADD CONSTRAINT tuple_changes_object_no_hash CHECK (strpos(object, '#') = 0),
    ADD CONSTRAINT tuple_changes_relation_no_hash CHECK (strpos(relation, '#') = 0);
    """)


def downgrade() -> None:
    run_sql("""
ALTER TABLE tuple_changes
    DROP CONSTRAINT tuple_changes_relation_no_hash,
    DROP CONSTRAINT tuple_changes_object_no_hash;
ALTER TABLE tuples
    DROP CONSTRAINT tuples_relation_no_hash,
    DROP CONSTRAINT tuples_object_no_hash;
    """)
