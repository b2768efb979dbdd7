"""Unit tests of the check algorithm (the engine/graph/ package) and tuple validation
(common/tuples.py).

Plain synchronous tests: no database, no fixtures. The conformance cases are OpenFGA's, converted
(``tests/data/conformance/openfga``); the random graphs are checked against the naive evaluator
``tests/engine/reference.py``.
"""

from __future__ import annotations

import gc
import json
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

import common.tuples as tuples_module
import engine.graph.search as search_module
from common.tuples import (
    MAX_ID_LENGTH,
    MAX_OBJECT_LENGTH,
    TupleFormatError,
    is_valid_tuple,
    validate_object,
    validate_relation,
    validate_tuple,
    validate_user,
)
from engine.graph import CheckResult, ResolutionTooComplex, StoreGraph, check
from tests.engine import reference
from tests.fixtures.data import CONFORMANCE

Row = tuple[str, str, str]


def _load_cases(name: str) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads((CONFORMANCE / name).read_text())
    return cases


CASES = [*_load_cases("cases.json"), *_load_cases("cases_extended.json")]


def graph_of(rows: Iterable[Row]) -> StoreGraph:
    g = StoreGraph()
    g.load(rows)
    return g


def run(g: StoreGraph, o: str, r: str, u: str, max_depth: int = 25) -> CheckResult:
    return check(g, object=o, relation=r, user=u, max_depth=max_depth)


def oracle(rows: Iterable[Row], o: str, r: str, u: str, max_depth: int = 25) -> int | str:
    """The rule written out plainly: forward BFS by levels with a visited set.

    Returns the depth of the shortest proof (1 = direct), 0 for a deny, or "raise" when no
    proof exists within ``max_depth`` nodes and a node at that depth has unvisited usersets.
    """
    index: dict[str, set[str]] = {}
    for ro, rr, ru in rows:
        index.setdefault(f"{ro}#{rr}", set()).add(ru)
    top = f"{o}#{r}"
    if u in index.get(top, ()) or u == top:
        return 1
    seen, frontier, depth = {top}, [top], 1
    while True:
        nxt = []
        for node in frontier:
            for sub in sorted(index.get(node, ())):
                if "#" in sub and sub not in seen:
                    seen.add(sub)
                    nxt.append(sub)
        if not nxt:
            return 0
        if depth >= max_depth:
            return "raise"
        depth += 1
        if any(u in index.get(node, ()) for node in nxt):
            return depth
        frontier = nxt


def outcome(g: StoreGraph, o: str, r: str, u: str, max_depth: int = 25) -> int | str:
    """Our answer in the oracle's terms, after checking the result is self-consistent."""
    try:
        res = run(g, o, r, u, max_depth)
    except ResolutionTooComplex as exc:
        assert exc.max_depth == max_depth
        return "raise"
    assert_consistent(g, res, o, r, u)
    return res.depth if res.allowed else 0


def split_step(step: str) -> tuple[str, str, str]:
    """``"object#relation@user"`` -> its parts: the object ends at the first '#' (types and ids
    never hold one), the relation at the next '@' (relations never hold one); the user is the
    rest, '@' and '#relation' included (see common/tuples.py)."""
    obj, _, rest = step.partition("#")
    rel, _, user = rest.partition("@")
    return obj, rel, user


def assert_consistent(g: StoreGraph, res: CheckResult, o: str, r: str, u: str) -> None:
    """The result's fields agree with each other and the path is made of stored tuples."""
    assert res.dispatch_count >= 1
    if not res.allowed:
        assert (res.resolution, res.resolution_path, res.depth) == ("none", (), 0)
        return
    top = f"{o}#{r}"
    if res.resolution_path == ():
        assert (res.resolution, res.depth, u) == ("direct", 1, top)
        return
    assert res.resolution == ("direct" if res.depth == 1 else "userset")
    assert len(res.resolution_path) == res.depth
    expect_node = top
    for i, step in enumerate(res.resolution_path):
        obj, rel, user = split_step(step)
        node = f"{obj}#{rel}"
        assert node == expect_node, res
        assert (obj, rel, user) in g, step
        if i + 1 < len(res.resolution_path):
            assert "#" in user
            expect_node = user
        else:
            assert user == u


def assert_index_exact(g: StoreGraph, current: set[Row]) -> None:
    """``g`` holds exactly ``current``, and every node key and userset user it stores is the
    interned object (one object per distinct string)."""
    assert len(g) == len(current)
    assert all(t in g for t in current)
    nodes = Counter(f"{o}#{r}" for o, r, _ in current)
    assert set(g._nodes_by_user) == {u for _, _, u in current}
    held_nodes: Counter[str] = Counter()
    for user, entry in g._nodes_by_user.items():
        held = g.holders(user)
        assert "#" not in user or sys.intern(user) is user
        assert all(sys.intern(k) is k for k in held)
        assert (type(entry) is str) is (len(held) == 1)  # one holder is stored bare
        held_nodes.update(held)
    assert held_nodes == nodes
    kids_expected: dict[str, set[str]] = {}
    for o, r, u in current:
        if "#" in u:
            kids_expected.setdefault(f"{o}#{r}", set()).add(u)
    assert {k: set(g.usersets(k)) for k in g._usersets} == kids_expected
    for key, entry in g._usersets.items():
        kids = g.usersets(key)
        assert sys.intern(key) is key and all(sys.intern(k) is k for k in kids)
        assert (type(entry) is str) is (len(kids) == 1)  # one child is stored bare


