"""Authorization data: stores (per-project containers of tuples) and their tuples, written with
a revision the engine follows (``common.changes``)."""
