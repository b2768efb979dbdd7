"""The engine's in-memory copy of the revocation set (``common.revocations.RevocationMirror``)."""

from __future__ import annotations

from common.revocations import RevocationMirror


def test_add_merge_and_prune() -> None:
    mirror = RevocationMirror()
    assert not mirror.is_revoked("sess_a")
    mirror.add("sess_a", 100.0)
    mirror.add("sess_a", 50.0)  # an earlier score never shortens the entry
    mirror.merge([("sess_b", 200.0), ("sess_c", 10.0)])
    assert mirror.is_revoked("sess_a") and mirror.is_revoked("sess_b")
    mirror.merge([])  # a set Redis lost forgets nothing: revocations are never undone
    assert len(mirror) == 3
    assert mirror.prune(now=150.0) == 2  # sess_a (100) and sess_c (10) are past their scores
    assert not mirror.is_revoked("sess_a") and not mirror.is_revoked("sess_c")
    assert mirror.is_revoked("sess_b")