# --- the conformance cases (OpenFGA's, converted) ---------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_conformance_case(case: dict[str, Any]) -> None:
    g = graph_of((t["object"], t["relation"], t["user"]) for t in case["tuples"])
    for c in case["checks"]:
        res = run(g, c["object"], c["relation"], c["user"])
        assert res.allowed is c["allowed"], c
        assert_consistent(g, res, c["object"], c["relation"], c["user"])
        # The reference evaluator agrees with OpenFGA's expectations too.
        assert reference.check(case["tuples"], c["object"], c["relation"], c["user"]) is c["allowed"], c


def test_conformance_tuples_pass_validation() -> None:
    for case in CASES:
        for t in [*case["tuples"], *case["checks"]]:
            validate_tuple(t["object"], t["relation"], t["user"])


# --- random graphs against the reference evaluator and the oracle -----------------------------

TYPES = ("doc", "folder", "group")
RELATIONS = ("viewer", "member")


def random_rows(rng: random.Random, nodes: int, users: int, tuples: int,
                userset_share: float = 0.5) -> list[Row]:
    rows: set[Row] = set()
    while len(rows) < tuples:
        obj = f"{rng.choice(TYPES)}:{rng.randrange(nodes)}"
        rel = rng.choice(RELATIONS)
        if rng.random() < userset_share:
            user = f"{rng.choice(TYPES)}:{rng.randrange(nodes)}#{rng.choice(RELATIONS)}"
        else:
            user = f"user:{rng.randrange(users)}"
        rows.add((obj, rel, user))
    return sorted(rows)


def random_query(rng: random.Random, nodes: int, users: int) -> Row:
    obj = f"{rng.choice(TYPES)}:{rng.randrange(nodes)}"
    rel = rng.choice(RELATIONS)
    if rng.random() < 0.2:
        return obj, rel, f"{rng.choice(TYPES)}:{rng.randrange(nodes)}#{rng.choice(RELATIONS)}"
    return obj, rel, f"user:{rng.randrange(users + 2)}"  # a few users hold nothing


@pytest.mark.parametrize("seed", range(40))
def test_matches_reference_on_random_graphs(seed: int) -> None:
    rng = random.Random(seed)
    nodes, users = rng.randint(2, 12), rng.randint(1, 6)
    rows = random_rows(rng, nodes, users, rng.randint(1, 60), rng.uniform(0.2, 0.8))
    dict_rows = [{"object": o, "relation": r, "user": u} for o, r, u in rows]
    g = graph_of(rows)
    for _ in range(60):
        o, r, u = random_query(rng, nodes, users)
        if u == f"{o}#{r}":
            continue  # the self rule is ours, not the reference's
        want = reference.check(dict_rows, o, r, u)
        shortest = reference.path_length(dict_rows, o, r, u)
        if shortest is not None and shortest > reference.MAX_DEPTH:
            continue
        assert run(g, o, r, u).allowed is want, (o, r, u)
        got = outcome(g, o, r, u)
        assert got == (shortest or 0), (o, r, u)


@pytest.mark.parametrize("seed", range(60))
def test_matches_oracle_with_small_caps(seed: int) -> None:
    """Exact outcome (depth of the shortest proof, deny or raise) for caps 1..8."""
    rng = random.Random(1000 + seed)
    nodes, users = rng.randint(2, 20), rng.randint(1, 6)
    rows = random_rows(rng, nodes, users, rng.randint(1, 90), rng.uniform(0.3, 0.9))
    g = graph_of(rows)
    for _ in range(80):
        o, r, u = random_query(rng, nodes, users)
        cap = rng.randint(1, 8)
        assert outcome(g, o, r, u, cap) == oracle(rows, o, r, u, cap), (o, r, u, cap)


@pytest.mark.parametrize("seed", range(4))
def test_matches_oracle_on_bigger_graphs(seed: int) -> None:
    """Large enough for the search's backward budget and the walk memo to matter."""
    rng = random.Random(2000 + seed)
    nodes, users = 400, 60
    rows = random_rows(rng, nodes, users, 3000, 0.45)
    g = graph_of(rows)
    for _ in range(150):
        o, r, u = random_query(rng, nodes, users)
        cap = rng.choice((3, 5, 8, 25))
        assert outcome(g, o, r, u, cap) == oracle(rows, o, r, u, cap), (o, r, u, cap)


@pytest.mark.parametrize("seed", range(12))
def test_matches_oracle_while_tuples_change(seed: int) -> None:
    """Interleaved adds, removes and checks (memo invalidation, remove bookkeeping)."""
    rng = random.Random(3000 + seed)
    nodes, users = rng.randint(3, 25), rng.randint(1, 5)
    current = set(random_rows(rng, nodes, users, rng.randint(5, 80), 0.6))
    g = graph_of(sorted(current))
    for _ in range(300):
        action = rng.random()
        if action < 0.25:
            t = random_rows(rng, nodes, users, 1, 0.6)[0]
            assert g.add(*t) is (t not in current)
            current.add(t)
        elif action < 0.5 and current:
            t = rng.choice(sorted(current))
            assert g.remove(*t) is True
            current.discard(t)
        else:
            o, r, u = random_query(rng, nodes, users)
            cap = rng.choice((2, 4, 25))
            assert outcome(g, o, r, u, cap) == oracle(current, o, r, u, cap), (o, r, u, cap)
        assert_index_exact(g, current)


def same_answer(a: CheckResult | str, b: CheckResult | str) -> bool:
    """Equal verdict, resolution, path and depth (``dispatch_count`` is work, not answer)."""
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return (a.allowed, a.resolution, a.resolution_path, a.depth) == (
        b.allowed, b.resolution, b.resolution_path, b.depth)


