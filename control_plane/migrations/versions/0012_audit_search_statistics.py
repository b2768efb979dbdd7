"""Trigram frequencies of the audit log's search text (issue 20: ``q`` at 10M events).

A ``q`` search is answered through the trigram index ``audit_events_search`` (migration 0002).
Given the whole pattern, that index looks up every trigram of it, and an e-mail's common ones
("gma", "com") cost thousands of index pages; given only the rare ones it answers in
milliseconds. Which ones are rare is read from these statistics: the expression statistics of
the search text's trigram array (``show_trgm`` of the index's expression, to the character),
whose ``most_common_elems`` and ``most_common_elem_freqs`` (``pg_stats_ext_exprs``) ANALYZE of
the partitioned table fills from a sample of every partition (autovacuum never analyzes a
partitioned table: the audit workers do, ``control_plane.audit.tasks``).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28
"""

from control_plane.migrate import run_sql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql("""
CREATE STATISTICS audit_events_search_trigrams ON (show_trgm(
    lower(action || E'\\x1f' || coalesce(actor_id, '') || E'\\x1f' || coalesce(target_id, '')
          || E'\\x1f' || coalesce(metadata ->> 'description', ''))
)) FROM audit_events;
    """)


def downgrade() -> None:
    run_sql("DROP STATISTICS audit_events_search_trigrams;")
