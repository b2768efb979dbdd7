"""The check: a bidirectional, level-by-level breadth-first search between the checked node and
the nodes holding the user, with a per-node memo of finished forward walks.

Forward from the checked node along userset edges, backward from the nodes that hold the user
directly (a userset user ``"U#S"`` is a node key, so the reverse index of users doubles as the
reverse edges), level by level with C set operations and no Python recursion. When it shows
there is no path at all before the forward walk is finished, the forward walk is still needed
to tell a deny from a cut (raise); that walk depends on the node alone, so for big walks its
node set and depth are memoised per node (in :class:`~engine.graph.index.StoreGraph`) until a
userset tuple changes, which also answers later denials from that node with one set operation.

Answers that needed a walk are cached per user and node (``StoreGraph._answers``) and returned
as they were computed (with ``dispatch_count`` 1) until a tuple of that user, or any userset
tuple, is added or removed: an answer is a function of the userset edges and of the nodes
holding the user directly, and nothing else (this is the check cache SpiceDB and OpenFGA keep,
made exact by invalidation instead of a time-to-live).

The exact rule is in :mod:`engine.graph`. No I/O, standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import chain, filterfalse, repeat
from typing import Any, Final

from engine.graph.index import EMPTY, Kids, Nodes, StoreGraph, is_one
from engine.graph.proof import userset_proof
from engine.graph.result import DENIED_ONE, CheckResult, ResolutionTooComplex, denied, new_result

__all__ = ["DEFAULT_MAX_DEPTH", "check"]

DEFAULT_MAX_DEPTH: Final = 25
"""Default cap on the number of ``object#relation`` nodes on a proof path (top node = 1)."""

_BACK_BUDGET: Final = 256
"""The backward side of the search stops growing at about this many nodes."""

_MEMO_MIN_NODES: Final = 8
"""Forward walks reaching fewer nodes than this are cheap to redo and are not memoised."""

_NO_KIDS: Final = repeat(EMPTY)  # default stream for map(dict.get, keys, _NO_KIDS)
_chain = chain.from_iterable