def answer(g: StoreGraph, q: Row, cap: int) -> CheckResult | str:
    try:
        return run(g, *q, cap)
    except ResolutionTooComplex:
        return "raise"


@pytest.mark.parametrize("seed", range(30))
def test_cached_answers_match_a_fresh_graph_while_tuples_change(seed: int) -> None:
    """A fixed pool of checks asked again and again (so answers come from the cache) between
    adds and removes of plain and userset tuples: every answer, proof path included, equals
    that of a graph freshly built from the current tuples (empty caches), and the oracle's."""
    rng = random.Random(4000 + seed)
    nodes, users = rng.randint(3, 30), rng.randint(1, 6)
    current = set(random_rows(rng, nodes, users, rng.randint(10, 120), 0.5))
    g = graph_of(sorted(current))
    walks = sorted(g._usersets)  # checks from these nodes need a walk: the cached kind
    pool = []
    for _ in range(25):
        o, r, u = random_query(rng, nodes, users)
        if walks and rng.random() < 0.7:
            o, _, r = rng.choice(walks).partition("#")
        pool.append(((o, r, u), rng.choice((3, 25))))
    hits = 0
    for _ in range(250):
        action = rng.random()
        if action < 0.15:  # mostly plain tuples: a userset tuple empties the whole cache
            t = random_rows(rng, nodes, users, 1, rng.choice((0.0, 0.0, 0.5)))[0]
            g.add(*t)
            current.add(t)
        elif action < 0.3 and current:
            plain = sorted(t for t in current if "#" not in t[2])
            t = rng.choice(plain if plain and rng.random() < 0.8 else sorted(current))
            g.remove(*t)
            current.discard(t)
        else:
            q, cap = rng.choice(pool)
            cached = g._answers.get(q[2], {}).get(f"{q[0]}#{q[1]}")
            hits += cached is not None and g._answers_cap == cap
            got = answer(g, q, cap)
            fresh_graph = graph_of(sorted(current))
            assert same_answer(got, answer(fresh_graph, q, cap)), (q, cap)
            want = oracle(current, *q, cap)
            assert (got if isinstance(got, str) else got.depth if got.allowed else 0) == want
    assert hits  # cached answers were reused between the changes


def test_answer_cache_is_used_and_dropped() -> None:
    g = graph_of([("doc:1", "viewer", "group:a#member"), ("group:a", "member", "group:b#member"),
                  ("group:b", "member", "user:x")])
    first = run(g, "doc:1", "viewer", "user:x")
    assert (first.depth, first.dispatch_count) == (3, 3)
    again = run(g, "doc:1", "viewer", "user:x")  # from the cache: same answer, one node
    assert (again.resolution_path, again.dispatch_count) == (first.resolution_path, 1)
    assert g._answers
    g.add("group:a", "member", "user:x")  # a plain tuple of that user: a shorter proof now
    assert run(g, "doc:1", "viewer", "user:x").resolution_path == (
        "doc:1#viewer@group:a#member", "group:a#member@user:x")
    assert g.remove("group:b", "member", "user:x")
    assert g.remove("group:a", "member", "user:x")  # ... and gone again
    assert run(g, "doc:1", "viewer", "user:x").allowed is False
    assert run(g, "doc:1", "viewer", "user:y").allowed is False
    assert "user:y" in g._answers
    g.add("group:b", "member", "user:x")  # another user's tuple leaves user:y's answers
    assert "user:y" in g._answers
    assert g.remove("doc:1", "viewer", "group:a#member")  # an edge: every answer goes
    assert not g._answers
    assert run(g, "doc:1", "viewer", "user:x").allowed is False


@pytest.mark.parametrize(("memo_min", "budget"), [(1, 0), (1, 3), (2, 10_000)])
def test_matches_oracle_with_other_tuning(monkeypatch: pytest.MonkeyPatch, memo_min: int,
                                          budget: int) -> None:
    """Memoise every walk and starve or feed the backward search: answers must not change."""
    monkeypatch.setattr(search_module, "_MEMO_MIN_NODES", memo_min)
    monkeypatch.setattr(search_module, "_BACK_BUDGET", budget)
    for seed in range(25):
        test_matches_oracle_with_small_caps(seed)
        test_matches_oracle_while_tuples_change(seed)


# --- the rules, one by one ------------------------------------------------------------------


def test_direct_match() -> None:
    g = graph_of([("doc:1", "viewer", "user:a")])
    assert run(g, "doc:1", "viewer", "user:a") == CheckResult(
        True, "direct", ("doc:1#viewer@user:a",), 1, 1)
    assert run(g, "doc:1", "viewer", "user:b") == CheckResult(False, "none", (), 1, 0)
    assert run(g, "doc:1", "editor", "user:a").allowed is False
    assert run(g, "doc:2", "viewer", "user:a").allowed is False


def test_userset_path_and_depth() -> None:
    g = graph_of([("document:1", "viewer", "group:x#member"), ("group:x", "member", "user:a")])
    res = run(g, "document:1", "viewer", "user:a")
    assert (res.allowed, res.resolution, res.depth) == (True, "userset", 2)
    assert res.resolution_path == ("document:1#viewer@group:x#member", "group:x#member@user:a")
    assert res.dispatch_count >= 2


