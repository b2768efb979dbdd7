"""The resolution path of an allowed check: the tuples from the checked node, through the node
where the two sides of the search met, down to a node holding the user.

No I/O, standard library only.
"""

from __future__ import annotations

from engine.graph.index import Nodes, StoreGraph
from engine.graph.result import CheckResult, new_result

__all__ = ["userset_proof"]


def userset_proof(
    graph: StoreGraph, fwd: list[set[str]], back: list[Nodes], user: str, visited: int
) -> CheckResult:
    """Allowed result for a path from ``fwd[0]`` through ``fwd[-1] & back[-1]`` to a holder.

    Where several nodes qualify, the smallest (string order) is taken, so the reported path
    does not depend on set iteration order.
    """
    meet = fwd[-1].intersection(back[-1])
    middle = min(meet) if len(meet) > 1 else next(iter(meet))
    path: list[str] = []
    node = middle
    for above in reversed(fwd[1:-1]):  # climb to the checked node
        ups = above.intersection(graph.holders(node))  # node's parents on that level
        up = min(ups) if len(ups) > 1 else next(iter(ups))
        path.append(up + "@" + node)
        node = up
    if len(fwd) > 1:
        (top,) = fwd[0]
        path.append(top + "@" + node)
    path.reverse()
    node = middle
    for below in reversed(back[:-1]):  # descend to a node holding `user`
        downs = [k for k in graph.usersets(node) if k in below]
        down = min(downs) if len(downs) > 1 else downs[0]
        path.append(node + "@" + down)
        node = down
    path.append(node + "@" + user)
    return new_result(True, "userset", tuple(path), visited, len(path))
