"""The tuple-change notification: how the control plane tells the engine a store moved on.

Contract (DESIGN.md "Two services, one product"):

* channel: PostgreSQL ``NOTIFY`` channel :data:`CHANNEL`;
* payload: ``"<store_id>:<revision>"`` (:func:`payload`), the store's new revision as a decimal
  integer >= 0; revision 0 announces a store just created;
* sender: the control plane, with ``SELECT pg_notify(CHANNEL, payload(...))`` *inside* the
  transaction that writes the tuples (or creates the store). PostgreSQL delivers a notification
  only when that transaction commits, so a listener never hears of a revision it cannot read yet,
  and a rolled-back write is never announced;
* listener: the engine (:mod:`engine.registry`), which reads the payload with :func:`parse` and
  catches the store up from the ``tuple_changes`` log. A notification is a hint: one may be lost
  (listener reconnecting), so the engine also polls.

Pure functions, no I/O.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CHANNEL", "parse", "payload"]

CHANNEL: Final = "authio_tuple_changes"
"""The PostgreSQL ``NOTIFY`` channel tuple writes and store creations are announced on."""


def payload(store_id: str, revision: int) -> str:
    """The notification text ``"<store_id>:<revision>"`` for ``store_id`` at ``revision``.

    Send it in the writing transaction (``pg_notify`` is delivered at commit). Raises
    ValueError for a negative revision, which :func:`parse` would reject.
    """
    if revision < 0:
        raise ValueError(f"revision must be >= 0, got {revision}")
    return f"{store_id}:{revision}"


def parse(payload: str) -> tuple[str, int] | None:
    """``"<store_id>:<revision>"`` -> ``(store_id, revision)``; None when malformed.

    The revision follows the last ``':'`` and is ASCII decimal digits only (no sign, spaces or
    ``_``, which ``int()`` would accept); an empty store id or revision makes it malformed.
    """
    store_id, sep, rev = payload.rpartition(":")
    if not sep or not store_id or not (rev.isascii() and rev.isdigit()):
        return None
    return store_id, int(rev)