def test_nested_usersets_report_the_shortest_proof() -> None:
    g = graph_of([
        ("doc:1", "viewer", "folder:1#viewer"),
        ("folder:1", "viewer", "group:a#member"),
        ("group:a", "member", "group:b#member"),
        ("group:b", "member", "user:z"),
        ("doc:1", "viewer", "group:b#member"),  # a shortcut: depth 3, not 4
    ])
    res = run(g, "doc:1", "viewer", "user:z")
    assert res.resolution_path == ("doc:1#viewer@group:b#member", "group:b#member@user:z")
    assert res.depth == 2
    res = run(g, "folder:1", "viewer", "user:z")
    assert res.resolution_path == ("folder:1#viewer@group:a#member",
                                   "group:a#member@group:b#member", "group:b#member@user:z")
    assert (res.resolution, res.depth) == ("userset", 3)


def test_userset_as_the_checked_user() -> None:
    g = graph_of([("doc:1", "viewer", "group:x#member"), ("group:x", "member", "user:a"),
                  ("folder:1", "viewer", "doc:1#viewer")])
    res = run(g, "doc:1", "viewer", "group:x#member")
    assert (res.allowed, res.resolution, res.resolution_path) == (
        True, "direct", ("doc:1#viewer@group:x#member",))
    res = run(g, "folder:1", "viewer", "group:x#member")
    assert (res.allowed, res.resolution, res.depth) == (True, "userset", 2)
    assert res.resolution_path == ("folder:1#viewer@doc:1#viewer", "doc:1#viewer@group:x#member")
    assert run(g, "doc:1", "viewer", "group:y#member").allowed is False
    assert run(g, "group:x", "member", "doc:1#viewer").allowed is False  # edges have a direction


def test_a_userset_has_its_own_relation() -> None:
    g = StoreGraph()
    assert run(g, "group:x", "member", "group:x#member") == CheckResult(True, "direct", (), 1, 1)
    g.add("group:x", "member", "user:a")
    assert run(g, "group:x", "member", "group:x#member").resolution_path == ()
    assert run(g, "group:x", "member", "group:x#admin").allowed is False
    assert run(g, "group:x", "admin", "group:x#member").allowed is False
    # Only at the top: group:y#member is not implied by a tuple granting group:x#member.
    g.add("doc:1", "viewer", "group:x#member")
    assert run(g, "doc:1", "viewer", "doc:1#viewer").allowed is True
    assert run(g, "doc:1", "viewer", "group:x#member").resolution == "direct"


@pytest.mark.parametrize("n", [1, 2, 3, 10])
def test_cycles_end_in_deny(n: int) -> None:
    rows = [(f"group:{i}", "member", f"group:{(i + 1) % n}#member") for i in range(n)]
    g = graph_of([*rows, ("doc:1", "viewer", "group:0#member")])
    for user in ("user:a", "group:99#member"):
        assert run(g, "group:0", "member", user).allowed is False
        assert run(g, "doc:1", "viewer", user).allowed is False
    g.add(f"group:{n - 1}", "member", "user:a")
    assert run(g, "group:0", "member", "user:a").depth == n
    assert run(g, "doc:1", "viewer", "user:a").depth == n + 1


def chain_rows(nodes: int, user: str | None = "user:end") -> list[Row]:
    """group:1#member -> group:2#member -> ... -> group:<nodes>#member (-> user)."""
    rows = [(f"group:{i}", "member", f"group:{i + 1}#member") for i in range(1, nodes)]
    if user is not None:
        rows.append((f"group:{nodes}", "member", user))
    return rows


def test_depth_cap_boundary() -> None:
    ok = graph_of(chain_rows(25))
    res = run(ok, "group:1", "member", "user:end")
    assert (res.allowed, res.depth, len(res.resolution_path)) == (True, 25, 25)
    deep = graph_of(chain_rows(26))
    with pytest.raises(ResolutionTooComplex) as info:
        run(deep, "group:1", "member", "user:end")
    assert info.value.max_depth == 25
    assert run(deep, "group:1", "member", "user:end", max_depth=26).depth == 26
    # The cap also applies when the user holds nothing at all: the walk is cut, not finished.
    with pytest.raises(ResolutionTooComplex):
        run(deep, "group:1", "member", "user:nobody")
    assert run(ok, "group:1", "member", "user:nobody").allowed is False
    # Twice, so the memoised walk answers the second time, the same way.
    for _ in range(2):
        with pytest.raises(ResolutionTooComplex):
            run(graph_of(chain_rows(40)), "group:1", "member", "user:nobody")
    g = graph_of(chain_rows(40))
    for cap in (40, 39, 41, 2, 1):
        if cap >= 40:
            assert run(g, "group:1", "member", "user:nobody", cap).allowed is False
        else:
            with pytest.raises(ResolutionTooComplex):
                run(g, "group:1", "member", "user:nobody", cap)


def test_cap_of_one() -> None:
    g = graph_of([("doc:1", "viewer", "group:x#member"), ("group:x", "member", "user:a"),
                  ("doc:1", "viewer", "user:b")])
    assert run(g, "doc:1", "viewer", "user:b", 1).depth == 1
    with pytest.raises(ResolutionTooComplex):
        run(g, "doc:1", "viewer", "user:a", 1)
    loop = graph_of([("doc:1", "viewer", "doc:1#viewer")])  # a self-loop cuts nothing
    assert run(loop, "doc:1", "viewer", "user:a", 1).allowed is False
    with pytest.raises(ValueError):
        run(g, "doc:1", "viewer", "user:b", 0)