def check(
    graph: StoreGraph,
    object: str,
    relation: str,
    user: str,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> CheckResult:
    """Decide whether ``user`` has ``relation`` on ``object`` in ``graph``.

    Callers name the arguments (``check(g, object=..., relation=..., user=...)``); loops over
    many checks may pass them by position, which saves the keyword matching per call.

    Rule: SPEC.md section 4, endpoint rule 4 (direct tuples and userset references,
    recursively, with a depth cap and a visited-set cycle guard), plus "``O#R`` always has
    ``R`` on ``O``"; the exact definition is in :mod:`engine.graph`. The proof reported is a
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
    # The answer cache first: a hit is two dict probes, where the direct test below reads every
    # node string the user holds (a cache miss each: 1.9 -> 1.0 us per warm check on the
    # medium dataset). Exact in this order too: a tuple added or removed for `user` (a direct
    # match among them) drops its answers, and a userset tuple drops them all.
    known = graph._answers.get(user)
    if known is not None and max_depth == graph._answers_cap:
        hit = known.get(key)
        if hit is not None:
            return hit
    holders: Any = graph._nodes_by_user.get(user)  # the nodes holding `user` directly
    if holders is not None:
        if type(holders) is str:  # held by one node: the entry is that node (StoreGraph)
            if holders == key:
                return new_result(True, "direct", (key + "@" + user,), 1, 1)
            holders = (holders,)
        elif key in holders:
            return new_result(True, "direct", (key + "@" + user,), 1, 1)
    if user == key:
        return new_result(True, "direct", (), 1, 1)
    kids = graph._usersets.get(key)
    if kids is None:
        return DENIED_ONE
    memo = graph._memo.get(key)
    if memo is not None and (holders is None or memo[0].isdisjoint(holders)):
        # Nothing below `key` holds `user`: no proof at any depth.
        if memo[1] > max_depth:
            raise ResolutionTooComplex(max_depth)
        return DENIED_ONE
    result = _walk(graph, key, kids, user, holders, max_depth)
    graph._remember_answer(user, key, max_depth, result if result.dispatch_count == 1 else (
        new_result(True, result.resolution, result.resolution_path, 1, result.depth)
        if result.allowed else DENIED_ONE))
    return result


def _walk(
    graph: StoreGraph, key: str, kids: str | Kids, user: str, holders: Nodes | None,
    max_depth: int
) -> CheckResult:
    """The answer for a node with userset children (its ``_usersets`` entry: the one child, or
    a container) that neither a direct tuple, the memo nor the answer cache gave."""
    ahead = {kids} if type(kids) is str else set(kids)  # depth 2
    ahead.discard(key)
    if holders is None or max_depth == 1:  # no proof can exist within the cap
        return _finish(graph, key, {key}, ahead, 1, max_depth, 1)
    if not ahead.isdisjoint(holders):
        hop = min(ahead.intersection(holders))
        return new_result(True, "userset", (key + "@" + hop, hop + "@" + user), 1 + len(ahead), 2)
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
    ahead = _below(usersets_get, ahead, fwd_seen)
    if max_depth > 2 and not ahead.isdisjoint(holders):  # depth 3: common, answer it early
        fwd.append(ahead)
        return userset_proof(graph, fwd, [holders], user, len(fwd_seen) + len(ahead))
    back: list[Nodes] = [holders]
    back_seen: set[str] | None = None  # built on the first backward step
    back_room = _BACK_BUDGET - len(holders)
    hops_left = max_depth - 2
    while True:
        if not ahead:  # the forward walk ended inside the cap without a proof
            if len(fwd_seen) >= _MEMO_MIN_NODES:  # (only the depth-2 level can be empty)
                graph._remember_walk(key, fwd_seen, len(fwd) if fwd[-1] else len(fwd) - 1)
            return denied(len(fwd_seen) + len(back_seen or holders))
        if hops_left <= 0:  # no proof within the cap; the forward walk decides raise or deny
            return _finish(graph, key, fwd_seen, ahead, len(fwd), max_depth,
                           len(fwd_seen) + len(back_seen or holders))
        hops_left -= 1
        if back_room > 0 and len(back[-1]) < len(ahead):
            found: list[Any] = list(map(parents_get, back[-1], _NO_KIDS))
            parents: list[Nodes] = list(filterfalse(is_one, found))
            sole: list[str] = list(filter(is_one, found))  # the parent of a node that has one
            back_room -= sum(map(len, parents)) + len(sole)
            if back_room >= 0:
                if back_seen is None:
                    back_seen = set(holders)
                level = set(chain(_chain(parents), sole))
                level -= back_seen
                if not level:  # no path at all; the forward walk decides raise or deny
                    return _finish(graph, key, fwd_seen, ahead, len(fwd), max_depth,
                                   len(fwd_seen) + len(back_seen))
                back_seen |= level
                back.append(level)
                if not level.isdisjoint(fwd_seen):  # met: find the nearest forward level
                    i = 0
                    while level.isdisjoint(fwd[i]):
                        i += 1
                    return userset_proof(graph, fwd[: i + 1], back, user,
                                  len(fwd_seen) + len(back_seen))
                continue
        level = ahead
        if not level.isdisjoint(holders if back_seen is None else back_seen):
            j = 0
            while level.isdisjoint(back[j]):
                j += 1
            fwd.append(level)
            return userset_proof(graph, fwd, back[: j + 1], user,
                          len(fwd_seen) + len(level) + len(back_seen or holders))
        fwd_seen |= level
        fwd.append(level)
        ahead = _below(usersets_get, level, fwd_seen)


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
            ahead = _below(usersets_get, ahead, seen)
        if len(seen) >= _MEMO_MIN_NODES:
            graph._remember_walk(key, seen, depth)
        visited += len(seen) - walked
    elif memo[1] > max_depth:
        raise ResolutionTooComplex(max_depth)
    return denied(visited)


def _below(
    usersets_get: Callable[[str, Kids], str | Kids], level: Iterable[str], seen: set[str]
) -> set[str]:
    """The next level of a forward walk: the userset children of the nodes of ``level`` not in
    ``seen``, as a new set. Entries are bare strings or containers (:class:`StoreGraph`); one
    lookup per node and C-level passes over them, no Python per node."""
    found: list[Any] = list(map(usersets_get, level, _NO_KIDS))
    out: set[str] = set(chain(_chain(filterfalse(is_one, found)), filter(is_one, found)))
    out -= seen
    return out
