"""What a check answers: :class:`CheckResult`, or :class:`ResolutionTooComplex` when the depth cap
cut the walk short (a limit hit is never a silent deny).

Also the cheap constructors the steps use on the hot path (:func:`new_result`, :func:`denied`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = ["DENIED_ONE", "CheckResult", "Resolution", "ResolutionTooComplex", "denied", "new_result"]

Resolution = Literal["direct", "userset", "none"]


@dataclass(frozen=True, slots=True)
class CheckResult:
    """Outcome of :func:`engine.graph.check`.

    * ``allowed``: the verdict.
    * ``resolution``: ``"direct"`` when the tuple ``(O, R, X)`` itself matched (or ``X`` is
      ``"O#R"``), ``"userset"`` when proven through one or more userset hops, ``"none"`` when
      denied.
    * ``resolution_path``: the tuples proving the answer, from the checked object down, each
      spelled ``"object#relation@user"``; empty when denied and for the ``X == "O#R"`` rule.
      A step splits at its first ``'#'`` and then the next ``'@'`` (see :mod:`common.tuples`).
    * ``dispatch_count``: number of ``object#relation`` nodes this call visited (work done;
      a denial answered from the memoised walk, and an answer from the answer cache, count 1).
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


def new_result(
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

DENIED_ONE: Final = _DENIALS[1]
"""The denial after visiting one node (the commonest answer)."""


def denied(dispatch_count: int) -> CheckResult:
    """The (shared, immutable) denial with this ``dispatch_count``."""
    if dispatch_count < 1024:
        return _DENIALS[dispatch_count]
    return new_result(False, "none", (), dispatch_count, 0)