def test_proof_within_cap_beats_a_truncated_branch() -> None:
    rows = [("doc:1", "viewer", "group:1#member"), *chain_rows(40, None),
            ("doc:1", "viewer", "team:1#member"), ("team:1", "member", "user:a")]
    g = graph_of(rows)
    res = run(g, "doc:1", "viewer", "user:a", max_depth=5)
    assert (res.allowed, res.depth) == (True, 2)
    with pytest.raises(ResolutionTooComplex):
        run(g, "doc:1", "viewer", "user:b", max_depth=5)
    # Deeper proofs too: the proof at depth 4 is found though another branch is cut at 5.
    g = graph_of([*rows, ("team:1", "member", "team:2#member"), ("team:2", "member",
                  "team:3#member"), ("team:3", "member", "user:c")])
    assert run(g, "doc:1", "viewer", "user:c", max_depth=5).depth == 4


def test_deep_chain_without_recursion() -> None:
    n = 10_000
    g = graph_of(chain_rows(n))
    res = run(g, "group:1", "member", "user:end", max_depth=20_000)
    assert (res.allowed, res.depth, len(res.resolution_path)) == (True, n, n)
    assert res.resolution_path[0] == "group:1#member@group:2#member"
    assert res.resolution_path[-1] == f"group:{n}#member@user:end"
    assert run(g, "group:1", "member", "user:nobody", max_depth=20_000).allowed is False
    assert sys.getrecursionlimit() < n  # so a recursive walk would have failed


# --- the index --------------------------------------------------------------------------------


def test_add_remove_idempotent_and_len() -> None:
    g = StoreGraph()
    assert len(g) == 0
    assert g.add("doc:1", "viewer", "user:a") is True
    assert g.add("doc:1", "viewer", "user:a") is False
    assert g.add("doc:1", "viewer", "group:x#member") is True
    assert len(g) == 2
    assert ("doc:1", "viewer", "user:a") in g and ("doc:1", "viewer", "user:b") not in g
    assert g.remove("doc:1", "viewer", "user:b") is False
    assert g.remove("doc:2", "viewer", "user:a") is False
    assert g.remove("doc:1", "viewer", "user:a") is True
    assert g.remove("doc:1", "viewer", "user:a") is False
    assert len(g) == 1
    g.load([("doc:1", "viewer", "group:x#member"), ("doc:2", "viewer", "user:a"),
            ("doc:2", "viewer", "user:a")])
    assert len(g) == 2


def test_load_restores_gc_and_counts_partial_loads() -> None:
    def rows() -> Iterable[Row]:
        yield ("doc:1", "viewer", "user:a")
        yield ("doc:1", "viewer", "group:x#member")
        raise RuntimeError("connection lost")

    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            g = StoreGraph()
            with pytest.raises(RuntimeError):
                g.load(rows())
            assert gc.isenabled() is enabled
            assert len(g) == 2 and ("doc:1", "viewer", "group:x#member") in g
            g.load([("group:x", "member", "user:b")])
            assert run(g, "doc:1", "viewer", "user:b").depth == 2
        finally:
            gc.enable()


def test_remove_then_check_denied() -> None:
    g = graph_of([("doc:1", "viewer", "group:x#member"), ("group:x", "member", "user:a"),
                  ("doc:1", "viewer", "user:b")])
    assert run(g, "doc:1", "viewer", "user:a").allowed is True
    assert g.remove("group:x", "member", "user:a")
    assert run(g, "doc:1", "viewer", "user:a").allowed is False
    g.add("group:x", "member", "user:a")
    assert g.remove("doc:1", "viewer", "group:x#member")
    assert run(g, "doc:1", "viewer", "user:a").allowed is False
    assert g.remove("doc:1", "viewer", "user:b")
    assert run(g, "doc:1", "viewer", "user:b").allowed is False


def test_containers_grow_and_shrink() -> None:
    """Past the small-tuple threshold containers become sets/lists and come back."""
    g = StoreGraph()
    users = [f"user:{i}" for i in range(40)]
    groups = [f"group:{i}#member" for i in range(40)]
    for u in users + groups:
        g.add("doc:1", "viewer", u)
        g.add("doc:2", "viewer", u)
    for i, grp in enumerate(groups):
        g.add(grp.partition("#")[0], "member", f"user:m{i}")
    assert len(g) == 160 + 40
    assert run(g, "doc:1", "viewer", "user:m39").depth == 2
    for u in users[:38] + groups[:38]:
        assert g.remove("doc:1", "viewer", u)
    assert run(g, "doc:1", "viewer", "user:39").depth == 1
    assert run(g, "doc:1", "viewer", "user:m39").depth == 2
    assert run(g, "doc:1", "viewer", "user:m0").allowed is False
    assert run(g, "doc:2", "viewer", "user:m0").allowed is True
    assert len(g) == 200 - 76


