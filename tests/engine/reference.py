"""A naive evaluator of the check semantics, written apart from ``engine/graph`` so that tests can
compare the engine's answers with it.

``check(tuples, object, relation, user)`` is allowed when

* the store holds the tuple ``(object, relation, user)`` itself (``user`` may be a userset such as
  ``group:eng#member``), or
* the store holds ``(object, relation, "U#R")`` and ``check(U, R, user)`` is allowed.

There is no authorization model: no computed relations, tuple-to-userset, intersection,
exclusion, wildcards or conditions.

A proof is a chain of ``(object, relation)`` nodes, the checked one first, each next node named by
a userset tuple of the one before, the last holding ``user`` directly. A chain never enters a node
twice (a cycle proves nothing) and holds at most ``max_depth`` nodes (the checked node counts as
1). The engine also allows ``o#r`` on ``o#r`` with no tuple at all; that rule is not modelled
here, and callers skip such checks.

Tuples are mappings with ``object``, ``relation`` and ``user``, as in the conformance cases
(``tests/data/conformance/openfga``). Every call indexes the tuples afresh: clarity over speed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

MAX_DEPTH = 25

Node = tuple[str, str]


def _holders(tuples: Iterable[Mapping[str, str]]) -> dict[Node, set[str]]:
    """Each ``(object, relation)`` node and the users its tuples name."""
    held: dict[Node, set[str]] = {}
    for t in tuples:
        held.setdefault((t["object"], t["relation"]), set()).add(t["user"])
    return held


def _next_nodes(users: Iterable[str]) -> list[Node]:
    """The nodes named by the usersets among ``users`` ("group:eng#member" -> that node): an
    object ends at its first '#' (types and ids never hold one)."""
    nodes = []
    for user in users:
        obj, sep, relation = user.partition("#")
        if sep:
            nodes.append((obj, relation))
    return nodes


def check(tuples: Iterable[Mapping[str, str]], obj: str, relation: str, user: str,
          max_depth: int = MAX_DEPTH) -> bool:
    """Whether some chain of at most ``max_depth`` nodes proves ``user`` on ``obj#relation``:
    a depth-first walk over every chain without a repeated node."""
    held = _holders(tuples)

    def proves(chain: tuple[Node, ...]) -> bool:
        users = held.get(chain[-1], set())
        if user in users:
            return True
        if len(chain) >= max_depth:
            return False
        return any(proves((*chain, node)) for node in _next_nodes(users) if node not in chain)

    return proves(((obj, relation),))


def path_length(tuples: Iterable[Mapping[str, str]], obj: str, relation: str,
                user: str) -> int | None:
    """How many nodes the shortest proof holds, whatever its length (``None``: no proof).
    Breadth first: every node of a level is one node further from the checked one."""
    held = _holders(tuples)
    level: list[Node] = [(obj, relation)]
    reached = set(level)
    length = 1
    while level:
        if any(user in held.get(node, set()) for node in level):
            return length
        following = []
        for node in level:
            for after in _next_nodes(held.get(node, set())):
                if after not in reached:
                    reached.add(after)
                    following.append(after)
        level, length = following, length + 1
    return None
