"""In-memory tuple index of one store and the permission check over it.

Semantics (untyped direct + userset evaluation, no authorization model; cross-checked against
an independent naive evaluator, ``tests/engine/reference.py``, and OpenFGA's conformance cases
in ``tests/data/conformance/openfga``). ``check(O, R, X)`` is allowed when

* the store holds the tuple ``(O, R, X)`` exactly (``X`` may itself be a userset string
  such as ``"group:x#member"``), or
* the store holds ``(O, R, "U#S")`` and ``check(U, S, X)`` holds, recursively, or
* ``X == "O#R"``: a userset always has its own relation on its own object (the issue adds
  this rule; OpenFGA's conformance cases leave such checks out).

A node is the string ``"object#relation"``; a userset user ``"U#S"`` is spelled exactly like
the node key of ``(U, S)``, so the walk never parses strings. Depth counts nodes on a proof
path, the checked node being depth 1. The answer is defined by a breadth-first walk from the
checked node with a visited set (cycles end in a denial) and a cap of ``max_depth`` nodes:

* allowed when a proof of at most ``max_depth`` nodes exists (the shortest one is reported);
* otherwise :class:`ResolutionTooComplex` when the cap cut the walk short, i.e. a node at
  depth ``max_depth`` has userset children that were not visited (never a silent deny);
* otherwise denied.

One module per part:

* :mod:`engine.graph.index`: :class:`StoreGraph`, the tuples of one store (add, remove, load,
  the storage of the walk memo and of the answer cache);
* :mod:`engine.graph.search`: :func:`check`, the bidirectional level search that computes the
  answer above with less work, the memo of finished walks and the per-user answer cache;
* :mod:`engine.graph.proof`: the resolution path of an allowed answer;
* :mod:`engine.graph.result`: :class:`CheckResult` and :class:`ResolutionTooComplex`.

The package does no I/O and imports only the standard library. A :class:`StoreGraph` is not
thread-safe: mutate and query it from one thread (the engine's event loop).
"""

from engine.graph.index import StoreGraph, gc_paused
from engine.graph.result import CheckResult, Resolution, ResolutionTooComplex
from engine.graph.search import DEFAULT_MAX_DEPTH, check

__all__ = ["DEFAULT_MAX_DEPTH", "CheckResult", "Resolution", "ResolutionTooComplex", "StoreGraph",
           "check", "gc_paused"]