def test_single_entries_are_stored_bare_and_walked() -> None:
    """A user held by one node, and a node with one userset child, are stored as the bare node
    key (no 1-tuple; the memory target of issue 12), and every reader takes it as one node, not
    as the characters of a string: direct matches, walks down single children, backward steps
    through single parents, proofs, and the forms going 1 -> 2 -> 1 -> 0 entries."""
    chain_ = [("doc:1", "viewer", "grp:a#m"), ("grp:a", "m", "grp:b#m"), ("grp:b", "m", "grp:c#m"),
              ("grp:c", "m", "usr:x")]
    g = graph_of(chain_)
    assert g._usersets["doc:1#viewer"] == "grp:a#m" and g._nodes_by_user["usr:x"] == "grp:c#m"
    assert g.holders("usr:x") == ("grp:c#m",) and g.usersets("grp:a#m") == ("grp:b#m",)
    assert ("grp:c", "m", "usr:x") in g and ("grp:c", "m", "usr") not in g
    # A substring of a bare entry is no match (a string's `in` would say it is).
    assert run(g, "grp:c", "m", "usr:x").depth == 1
    assert run(g, "rp:c", "m", "usr:x").allowed is False
    res = run(g, "doc:1", "viewer", "usr:x")
    assert (res.depth, res.resolution_path) == (4, (
        "doc:1#viewer@grp:a#m", "grp:a#m@grp:b#m", "grp:b#m@grp:c#m", "grp:c#m@usr:x"))
    assert run(g, "doc:1", "viewer", "grp:c#m").depth == 3  # a userset user held by one node
    # Deny or cut is the forward walk's alone (nobody holds the user): it must go down the chain.
    with pytest.raises(ResolutionTooComplex):
        run(g, "doc:1", "viewer", "usr:y", max_depth=3)
    assert run(g, "doc:1", "viewer", "usr:y", max_depth=4).allowed is False
    # Wide fan-out below, single parents above: the search steps backward through bare entries.
    wide = [("grp:a", "m", f"grp:w{i}#m") for i in range(40)]
    g.load(wide)
    res = run(g, "doc:1", "viewer", "usr:x")
    assert res.depth == 4 and res.dispatch_count > 1  # a walk, not the answer cache
    assert outcome(g, "doc:1", "viewer", "usr:x") == oracle([*chain_, *wide], "doc:1", "viewer",
                                                            "usr:x")
    # 1 -> 2 -> 1 -> 0, for a holder entry and a userset entry at once.
    assert g.add("doc:2", "viewer", "grp:a#m")
    assert g.holders("grp:a#m") == ("doc:1#viewer", "doc:2#viewer")
    assert g.add("doc:1", "viewer", "grp:z#m")
    assert g.usersets("doc:1#viewer") == ("grp:a#m", "grp:z#m")
    assert g.remove("doc:1", "viewer", "grp:a#m")
    assert g._nodes_by_user["grp:a#m"] == "doc:2#viewer" and g._usersets["doc:1#viewer"] == "grp:z#m"
    assert run(g, "doc:2", "viewer", "usr:x").depth == 4
    assert run(g, "doc:1", "viewer", "usr:x").allowed is False
    assert g.remove("doc:2", "viewer", "grp:a#m") and g.remove("doc:1", "viewer", "grp:z#m")
    assert "grp:a#m" not in g._nodes_by_user and "doc:1#viewer" not in g._usersets
    assert g.holders("grp:a#m") == () and g.usersets("doc:1#viewer") == ()
    assert not g.remove("doc:2", "viewer", "grp:a#m")


def test_memo_follows_changes() -> None:
    """Denials answered from the memoised walk follow later writes."""
    rows = [("doc:1", "viewer", "group:0#member")]
    rows += [("group:0", "member", f"group:{i}#member") for i in range(1, 41)]
    rows += [(f"group:{i}", "member", f"team:{i}#member") for i in range(1, 41)]
    g = graph_of(rows)  # a walk of 82 nodes, 4 deep
    for _ in range(2):
        assert run(g, "doc:1", "viewer", "user:a").allowed is False
    assert g._memo  # the walk was memoised
    g.add("team:17", "member", "user:a")  # not a userset tuple: the memo stays valid
    assert run(g, "doc:1", "viewer", "user:a").depth == 4
    assert run(g, "doc:1", "viewer", "user:b").allowed is False
    g.add("team:40", "member", "deep:1#member")  # a new userset edge: one level deeper
    g.add("deep:1", "member", "user:b")
    assert run(g, "doc:1", "viewer", "user:b").depth == 5
    with pytest.raises(ResolutionTooComplex):
        run(g, "doc:1", "viewer", "user:c", max_depth=4)
    assert run(g, "doc:1", "viewer", "user:c", max_depth=5).allowed is False
    g.remove("group:0", "member", "group:17#member")
    assert run(g, "doc:1", "viewer", "user:a").allowed is False
    assert run(g, "doc:1", "viewer", "user:b").depth == 5
    g.remove("doc:1", "viewer", "group:0#member")
    assert run(g, "doc:1", "viewer", "user:b").allowed is False


def fresh(s: str) -> str:
    return "".join(list(s))  # a new object, not a code constant


def test_strings_are_shared_and_released() -> None:
    g = StoreGraph()
    rows = [(fresh("doc:1"), fresh("viewer"), fresh("group:x#member")),
            (fresh("group:x"), fresh("member"), fresh("user:a")),
            (fresh("doc:2"), fresh("viewer"), fresh("user:a")),
            (fresh("doc:2"), fresh("viewer"), fresh("user:b"))]
    g.load(rows)
    # The userset user and the node it names are one object; so is a node across its tuples.
    kid = g._usersets["doc:1#viewer"]
    assert kid is next(k for k in g.holders("user:a") if k == "group:x#member")
    held_a, held_b = g.holders("user:a"), g.holders("user:b")
    doc2 = next(iter(held_b))
    assert doc2 == "doc:2#viewer" and next(k for k in held_a if k == doc2) is doc2
    assert_index_exact(g, set(rows))
    del kid, held_a, held_b
    # Released: once its tuples are gone the index keeps no reference to a string (the
    # interpreter's intern table does not count), so it is freed with its last user.
    base = sys.getrefcount(doc2)
    assert g.remove(fresh("doc:2"), fresh("viewer"), fresh("user:a"))
    assert sys.getrefcount(doc2) == base - 1
    assert g.remove(fresh("doc:2"), fresh("viewer"), fresh("user:b"))
    assert sys.getrefcount(doc2) == base - 2
    for t in rows[:2]:
        assert g.remove(*map(fresh, t))
    assert (len(g), g._nodes_by_user, g._usersets) == (0, {}, {})


