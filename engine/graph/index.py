"""The tuple index of one store: :class:`StoreGraph` (storage, add, remove, load, walk memo).

No I/O, standard library only. Not thread-safe: mutate and query it from one thread (the
engine's event loop).
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Final

from engine.graph.result import CheckResult

__all__ = ["EMPTY", "Kids", "Nodes", "StoreGraph", "gc_paused", "is_one"]

_SMALL: Final = 16
"""Up to this many entries a container is a tuple; above, a set (nodes) or a list (usersets).

16, not 8: a set of 9 to 16 strings takes 728 bytes against 112 to 168 for the tuple (sets keep
a sparse table), which was a sixth of the index on the medium dataset; a miss in a 16-tuple is
16 pointer and length compares (well under a microsecond)."""

_MEMO_MIN_ROOM: Final = 1 << 16
"""Memo room in set slots (~30-40 bytes each): this much, or one per tuple if more."""

_MEMO_ENTRY_COST: Final = 8
"""What one memo entry costs beside its nodes (dict entry, frozenset and tuple headers)."""

_ANSWERS_MIN_ROOM: Final = 1 << 15
"""Answer cache room in entries: this many, or one per 8 tuples if more (~200-400 bytes each)."""

@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a load, and restore its state after (a nested
    pause leaves it to the outer one). Its passes over a growing index would cost about a third
    of a load's time, and the index holds no reference cycles; what a pause keeps back is other
    code's cyclic garbage, collected after. The engine pauses it for a whole snapshot (every
    chunk of a COPY), not just per chunk: between chunks it would walk every container loaded so
    far, several times over a big load."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


EMPTY: Final[tuple[str, ...]] = ()
"""The empty container (a node nobody holds, a node without usersets)."""

Nodes = tuple[str, ...] | set[str]
Kids = tuple[str, ...] | list[str]

is_one: Final = partial(type.__instancecheck__, str)
"""``is_one(entry)``: whether an index entry is one bare string rather than a container (what
``isinstance(entry, str)`` says, as a C callable that ``filter`` and ``filterfalse`` run with no
Python frame per entry)."""


class StoreGraph:
    """Tuples of one store, indexed for :func:`engine.graph.check`.

    Layout (memory is the budget; every node key is stored once):

    * ``_nodes_by_user``: user (plain ``"type:id"`` or userset ``"type:id#rel"``) -> the
      nodes ``"object#relation"`` that hold it directly: the node key itself when there is
      one, a tuple of 2 to ``_SMALL`` node keys, a set above. One entry per tuple in total.
    * ``_usersets``: node -> its userset users (``"U#S"``, which are child node keys): the
      one child itself, a tuple of 2 to ``_SMALL``, a list above; absent when the node has
      none. One entry per userset tuple.

      A single entry is stored bare, not in a 1-tuple: on the dataset of ``bench/dataset.py``
      two users in five and half the nodes with usersets have exactly one, and the 1-tuples
      were 10.5 of 106 bytes per tuple. Readers tell the two kinds apart with :data:`is_one`
      (a bare string iterates by character); the walk's level steps split a level's entries
      with ``filter``/``filterfalse`` on it, so no step runs Python per node, and
      :meth:`holders` and :meth:`usersets` give the container form for everything else.
    * Node keys and userset users are interned with :func:`sys.intern`, so a node key
      repeated across tuples, and a userset user and the node it names, share one string
      object. The interpreter's table does not keep a string alive (interned strings are
      mortal in CPython), so a string goes when its last tuple goes with no bookkeeping
      here; plain users are not interned (``_nodes_by_user`` is the only place keeping them).
    * ``_memo``: node -> (every node its full forward walk reaches, depth of the deepest
      one), for walks that ended without a proof (:mod:`engine.graph.search` decides which).
      It answers later denials from that node with one ``isdisjoint``. Emptied whenever a
      userset tuple is added or removed (plain-user tuples cannot change a walk), and when
      it outgrows ``max(_MEMO_MIN_ROOM, len(self))`` set slots, so it costs at most about
      as much again as a ``_nodes_by_user`` entry per tuple.
    * ``_answers``: user -> node -> result for checks that needed a walk (the answer cache;
      see :func:`engine.graph.check`), all under the cap ``_answers_cap`` (a check with
      another cap empties it first: the engine uses one). An answer depends only on the userset
      edges and on the nodes holding that user directly, so adding or removing a tuple
      drops the cached answers of its user, and a userset tuple (which changes edges) drops
      them all, with the memo. Emptied when it outgrows ``max(_ANSWERS_MIN_ROOM, len(self)
      // 8)`` entries.

    A userset string ``"U#S"`` is both a user and the node key of ``(U, S)``, so
    ``_nodes_by_user["U#S"]`` lists the parents of node ``U#S``: the reverse edges come free.

    Not thread-safe; see the module docstring.
    """

    __slots__ = ("_answers", "_answers_cap", "_answers_room", "_count", "_memo", "_memo_room", "_nodes_by_user",
                 "_usersets")

    def __init__(self) -> None:
        """Create an empty graph."""
        self._nodes_by_user: dict[str, str | Nodes] = {}
        self._usersets: dict[str, str | Kids] = {}
        self._memo: dict[str, tuple[frozenset[str], int]] = {}
        self._memo_room = _MEMO_MIN_ROOM
        self._answers: dict[str, dict[str, CheckResult]] = {}
        self._answers_cap = 0
        self._answers_room = _ANSWERS_MIN_ROOM
        self._count = 0

    def __len__(self) -> int:
        """Number of distinct tuples held."""
        return self._count

    def __repr__(self) -> str:
        return f"<StoreGraph tuples={self._count} users={len(self._nodes_by_user)}>"

    def __contains__(self, item: object) -> bool:
        """``(object, relation, user) in graph``: whether that exact tuple is held."""
        if not isinstance(item, tuple) or len(item) != 3:
            return False
        obj, rel, user = item
        if not (isinstance(obj, str) and isinstance(rel, str) and isinstance(user, str)):
            return False
        return obj + "#" + rel in self.holders(user)

    def holders(self, user: str) -> Nodes:
        """The nodes ``"object#relation"`` holding ``user`` directly, as a container (``EMPTY``
        if none): for a userset user ``"U#S"``, the parents of node ``U#S``."""
        nodes = self._nodes_by_user.get(user, EMPTY)
        return (nodes,) if isinstance(nodes, str) else nodes

    def usersets(self, node: str) -> Kids:
        """The userset users ``"U#S"`` of ``node`` (its children in the walk), as a container
        (``EMPTY`` if none)."""
        kids = self._usersets.get(node, EMPTY)
        return (kids,) if isinstance(kids, str) else kids

    def add(self, object: str, relation: str, user: str) -> bool:
        """Add the tuple ``(object, relation, user)``; return True if it was absent.

        Inputs are trusted to be valid (see :mod:`common.tuples`); nothing is raised.
        """
        return self._insert(((object + "#" + relation, user),)) == 1

    def load(self, rows: Iterable[tuple[str, str, str]]) -> None:
        """Add many ``(object, relation, user)`` rows; duplicates (and present tuples) are skipped.

        Same effect as calling :meth:`add` for each row (the same insertion code runs); meant
        for loading a store's tuples at start-up. The cyclic garbage collector is paused
        meanwhile (:func:`gc_paused`). Rows added before an exception in ``rows`` stay added.
        """
        self.load_nodes((o + "#" + r, u) for o, r, u in rows)

    def load_nodes(self, pairs: Iterable[tuple[str, str]], *, distinct: bool = False) -> None:
        """:meth:`load` for ``(node, user)`` pairs, ``node`` being ``"object#relation"``
        already (the engine's snapshot query joins the two in PostgreSQL: one Python string
        operation less per row).

        ``distinct=True`` is the caller's promise that no pair repeats and none is held yet (a
        snapshot of the ``tuples`` table into a new graph: its primary key is the tuple, and its
        constraints keep ``#`` out of objects and relations, so ``object#relation`` joins no two
        rows into one pair): the scan of a user's nodes for the pair is skipped, a tenth of a big
        load's time. The promise must hold: a repeated userset pair would be stored twice, and
        removing the tuple would then leave one of its edges behind."""
        with gc_paused():
            self._insert(pairs, distinct)

    def _insert(self, pairs: Iterable[tuple[str, str]], distinct: bool = False) -> int:
        """Add ``(node, user)`` pairs; return how many were absent (see :meth:`load_nodes` for
        ``distinct``). The one insertion routine, for :meth:`add` (one row) and the loads alike:
        a loop over local names, so a big load pays no call per row."""
        intern = sys.intern
        by_user = self._nodes_by_user
        by_user_get = by_user.get
        usersets = self._usersets
        usersets_get = usersets.get
        memo = self._memo
        answers = self._answers
        small = _SMALL
        added = 0
        try:
            for key, user in pairs:
                key = intern(key)
                is_userset = "#" in user
                if is_userset:
                    user = intern(user)
                cur = by_user_get(user)
                if cur is None:
                    by_user[user] = key
                elif type(cur) is str:
                    if cur == key:
                        continue
                    by_user[user] = (cur, key)
                elif not distinct and key in cur:
                    continue
                elif type(cur) is tuple:
                    by_user[user] = (*cur, key) if len(cur) < small else {*cur, key}
                else:
                    cur.add(key)  # type: ignore[union-attr]
                if is_userset:
                    if memo or answers:  # a new userset edge can change any walk
                        self._edges_changed()
                    kids = usersets_get(key)
                    if kids is None:
                        usersets[key] = user
                    elif type(kids) is str:
                        usersets[key] = (kids, user)
                    elif type(kids) is tuple:
                        usersets[key] = (*kids, user) if len(kids) < small else [*kids, user]
                    else:
                        kids.append(user)  # type: ignore[union-attr]
                elif answers:  # a new holder of `user`: its answers may change
                    answers.pop(user, None)
                added += 1
        finally:
            self._count += added
        return added

    def remove(self, object: str, relation: str, user: str) -> bool:
        """Remove the tuple ``(object, relation, user)``; return True if it was present."""
        key = object + "#" + relation
        by_user = self._nodes_by_user
        cur = by_user.get(user)
        if cur is None:
            return False
        if type(cur) is str:
            if cur != key:
                return False
            del by_user[user]
        elif key not in cur:
            return False
        else:
            # (assigning to a present key keeps the dict's own key object, the interned one)
            by_user[user] = _without(cur, key)  # type: ignore[arg-type, assignment]
        if "#" in user:
            if self._memo or self._answers:
                self._edges_changed()
            usersets = self._usersets
            kids = usersets[key]
            if type(kids) is str:
                del usersets[key]
            else:
                usersets[key] = _without(kids, user)  # type: ignore[arg-type, assignment]
        elif self._answers:
            self._answers.pop(user, None)
        self._count -= 1
        return True

    def _edges_changed(self) -> None:
        """A userset tuple was added or removed: any walk and any answer may differ now."""
        self._forget_walks()
        self._forget_answers()

    def _forget_answers(self) -> None:
        """Drop the answer cache (edges changed, or it is full)."""
        self._answers.clear()
        self._answers_room = max(_ANSWERS_MIN_ROOM, self._count >> 3)

    def _remember_answer(self, user: str, key: str, max_depth: int, result: CheckResult) -> None:
        """Cache the answer of a check that needed a walk (see ``_answers``)."""
        self._answers_room -= 1
        if self._answers_room < 0 or max_depth != self._answers_cap:
            self._forget_answers()
            self._answers_cap = max_depth
            self._answers_room -= 1
        known = self._answers.get(user)
        if known is None:
            self._answers[user] = {key: result}
        else:
            known[key] = result

    def _forget_walks(self) -> None:
        """Drop the memo (a userset tuple changed, or the memo is full)."""
        self._memo.clear()
        self._memo_room = max(_MEMO_MIN_ROOM, self._count)

    def _remember_walk(self, key: str, seen: set[str], deepest: int) -> None:
        """Memoise a finished forward walk from ``key`` that found no proof."""
        cost = len(seen) + _MEMO_ENTRY_COST
        self._memo_room -= cost
        if self._memo_room < 0:
            self._forget_walks()
            self._memo_room -= cost
        self._memo[sys.intern(key)] = (frozenset(seen), deepest)


def _without(entries: Nodes | Kids, gone: str) -> str | Nodes | Kids:
    """A container of two or more entries less ``gone`` (present), in the form its size takes:
    the other entry bare from two, a tuple up to ``_SMALL``, else the set or list shrunk in
    place (back to a tuple at half that, so a size at the threshold does not flip the form on
    every add and remove)."""
    if type(entries) is tuple:
        if len(entries) == 2:
            return entries[0] if entries[1] == gone else entries[1]
        return tuple([k for k in entries if k != gone])
    entries.remove(gone)  # type: ignore[union-attr]
    return tuple(entries) if len(entries) <= _SMALL // 2 else entries
