"""In-memory tuple index of one store and the permission check over it.

Semantics (SPEC.md section 4, endpoint rule 4; cross-checked against
``shared/conformance/openfga/reference.py``): untyped direct + userset evaluation, no
authorization model. ``check(O, R, X)`` is allowed when

* the store holds the tuple ``(O, R, X)`` exactly (``X`` may itself be a userset string
  such as ``"group:x#member"``), or
* the store holds ``(O, R, "U#S")`` and ``check(U, S, X)`` holds, recursively, or
* ``X == "O#R"``: a userset always has its own relation on its own object (the issue adds
  this rule; the shared conformance suite leaves such checks out).

A node is the string ``"object#relation"``; a userset user ``"U#S"`` is spelled exactly like
the node key of ``(U, S)``, so the walk never parses strings. Depth counts nodes on a proof
path, the checked node being depth 1. The answer is defined by a breadth-first walk from the
checked node with a visited set (cycles end in a denial) and a cap of ``max_depth`` nodes:

* allowed when a proof of at most ``max_depth`` nodes exists (the shortest one is reported);
* otherwise :class:`ResolutionTooComplex` when the cap cut the walk short, i.e. a node at
  depth ``max_depth`` has userset children that were not visited (never a silent deny);
* otherwise denied.

How it is computed (same answers, less work): a bidirectional breadth-first search, forward
from the checked node along userset edges and backward from the nodes that hold the user
directly (a userset user ``"U#S"`` is a node key, so the reverse index of users doubles as the
reverse edges), level by level with C set operations and no Python recursion. When it shows
there is no path at all before the forward walk is finished, the forward walk is still needed
to tell a deny from a cut (raise); that walk depends on the node alone, so for big walks its
node set and depth are memoised per node until a userset tuple changes, which also answers
later denials from that node with one set operation.

This module does no I/O and imports only the standard library. A :class:`StoreGraph` is not
thread-safe: mutate and query it from one thread (the engine's event loop).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any, Final, Literal

__all__ = ["DEFAULT_MAX_DEPTH", "CheckResult", "ResolutionTooComplex", "StoreGraph", "check"]

DEFAULT_MAX_DEPTH: Final = 25
"""Default cap on the number of ``object#relation`` nodes on a proof path (top node = 1)."""

_SMALL: Final = 8
"""Up to this many entries a container is a tuple; above, a set (nodes) or a list (usersets)."""

_BACK_BUDGET: Final = 256
"""The backward side of the search stops growing at about this many nodes."""

_MEMO_MIN_NODES: Final = 8
"""Forward walks reaching fewer nodes than this are cheap to redo and are not memoised."""

_MEMO_MIN_ROOM: Final = 1 << 16
"""Memo room in set slots (~30-40 bytes each): this much, or one per tuple if more."""

_MEMO_ENTRY_COST: Final = 8
"""What one memo entry costs beside its nodes (dict entry, frozenset and tuple headers)."""

_EMPTY: Final[tuple[str, ...]] = ()
_NO_KIDS: Final = repeat(_EMPTY)  # default stream for map(dict.get, keys, _NO_KIDS)
_chain = chain.from_iterable

Resolution = Literal["direct", "userset", "none"]
Nodes = tuple[str, ...] | set[str]
Kids = tuple[str, ...] | list[str]


@dataclass(frozen=True, slots=True)
class CheckResult:
    """Outcome of :func:`check`.

    * ``allowed``: the verdict.
    * ``resolution``: ``"direct"`` when the tuple ``(O, R, X)`` itself matched (or ``X`` is
      ``"O#R"``), ``"userset"`` when proven through one or more userset hops, ``"none"`` when
      denied.
    * ``resolution_path``: the tuples proving the answer, from the checked object down, each
      spelled ``"object#relation@user"``; empty when denied and for the ``X == "O#R"`` rule.
    * ``dispatch_count``: number of ``object#relation`` nodes this call visited (work done;
      a denial answered from the memoised walk counts 1).
    * ``depth``: number of nodes on the proof path (1 for a direct match, 0 when denied).
    """

    allowed: bool
    resolution: Resolution
    resolution_path: tuple[str, ...]
    dispatch_count: int
    depth: int