def test_remove_keeps_strings_in_use() -> None:
    """A string goes when its last tuple goes, in whichever role it was used; until then every
    tuple stays removable and checkable."""
    g = StoreGraph()
    loop = ("group:x", "member", "group:x#member")  # node and user are the same string
    rows = [loop, ("doc:1", "viewer", "group:x#member"), ("group:x", "member", "user:a")]
    current = set(rows)
    g.load(rows)
    for t in (loop, ("group:x", "member", "user:a"), ("doc:1", "viewer", "group:x#member")):
        assert g.remove(*t) is True
        current.discard(t)
        assert_index_exact(g, current)
        assert g.remove(*t) is False
    assert (g._nodes_by_user, g._usersets) == ({}, {})
    for t in rows:  # and back, in another order
        assert g.add(*t) is True
    assert_index_exact(g, set(rows))
    assert run(g, "doc:1", "viewer", "user:a").depth == 2


def test_load_is_add_per_row() -> None:
    rng = random.Random(7)
    rows = random_rows(rng, 30, 8, 400, 0.5)
    rows += rows[:50]  # duplicates are skipped
    loaded, added = StoreGraph(), StoreGraph()
    loaded.load(rows)
    for t in rows:
        added.add(*t)
    # The snapshot's form: rows known distinct, loaded without the per-row membership scan.
    snapshot = StoreGraph()
    snapshot.load_nodes(((f"{o}#{r}", u) for o, r, u in dict.fromkeys(rows)), distinct=True)
    for g in (loaded, added, snapshot):
        assert_index_exact(g, set(rows))
        assert g._nodes_by_user == added._nodes_by_user
        assert g._usersets == added._usersets


# --- the package -------------------------------------------------------------------------------


def test_public_names_unchanged() -> None:
    from engine import graph

    assert graph.check is check and graph.StoreGraph is StoreGraph
    assert graph.CheckResult is CheckResult and graph.ResolutionTooComplex is ResolutionTooComplex
    assert graph.DEFAULT_MAX_DEPTH == 25
    assert set(graph.__all__) >= {"CheckResult", "ResolutionTooComplex", "StoreGraph", "check"}


def test_graph_package_does_no_io() -> None:
    """STYLE.md: the algorithm imports neither aiohttp, nor asyncpg, nor redis."""
    code = ("import sys, engine.graph; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'aiohttp', 'asyncpg', "
            "'redis', 'socket', 'asyncio'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]", out


def test_at_sign_in_object_and_user_ids() -> None:
    """'@' may appear in ids (e-mail addresses); resolution path steps still split cleanly."""
    rows = [("doc:report@2024", "viewer", "group:ops@acme#member"),
            ("group:ops@acme", "member", "user:anne@example.com"),
            ("doc:report@2024", "owner", "user:bob@example.com")]
    for t in rows:
        validate_tuple(*t)
    g = graph_of(rows)
    res = run(g, "doc:report@2024", "viewer", "user:anne@example.com")
    assert res.resolution_path == ("doc:report@2024#viewer@group:ops@acme#member",
                                   "group:ops@acme#member@user:anne@example.com")
    assert [split_step(step) for step in res.resolution_path] == [rows[0], rows[1]]
    assert_consistent(g, res, "doc:report@2024", "viewer", "user:anne@example.com")
    res = run(g, "doc:report@2024", "owner", "user:bob@example.com")
    assert split_step(res.resolution_path[0]) == rows[2]
    assert run(g, "doc:report@2024", "viewer", "user:anne").allowed is False


# --- tuple validation -------------------------------------------------------------------------

GOOD_OBJECTS = ["document:1", "doc:a-b_c.d", "usersets-user:userset_recursive_1", "t:é",
                "repo:org/name", "file:a=b+c~d%20|e", "_x:1", "x" * 64 + ":" + "y" * 255,
                "a:" + "b" * MAX_ID_LENGTH]
BAD_OBJECTS: list[tuple[Any, str]] = [
    ("", "empty"), ("doc", "missing ':'"), ("doc:", "empty id"), (":1", "empty type"),
    ("doc:1:2", "more than one ':'"), ("doc:1#viewer", "'#'"), ("doc :1", "whitespace"),
    ("doc:1 ", "whitespace"), ("doc:\t1", "whitespace"), ("doc:1\n", "whitespace"),
    ("doc:1\x00", "control"), ("doc:*", "wildcard"), ("doc:a*", "wildcard"),
    ("-doc:1", "type"), (".doc:1", "type"), ("d!oc:1", "type"), ("x" * 65 + ":1", "65"),
    ("doc:" + "b" * (MAX_ID_LENGTH + 1), "257"), ("do@c:a", "'@'"), ("doc:a\u200bb", "contains"),
    ("x" * 64 + ":" + "y" * 256, str(MAX_OBJECT_LENGTH + 1)), (5, "string"), (None, "string"),
]
GOOD_USERS = ["user:1", "user:anne@example.com", "group:x#member", "user:anne_b", "team:a.b#can-view",
              "usersets-user:userset_recursive_mixed_direct_assignment_2#userset"]
BAD_USERS: list[tuple[Any, str]] = [
    ("user", "missing ':'"), ("user:*", "wildcard"), ("group:x#", "empty relation"),
    ("group:x#a#b", "more than one '#'"), ("group:x#1a", "relation"), ("a:b:c", "':'"),
    ("us@er:a", "'@'"), ("user: a", "whitespace"), ("group:x#mem ber", "whitespace"),
    ("#member", "nothing before '#'"), ("user:#member", "empty id"), ([], "string"),
]
GOOD_RELATIONS = ["viewer", "can_read", "can-read", "_x", "R2", "a" * 64]
BAD_RELATIONS: list[tuple[Any, str]] = [
    ("", "empty"), ("1x", "invalid"), ("a#b", "'#'"), ("a:b", "':'"), ("a@b", "'@'"),
    ("a b", "whitespace"), ("a.b", "invalid"), ("a" * 65, "65"), (1, "string"),
]


@pytest.mark.parametrize("value", GOOD_OBJECTS)
def test_validate_object_accepts(value: str) -> None:
    assert validate_object(value) is value


@pytest.mark.parametrize(("value", "words"), BAD_OBJECTS)
def test_validate_object_rejects(value: Any, words: str) -> None:
    with pytest.raises(TupleFormatError) as info:
        validate_object(value)
    assert info.value.field == "object"
    assert words in info.value.message


@pytest.mark.parametrize("value", GOOD_USERS + GOOD_OBJECTS)
def test_validate_user_accepts(value: str) -> None:
    assert validate_user(value) is value


@pytest.mark.parametrize(("value", "words"), BAD_USERS)
def test_validate_user_rejects(value: Any, words: str) -> None:
    with pytest.raises(TupleFormatError) as info:
        validate_user(value)
    assert info.value.field == "user"
    assert words in info.value.message


@pytest.mark.parametrize("value", GOOD_RELATIONS)
def test_validate_relation_accepts(value: str) -> None:
    assert validate_relation(value) is value


@pytest.mark.parametrize(("value", "words"), BAD_RELATIONS)
def test_validate_relation_rejects(value: Any, words: str) -> None:
    with pytest.raises(TupleFormatError) as info:
        validate_relation(value)
    assert info.value.field == "relation"
    assert words in info.value.message


def test_validate_tuple_names_the_bad_part() -> None:
    validate_tuple("doc:1", "viewer", "group:x#member")
    for args, field in ((("doc:1#x", "viewer", "user:1"), "object"),
                        (("doc:1", "view er", "user:1"), "relation"),
                        (("doc:1", "viewer", "user:*"), "user")):
        with pytest.raises(TupleFormatError) as info:
            validate_tuple(*args)
        assert info.value.field == field
        assert isinstance(info.value, ValueError)
        assert str(info.value).startswith(field + ": ")


def _accepted(validate: Any, value: Any) -> bool:
    try:
        validate(value)
    except TupleFormatError:
        return False
    return True


def test_is_valid_tuple_is_the_validators_rule() -> None:
    objects = [*GOOD_OBJECTS, *(v for v, _ in BAD_OBJECTS)]
    relations = [*GOOD_RELATIONS, *(v for v, _ in BAD_RELATIONS)]
    users = [*GOOD_USERS, *GOOD_OBJECTS, *(v for v, _ in BAD_USERS), *(v for v, _ in BAD_OBJECTS),
             "x" * 64 + ":" + "y" * 256 + "#" + "r" * 64, "x" * 64 + ":" + "y" * 255 + "#" + "r" * 64]
    for o in objects:
        for r in relations[::3]:
            for u in users[::5]:
                want = _accepted(lambda t: validate_tuple(*t), (o, r, u))
                assert is_valid_tuple(o, r, u) is want, (o, r, u)
    for o in objects:
        assert is_valid_tuple(o, "viewer", "user:1") is _accepted(validate_object, o), o
    for r in relations:
        assert is_valid_tuple("doc:1", r, "user:1") is _accepted(validate_relation, r), r
    for u in users:
        assert is_valid_tuple("doc:1", "viewer", u) is _accepted(validate_user, u), u



def test_is_valid_tuple_remembers_each_part_for_its_own_role() -> None:
    """The memo of passed parts never lets a string through in a role it is not valid for,
    holds at most MEMO_SIZE strings per part, and takes any JSON value without raising."""
    assert is_valid_tuple("doc:1", "viewer", "group:1#member")
    assert is_valid_tuple("group:1#member", "viewer", "user:1") is False  # a user, no object
    assert is_valid_tuple("doc:1", "group:1#member", "user:1") is False
    assert is_valid_tuple("doc:1", "viewer", "viewer") is False  # a relation, no user
    assert is_valid_tuple("viewer", "viewer", "user:1") is False
    # The validators share the memo, each for its own role too.
    assert validate_user("group:2#member") == "group:2#member"
    for validate, value in ((validate_object, "group:2#member"), (validate_relation, "doc:1"),
                            (validate_user, "viewer"), (validate_object, "viewer")):
        with pytest.raises(TupleFormatError):
            validate(value)
    for bad in ({}, [], None, 1, {"a": 1}):
        assert is_valid_tuple(bad, "viewer", "user:1") is False
        assert is_valid_tuple("doc:1", bad, "user:1") is False
        assert is_valid_tuple("doc:1", "viewer", bad) is False
    for i in range(tuples_module.MEMO_SIZE + 10):
        assert is_valid_tuple("doc:1", "viewer", f"user:m{i}")
    assert 10 <= len(tuples_module._passed_users) <= tuples_module.MEMO_SIZE
    assert is_valid_tuple("doc:1", "viewer", "user:m0") and is_valid_tuple("doc:1", "viewer",
                                                                         "user:x y") is False