class ResolutionTooComplex(Exception):
    """No proof within ``max_depth`` nodes, and the depth cap cut off part of the walk."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        super().__init__(
            f"check needs more than {max_depth} nested object#relation nodes to resolve"
        )


_new = object.__new__
_slots: Any = CheckResult.__dict__  # the slot descriptors (mypy sees the fields' types)
_set_allowed = _slots["allowed"].__set__
_set_resolution = _slots["resolution"].__set__
_set_path = _slots["resolution_path"].__set__
_set_dispatch = _slots["dispatch_count"].__set__
_set_depth = _slots["depth"].__set__


def _result(
    allowed: bool, resolution: Resolution, path: tuple[str, ...], dispatch_count: int, depth: int
) -> CheckResult:
    """``CheckResult(...)`` at half the cost: the frozen dataclass ``__init__`` goes through
    ``object.__setattr__`` per field; the slot descriptors are set directly instead."""
    r: CheckResult = _new(CheckResult)
    _set_allowed(r, allowed)
    _set_resolution(r, resolution)
    _set_path(r, path)
    _set_dispatch(r, dispatch_count)
    _set_depth(r, depth)
    return r


_DENIALS: Final = tuple(CheckResult(False, "none", (), n, 0) for n in range(1024))
_DENIED_ONE: Final = _DENIALS[1]


def _denied(dispatch_count: int) -> CheckResult:
    """The (shared, immutable) denial with this ``dispatch_count``."""
    if dispatch_count < 1024:
        return _DENIALS[dispatch_count]
    return _result(False, "none", (), dispatch_count, 0)


def _unreferenced_refcount() -> int:
    """``sys.getrefcount`` of a string held only by an intern table and one local name."""
    strings: dict[str, str] = {}
    user = "".join(("authio", ":probe"))
    strings[user] = user
    return sys.getrefcount(user)


_UNREFERENCED: Final = _unreferenced_refcount()


class StoreGraph:
    """Tuples of one store, indexed for :func:`check`.

    Layout (memory is the budget; every string is stored once):

    * ``_nodes_by_user``: user (plain ``"type:id"`` or userset ``"type:id#rel"``) -> the
      nodes ``"object#relation"`` that hold it directly; a tuple of up to ``_SMALL`` node
      keys, a set above. One entry per tuple in total.
    * ``_usersets``: node -> its userset users (``"U#S"``, which are child node keys), a
      tuple of up to ``_SMALL``, a list above; absent when the node has none. One entry per
      userset tuple.
    * ``_strings``: intern table, so a user or node key repeated across tuples, and a userset
      user and the node it names, share one string object.
    * ``_memo``: node -> (every node its full forward walk reaches, depth of the deepest
      one), for walks of at least ``_MEMO_MIN_NODES`` nodes that ended without a proof.
      It answers later denials from that node with one ``isdisjoint``. Emptied whenever a
      userset tuple is added or removed (plain-user tuples cannot change a walk), and when
      it outgrows ``max(_MEMO_MIN_ROOM, len(self))`` set slots, so it costs at most about
      as much again as a ``_nodes_by_user`` entry per tuple.

    A userset string ``"U#S"`` is both a user and the node key of ``(U, S)``, so
    ``_nodes_by_user["U#S"]`` lists the parents of node ``U#S``: the reverse edges come free.

    Not thread-safe; see the module docstring.
    """

    __slots__ = ("_count", "_memo", "_memo_room", "_nodes_by_user", "_strings", "_usersets")

    def __init__(self) -> None:
        """Create an empty graph."""
        self._nodes_by_user: dict[str, Nodes] = {}
        self._usersets: dict[str, Kids] = {}
        self._strings: dict[str, str] = {}
        self._memo: dict[str, tuple[frozenset[str], int]] = {}
        self._memo_room = _MEMO_MIN_ROOM
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
        return obj + "#" + rel in self._nodes_by_user.get(user, _EMPTY)

    def add(self, object: str, relation: str, user: str) -> bool:
        """Add the tuple ``(object, relation, user)``; return True if it was absent.

        Inputs are trusted to be valid (see :mod:`common.tuples`); nothing is raised.
        """
        strings = self._strings
        key = object + "#" + relation
        key = strings.setdefault(key, key)
        user = strings.setdefault(user, user)
        by_user = self._nodes_by_user
        cur = by_user.get(user)
        if cur is None:
            by_user[user] = (key,)
        elif key in cur:
            return False
        elif type(cur) is tuple:
            by_user[user] = (*cur, key) if len(cur) < _SMALL else {*cur, key}
        else:
            cur.add(key)  # type: ignore[union-attr]
        if "#" in user:
            self._add_child(key, user)
        self._count += 1
        return True

    def _forget_walks(self) -> None:
        """Drop the memo (a userset tuple changed, or the memo is full)."""
        self._memo.clear()
        self._memo_room = max(_MEMO_MIN_ROOM, self._count)

    def _remember_walk(self, key: str, seen: set[str], deepest: int) -> None:
        """Memoise a finished forward walk from ``key`` (see :func:`_finish`)."""
        cost = len(seen) + _MEMO_ENTRY_COST
        self._memo_room -= cost
        if self._memo_room < 0:
            self._forget_walks()
            self._memo_room -= cost
        self._memo[self._strings.get(key, key)] = (frozenset(seen), deepest)

    def _add_child(self, key: str, child: str) -> None:
        if self._memo:
            self._forget_walks()
        usersets = self._usersets
        kids = usersets.get(key)
        if kids is None:
            usersets[key] = (child,)
        elif type(kids) is tuple:
            usersets[key] = (*kids, child) if len(kids) < _SMALL else [*kids, child]
        else:
            kids.append(child)  # type: ignore[union-attr]

    def remove(self, object: str, relation: str, user: str) -> bool:
        """Remove the tuple ``(object, relation, user)``; return True if it was present."""
        strings = self._strings
        key = strings.get(object + "#" + relation)
        if key is None or key not in self._nodes_by_user.get(user, _EMPTY):
            return False
        user = strings[user]  # the shared copy
        self._unlink(key, user)
        self._count -= 1
        # Forget strings that nothing references any more (CPython reference counts; the
        # baseline is measured at import with this same pattern). A string someone else
        # still holds merely stays in the table.
        if sys.getrefcount(user) == _UNREFERENCED:
            del strings[user]
        if sys.getrefcount(key) == _UNREFERENCED:
            del strings[key]
        return True

    def _unlink(self, key: str, user: str) -> None:
        by_user = self._nodes_by_user
        cur = by_user[user]
        if len(cur) == 1:
            del by_user[user]
        elif type(cur) is tuple:
            by_user[user] = tuple([k for k in cur if k != key])
        else:
            cur.remove(key)  # type: ignore[union-attr]
            if len(cur) <= _SMALL // 2:
                by_user[user] = tuple(cur)
        if "#" in user:
            if self._memo:
                self._forget_walks()
            usersets = self._usersets
            kids = usersets[key]
            if len(kids) == 1:
                del usersets[key]
            elif type(kids) is tuple:
                usersets[key] = tuple([k for k in kids if k != user])
            else:
                kids.remove(user)  # type: ignore[union-attr]
                if len(kids) <= _SMALL // 2:
                    usersets[key] = tuple(kids)

    def load(self, rows: Iterable[tuple[str, str, str]]) -> None:
        """Add many ``(object, relation, user)`` rows; duplicates (and present tuples) are skipped.

        Same effect as calling :meth:`add` for each row, with the per-call overhead removed;
        meant for loading a store's tuples at start-up. The cyclic garbage collector is paused
        meanwhile (its passes over the growing index would cost about a third of the time; the
        index holds no reference cycles) and restored to its previous state afterwards.
        """
        if self._memo:
            self._forget_walks()
        intern = self._strings.setdefault
        by_user = self._nodes_by_user
        by_user_get = by_user.get
        usersets = self._usersets
        usersets_get = usersets.get
        small = _SMALL
        added = 0
        collecting = gc.isenabled()
        gc.disable()
        try:
            for obj, rel, user in rows:
                key = obj + "#" + rel
                key = intern(key, key)
                user = intern(user, user)
                cur = by_user_get(user)
                if cur is None:
                    by_user[user] = (key,)
                elif key in cur:
                    continue
                elif type(cur) is tuple:
                    by_user[user] = (*cur, key) if len(cur) < small else {*cur, key}
                else:
                    cur.add(key)  # type: ignore[union-attr]
                if "#" in user:
                    kids = usersets_get(key)
                    if kids is None:
                        usersets[key] = (user,)
                    elif type(kids) is tuple:
                        usersets[key] = (*kids, user) if len(kids) < small else [*kids, user]
                    else:
                        kids.append(user)  # type: ignore[union-attr]
                added += 1
        finally:
            self._count += added
            if collecting:
                gc.enable()


def check(
    graph: StoreGraph,
    *,
    object: str,
    relation: str,
    user: str,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> CheckResult:
    """Decide whether ``user`` has ``relation`` on ``object`` in ``graph``.

    Rule: SPEC.md section 4, endpoint rule 4 (direct tuples and userset references,
    recursively, with a depth cap and a visited-set cycle guard), plus "``O#R`` always has
    ``R`` on ``O``"; the exact definition is in the module docstring. The proof reported is a
    shortest one.

    ``max_depth`` (>= 1) caps the number of ``object#relation`` nodes on a proof path; the
    checked node is depth 1. Inputs are expected to be validated already
    (:mod:`common.tuples`); malformed strings simply match nothing.

    Raises:
        ResolutionTooComplex: no proof of at most ``max_depth`` nodes, and a node at depth
            ``max_depth`` has userset children the walk could not visit (a limit hit is never
            reported as a deny).
        ValueError: ``max_depth < 1``.
    """
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    key = object + "#" + relation
    holders = graph._nodes_by_user.get(user)  # the nodes holding `user` directly
    if holders is not None and key in holders:
        return _result(True, "direct", (key + "@" + user,), 1, 1)
    if user == key:
        return _result(True, "direct", (), 1, 1)
    kids = graph._usersets.get(key)
    if kids is None:
        return _DENIED_ONE
    memo = graph._memo.get(key)
    if memo is not None and (holders is None or memo[0].isdisjoint(holders)):
        # Nothing below `key` holds `user`: no proof at any depth.
        if memo[1] > max_depth:
            raise ResolutionTooComplex(max_depth)
        return _DENIED_ONE
    ahead = set(kids)  # depth 2
    ahead.discard(key)
    if holders is None or max_depth == 1:  # no proof can exist within the cap
        return _finish(graph, key, {key}, ahead, 1, max_depth, 1)
    if not ahead.isdisjoint(holders):
        hop = min(ahead.intersection(holders))
        return _result(True, "userset", (key + "@" + hop, hop + "@" + user), 1 + len(ahead), 2)
    return _search(graph, key, ahead, user, holders, max_depth)


def _search(
    graph: StoreGraph, key: str, ahead: set[str], user: str, holders: Nodes, max_depth: int
) -> CheckResult:
    """Bidirectional level-synchronous BFS between ``key`` and the ``holders`` of ``user``.

    ``fwd[i]`` holds the nodes first reached ``i`` userset hops below ``key`` and ``ahead``
    the next forward level; ``back[j]`` the nodes ``j`` hops above a holder (``back[0]`` are
    the holders). Every new level is compared with every level of the other side, nearest
    first, so the first meeting gives a shortest path, and ``i + j`` never exceeds
    ``max_depth - 1`` hops. The smaller frontier grows; the backward side stops growing once
    it would pass ``_BACK_BUDGET`` nodes (popular groups have a huge fan-in). Answers stay
    exact: where the backward side cannot decide, the forward walk does.
    """
    usersets_get = graph._usersets.get
    parents_get = graph._nodes_by_user.get  # a node's parents: the nodes holding it as userset
    fwd_seen = {key}
    fwd: list[set[str]] = [{key}]
    fwd_seen |= ahead  # ahead (depth 2) was compared with the holders by check()
    fwd.append(ahead)
    ahead = set(_chain(map(usersets_get, ahead, _NO_KIDS))) - fwd_seen
    if max_depth > 2 and not ahead.isdisjoint(holders):  # depth 3: common, answer it early
        fwd.append(ahead)
        return _proof(graph, fwd, [holders], user, len(fwd_seen) + len(ahead))
    back: list[Nodes] = [holders]
    back_seen: set[str] | None = None  # built on the first backward step
    back_room = _BACK_BUDGET - len(holders)
    hops_left = max_depth - 2
    while True:
        if not ahead:  # the forward walk ended inside the cap without a proof
            if len(fwd_seen) >= _MEMO_MIN_NODES:  # (only the depth-2 level can be empty)
                graph._remember_walk(key, fwd_seen, len(fwd) if fwd[-1] else len(fwd) - 1)
            return _denied(len(fwd_seen) + len(back_seen or holders))
        if hops_left <= 0:  # no proof within the cap; the forward walk decides raise or deny
            return _finish(graph, key, fwd_seen, ahead, len(fwd), max_depth,
                           len(fwd_seen) + len(back_seen or holders))
        hops_left -= 1
        if back_room > 0 and len(back[-1]) < len(ahead):
            parents = list(map(parents_get, back[-1], _NO_KIDS))
            back_room -= sum(map(len, parents))
            if back_room >= 0:
                if back_seen is None:
                    back_seen = set(holders)
                level = set(_chain(parents)) - back_seen
                if not level:  # no path at all; the forward walk decides raise or deny
                    return _finish(graph, key, fwd_seen, ahead, len(fwd), max_depth,
                                   len(fwd_seen) + len(back_seen))
                back_seen |= level
                back.append(level)
                if not level.isdisjoint(fwd_seen):  # met: find the nearest forward level
                    i = 0
                    while level.isdisjoint(fwd[i]):
                        i += 1
                    return _proof(graph, fwd[: i + 1], back, user,
                                  len(fwd_seen) + len(back_seen))
                continue
        level = ahead
        if not level.isdisjoint(holders if back_seen is None else back_seen):
            j = 0
            while level.isdisjoint(back[j]):
                j += 1
            fwd.append(level)
            return _proof(graph, fwd, back[: j + 1], user,
                          len(fwd_seen) + len(level) + len(back_seen or holders))
        fwd_seen |= level
        fwd.append(level)
        ahead = set(_chain(map(usersets_get, level, _NO_KIDS))) - fwd_seen


def _finish(
    graph: StoreGraph,
    key: str,
    seen: set[str],
    ahead: set[str],
    depth: int,
    max_depth: int,
    visited: int,
) -> CheckResult:
    """Deny, or raise if the forward walk from ``key`` is cut by the cap; no proof exists
    within the cap.

    ``seen`` holds the forward levels down to ``depth`` (in nodes), ``ahead`` the next level.
    The walk is finished here (or taken from the memo) to learn how deep it goes.
    """
    memo = graph._memo.get(key)
    if memo is None:
        usersets_get = graph._usersets.get
        walked = len(seen)
        while ahead:
            if depth >= max_depth:
                raise ResolutionTooComplex(max_depth)
            depth += 1
            seen |= ahead
            ahead = set(_chain(map(usersets_get, ahead, _NO_KIDS))) - seen
        if len(seen) >= _MEMO_MIN_NODES:
            graph._remember_walk(key, seen, depth)
        visited += len(seen) - walked
    elif memo[1] > max_depth:
        raise ResolutionTooComplex(max_depth)
    return _denied(visited)


def _proof(
    graph: StoreGraph, fwd: list[set[str]], back: list[Nodes], user: str, visited: int
) -> CheckResult:
    """Allowed result for a path from ``fwd[0]`` through ``fwd[-1] & back[-1]`` to a holder.

    Where several nodes qualify, the smallest (string order) is taken, so the reported path
    does not depend on set iteration order.
    """
    usersets_get = graph._usersets.get
    meet = fwd[-1].intersection(back[-1])
    middle = min(meet) if len(meet) > 1 else next(iter(meet))
    path: list[str] = []
    node = middle
    for above in reversed(fwd[1:-1]):  # climb to the checked node
        ups = [n for n in above if node in usersets_get(n, _EMPTY)]
        up = min(ups) if len(ups) > 1 else ups[0]
        path.append(up + "@" + node)
        node = up
    if len(fwd) > 1:
        (top,) = fwd[0]
        path.append(top + "@" + node)
    path.reverse()
    node = middle
    for below in reversed(back[:-1]):  # descend to a node holding `user`
        downs = [k for k in usersets_get(node, _EMPTY) if k in below]
        down = min(downs) if len(downs) > 1 else downs[0]
        path.append(node + "@" + down)
        node = down
    path.append(node + "@" + user)
    return _result(True, "userset", tuple(path), visited, len(path))
