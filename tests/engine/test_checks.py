"""Permission checks over HTTP: POST /v1/stores/{id}/check and /batch-check.

SPEC.md section 2 ("Authorization tuple"), section 4 rule 4 (direct and userset rules, depth cap,
cycle protection), section 7 (errors); DESIGN.md (codes the spec leaves open:
``invalid_request``, ``store_not_found``, ``insufficient_scope``, ``resolution_too_complex``,
``revision_ahead``, ``revision_not_reached``).
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import ClientSession

from common.settings import Settings
from tests.fixtures.service import Api, Project, Response, assert_error, assert_invalid_field, serving

VISIBLE_WITHIN_S = 1.0
POLL_INTERVAL_S = 0.005


# --- helpers ----------------------------------------------------------------------------------


def tk(spec: str) -> dict[str, str]:
    """``"doc:1#viewer@user:a"`` -> ``{"object", "relation", "user"}``.

    The object ends at the first '#' (types and ids never hold one), the relation at the next
    '@' (relations never hold one); the user is the rest, '@' in its id included.
    """
    obj, _, rest = spec.partition("#")
    rel, _, user = rest.partition("@")
    return {"object": obj, "relation": rel, "user": user}


def node_of(spec: str) -> str:
    """``"object#relation@user"`` -> ``"object#relation"`` (see :func:`tk`)."""
    t = tk(spec)
    return f"{t['object']}#{t['relation']}"


async def new_store(api: Api, name: str = "checks") -> str:
    r = await api.post("/v1/stores", {"name": name})
    assert r.status == 201, r.body
    return str(r.body["id"])


async def write(api: Api, store_id: str, writes: list[str] = (),  # type: ignore[assignment]
                deletes: list[str] = ()) -> int:  # type: ignore[assignment]
    """Write (and delete) tuples given as ``object#relation@user`` strings; returns the revision."""
    revision = -1
    writes, deletes = list(writes), list(deletes)
    while writes or deletes:  # chunks of at most 1000 tuples in all
        w, writes = writes[:1000], writes[1000:]
        d, deletes = deletes[: 1000 - len(w)], deletes[1000 - len(w):]
        r = await api.post(f"/v1/stores/{store_id}/write",
                           {"writes": [tk(s) for s in w], "deletes": [tk(s) for s in d]})
        assert r.status == 200, r.body
        revision = r.body["revision"]
    return revision


async def check(api: Api, store_id: str, spec: str, revision: int | None = None,
                **kw: Any) -> Response:
    body: dict[str, Any] = {"tuple_key": tk(spec)}
    if revision is not None:
        body["consistency"] = {"at_least_revision": revision}
    return await api.post(f"/v1/stores/{store_id}/check", body, **kw)


async def allowed(api: Api, store_id: str, spec: str, revision: int | None = None) -> bool:
    r = await check(api, store_id, spec, revision)
    assert r.status == 200, (spec, r.status, r.body)
    return bool(r.body["allowed"])


async def batch(api: Api, store_id: str, items: list[Any], **kw: Any) -> Response:
    return await api.post(f"/v1/stores/{store_id}/batch-check", {"checks": items, **kw})


def chain(n: int, user: str = "user:x", tag: str = "") -> tuple[list[str], str]:
    """Tuples of a proof path with ``n`` object#relation nodes, and the check proving it.

    Node 1 is ``doc:top{tag}#viewer``; nodes 2..n are ``group:{tag}g{i}#member``.
    """
    nodes = [f"doc:top{tag}#viewer"] + [f"group:{tag}g{i}#member" for i in range(2, n + 1)]
    tuples = [f"{a}@{b}" for a, b in itertools.pairwise(nodes)] + [f"{nodes[-1]}@{user}"]
    return tuples, f"{nodes[0]}@{user}"


@asynccontextmanager
async def own_engine(http: ClientSession, settings: Settings) -> AsyncIterator[Api]:
    """An engine app of its own (same database and Redis as ``service``), ready, then stopped."""
    from engine.app import create_engine_app

    async with serving(http, create_engine_app(settings)) as api:
        yield api


async def scoped_key(project: Project, scopes: list[str]) -> dict[str, Any]:
    r = await project.api.post("/v1/api-keys", {"prefix": "sk_test_", "name": f"k{secrets.token_hex(3)}",
                                                "scopes": scopes})
    assert r.status == 201, r.body
    return dict(r.body)


# --- direct and userset -----------------------------------------------------------------------


async def test_direct_tuple_is_allowed_with_its_path(project: Project) -> None:
    store = await new_store(project.api)
    rev = await write(project.api, store, ["doc:1#viewer@user:a"])
    r = await check(project.api, store, "doc:1#viewer@user:a", rev)
    assert r.status == 200, r.body
    assert r.body["allowed"] is True
    assert r.body["resolution"] == "direct"
    assert r.body["resolution_path"] == ["doc:1#viewer@user:a"]
    assert (r.body["depth"], r.body["dispatch_count"]) == (1, 1)
    assert r.body["revision"] >= rev
    assert r.body["request_id"] == r.headers["X-Request-Id"]
    assert r.headers["Content-Type"].startswith("application/json")


@pytest.mark.parametrize("spec", [
    "doc:1#viewer@user:b",     # another user
    "doc:1#editor@user:a",     # another relation
    "doc:2#viewer@user:a",     # another object
    "doc:1#viewer@user:a#member",  # a userset user is not the plain user
])
async def test_no_matching_tuple_is_denied(project: Project, spec: str) -> None:
    store = await new_store(project.api)
    rev = await write(project.api, store, ["doc:1#viewer@user:a"])
    r = await check(project.api, store, spec, rev)
    assert r.status == 200, r.body
    assert r.body == {"allowed": False, "resolution": "none", "resolution_path": [],
                      "revision": r.body["revision"], "request_id": r.body["request_id"],
                      "dispatch_count": 1, "depth": 0}


async def test_userset_path_is_in_order(project: Project) -> None:
    store = await new_store(project.api)
    rev = await write(project.api, store, [
        "doc:1#viewer@group:eng#member",
        "group:eng#member@user:a",
        "doc:1#viewer@user:b",
    ])
    r = await check(project.api, store, "doc:1#viewer@user:a", rev)
    assert r.status == 200, r.body
    assert r.body["allowed"] is True
    assert r.body["resolution"] == "userset"
    assert r.body["resolution_path"] == ["doc:1#viewer@group:eng#member", "group:eng#member@user:a"]
    assert r.body["depth"] == 2 and r.body["dispatch_count"] >= 2
    denied = await check(project.api, store, "doc:1#viewer@user:c", rev)
    assert (denied.body["allowed"], denied.body["depth"]) == (False, 0)
    assert denied.body["dispatch_count"] >= 1


async def test_nested_usersets_resolve_at_depth(project: Project) -> None:
    store = await new_store(project.api)
    tuples, spec = chain(6)
    rev = await write(project.api, store, tuples)
    r = await check(project.api, store, spec, rev)
    assert r.status == 200, r.body
    assert r.body["allowed"] is True and r.body["resolution"] == "userset"
    assert r.body["resolution_path"] == tuples
    # every node on the way answers too, and a stranger is denied everywhere
    for t in tuples[1:]:
        node = node_of(t)
        assert await allowed(project.api, store, f"{node}@user:x", rev) is True
        assert await allowed(project.api, store, f"{node}@user:y", rev) is False


async def test_shortest_proof_is_reported(project: Project) -> None:
    store = await new_store(project.api)
    long_tuples, _ = chain(5, tag="l")
    rev = await write(project.api, store, [*long_tuples, "doc:topl#viewer@group:short#member",
                                           "group:short#member@user:x"])
    r = await check(project.api, store, "doc:topl#viewer@user:x", rev)
    assert r.status == 200 and r.body["allowed"] is True, r.body
    assert r.body["resolution_path"] == ["doc:topl#viewer@group:short#member",
                                         "group:short#member@user:x"]


async def test_unicode_ids(project: Project) -> None:
    store = await new_store(project.api)
    rev = await write(project.api, store, ["doc:résumé#viewer@user:zoë",
                                           "doc:résumé#viewer@group:équipe#member",
                                           "group:équipe#member@user:jürgen"])
    r = await check(project.api, store, "doc:résumé#viewer@user:zoë", rev)
    assert r.status == 200 and r.body["allowed"] is True, r.body
    assert r.body["resolution_path"] == ["doc:résumé#viewer@user:zoë"]
    r = await check(project.api, store, "doc:résumé#viewer@user:jürgen", rev)
    assert r.status == 200 and r.body["allowed"] is True, r.body
    assert r.body["resolution_path"] == ["doc:résumé#viewer@group:équipe#member",
                                         "group:équipe#member@user:jürgen"]
    # no normalisation: a look-alike id is another id
    assert await allowed(project.api, store, "doc:resume#viewer@user:zoë", rev) is False


async def test_at_signs_in_object_and_user_ids(project: Project) -> None:
    """E-mail-like ids ('@' inside the id) on both ends; each path step splits back into the
    tuple it names (object up to the first '#', relation up to the next '@', user the rest)."""
    store = await new_store(project.api)
    tuples = ["doc:q3@finance#viewer@group:ops@acme#member",
              "group:ops@acme#member@user:anne@example.com"]
    rev = await write(project.api, store, tuples)
    r = await check(project.api, store, "doc:q3@finance#viewer@user:anne@example.com", rev)
    assert r.status == 200 and r.body["allowed"] is True, r.body
    assert r.body["resolution_path"] == tuples
    assert [tk(step) for step in r.body["resolution_path"]] == [
        {"object": "doc:q3@finance", "relation": "viewer", "user": "group:ops@acme#member"},
        {"object": "group:ops@acme", "relation": "member", "user": "user:anne@example.com"}]
    assert await allowed(project.api, store, "doc:q3@finance#viewer@user:anne", rev) is False
    assert await allowed(project.api, store, "doc:q3#viewer@user:anne@example.com", rev) is False


# --- userset as user, self ------------------------------------------------------------------


async def test_userset_as_user(project: Project) -> None:
    store = await new_store(project.api)
    rev = await write(project.api, store, [
        "doc:1#viewer@group:x#member",
        "doc:2#viewer@team:t#member",
        "team:t#member@group:x#member",
        "group:x#member@user:a",
    ])
    r = await check(project.api, store, "doc:1#viewer@group:x#member", rev)
    assert r.status == 200, r.body
    assert r.body["allowed"] is True and r.body["resolution"] == "direct"
    assert r.body["resolution_path"] == ["doc:1#viewer@group:x#member"]
    # the userset reached through another userset
    r = await check(project.api, store, "doc:2#viewer@group:x#member", rev)
    assert r.status == 200 and r.body["allowed"] is True, r.body
    assert r.body["resolution"] == "userset"
    assert r.body["resolution_path"] == ["doc:2#viewer@team:t#member", "team:t#member@group:x#member"]
    # a userset matches only a tuple naming exactly that userset
    for spec in ("doc:1#viewer@group:x#admin", "doc:1#viewer@group:y#member",
                 "doc:1#viewer@group:x", "doc:3#viewer@group:x#member"):
        assert await allowed(project.api, store, spec, rev) is False, spec
    # and its members still get through by the ordinary userset rule
    assert await allowed(project.api, store, "doc:1#viewer@user:a", rev) is True
    assert await allowed(project.api, store, "doc:2#viewer@user:a", rev) is True


async def test_userset_has_its_own_relation_without_tuples(project: Project) -> None:
    store = await new_store(project.api)
    r = await check(project.api, store, "group:x#member@group:x#member")
    assert r.status == 200, r.body
    assert r.body["allowed"] is True
    assert r.body["resolution"] in ("direct", "userset")
    for spec in ("group:x#member@group:x#admin", "group:x#member@group:y#member",
                 "group:x#admin@group:x#member", "group:x#member@group:x"):
        assert await allowed(project.api, store, spec) is False, spec


# --- cycles -----------------------------------------------------------------------------------


async def test_two_node_cycle_is_denied_quickly(project: Project) -> None:
    store = await new_store(project.api)
    rev = await write(project.api, store, [
        "group:a#member@group:b#member",
        "group:b#member@group:a#member",
        "doc:1#viewer@group:a#member",
    ])
    for spec in ("group:a#member@user:x", "group:b#member@user:x", "doc:1#viewer@user:x"):
        started = time.perf_counter()
        r = await check(project.api, store, spec, rev)
        elapsed = time.perf_counter() - started
        assert r.status == 200, r.body
        assert r.body["allowed"] is False and r.body["resolution"] == "none", r.body
        assert elapsed < 0.5, elapsed
    # a member attached to the cycle is found from every entry point
    rev = await write(project.api, store, ["group:b#member@user:x"])
    for spec in ("group:a#member@user:x", "group:b#member@user:x", "doc:1#viewer@user:x"):
        assert await allowed(project.api, store, spec, rev) is True, spec


async def test_dense_cycles_are_denied_quickly(project: Project) -> None:
    store = await new_store(project.api)
    n = 30  # every group contains every other group: 870 tuples, cycles everywhere
    tuples = [f"group:c{i}#member@group:c{j}#member" for i in range(n) for j in range(n) if i != j]
    rev = await write(project.api, store, tuples)
    started = time.perf_counter()
    r = await batch(project.api, store, [{"tuple_key": tk(f"group:c{i}#member@user:nobody"),
                                          "consistency": {"at_least_revision": rev}}
                                         for i in range(n)])
    elapsed = time.perf_counter() - started
    assert r.status == 200, r.body
    assert [x["allowed"] for x in r.body["results"]] == [False] * n, r.body
    assert elapsed < 1.0, elapsed


# --- depth cap --------------------------------------------------------------------------------


async def test_depth_cap_boundary_25_allowed_26_too_complex(project: Project) -> None:
    store = await new_store(project.api)
    t25, spec25 = chain(25, tag="a")
    t26, spec26 = chain(26, tag="b")
    rev = await write(project.api, store, t25 + t26)
    r = await check(project.api, store, spec25, rev)
    assert r.status == 200, r.body
    assert r.body["allowed"] is True and r.body["resolution"] == "userset"
    assert r.body["resolution_path"] == t25
    r = await check(project.api, store, spec26, rev)
    assert_error(r, 422, "resolution_too_complex")
    assert r.body["error"]["details"]["max_depth"] == 25
    # never reported as a silent deny in batch either
    r = await batch(project.api, store, [{"tuple_key": tk(spec25)}, {"tuple_key": tk(spec26)}],
                    consistency={"at_least_revision": rev})
    assert r.status == 200, r.body
    assert r.body["results"][0]["allowed"] is True
    assert r.body["results"][1]["error"]["code"] == "resolution_too_complex", r.body


async def test_dead_end_chain_at_cap_is_denied_beyond_is_too_complex(project: Project) -> None:
    store = await new_store(project.api)
    t25, _ = chain(25, user="user:somebody", tag="a")
    t26, _ = chain(26, user="user:somebody", tag="b")
    rev = await write(project.api, store, t25 + t26)
    # 25 nodes walked completely without a proof: an honest deny
    r = await check(project.api, store, "doc:topa#viewer@user:x", rev)
    assert r.status == 200, r.body
    assert r.body["allowed"] is False
    # the 26th node could not be visited: not a deny
    r = await check(project.api, store, "doc:topb#viewer@user:x", rev)
    assert_error(r, 422, "resolution_too_complex")


async def test_found_within_cap_beats_a_truncated_branch(project: Project) -> None:
    store = await new_store(project.api)
    deep, _ = chain(40, user="user:x", tag="d")  # proof only at node 40, far past the cap
    # written first, so a depth-first walk would enter the deep branch first
    rev = await write(project.api, store, deep)
    rev = await write(project.api, store, ["doc:topd#viewer@group:near#member",
                                           "group:near#member@group:nearer#member",
                                           "group:nearer#member@user:x"])
    r = await check(project.api, store, "doc:topd#viewer@user:x", rev)
    assert r.status == 200, r.body
    assert r.body["allowed"] is True
    assert r.body["resolution_path"] == ["doc:topd#viewer@group:near#member",
                                         "group:near#member@group:nearer#member",
                                         "group:nearer#member@user:x"]
    # without the near branch, the only proof lies past the cap
    rev = await write(project.api, store, deletes=["doc:topd#viewer@group:near#member"])
    r = await check(project.api, store, "doc:topd#viewer@user:x", rev)
    assert_error(r, 422, "resolution_too_complex")


async def test_custom_depth_cap(project: Project, http: ClientSession,
                                settings_factory: Callable[..., Settings]) -> None:
    store = await new_store(project.api)
    t3, spec3 = chain(3, tag="c3")
    t4, spec4 = chain(4, tag="c4")
    rev = await write(project.api, store, t3 + t4)
    async with own_engine(http, settings_factory(check_max_depth=3)) as engine:
        api = engine.with_key(project.key)
        r = await check(api, store, spec3, rev)
        assert r.status == 200, r.body
        assert r.body["allowed"] is True and r.body["resolution_path"] == t3
        r = await check(api, store, spec4, rev)
        assert_error(r, 422, "resolution_too_complex")
        assert r.body["error"]["details"]["max_depth"] == 3
    # the default cap (25) of the shared service allows both
    assert await allowed(project.api, store, spec4, rev) is True


# --- write / delete visibility ------------------------------------------------------------------


async def _poll_until(api: Api, store: str, spec: str, want: bool, within: float) -> float:
    """Poll the check (no consistency token) until it answers ``want``; return the seconds it took."""
    started = time.perf_counter()
    while True:
        r = await check(api, store, spec)
        assert r.status == 200, r.body
        if r.body["allowed"] is want:
            return time.perf_counter() - started
        if time.perf_counter() - started > within:
            raise AssertionError(f"{spec} not {want} after {within} s: {r.body}")
        await asyncio.sleep(POLL_INTERVAL_S)


async def test_write_is_visible_at_its_revision(project: Project) -> None:
    store = await new_store(project.api)
    assert await allowed(project.api, store, "doc:1#viewer@user:a") is False  # store in memory
    rev = await write(project.api, store, ["doc:1#viewer@user:a"])
    r = await check(project.api, store, "doc:1#viewer@user:a", rev)
    assert r.status == 200 and r.body["allowed"] is True, r.body
    assert r.body["revision"] >= rev


async def test_write_is_visible_without_token_within_1s(project: Project) -> None:
    store = await new_store(project.api)
    assert await allowed(project.api, store, "doc:1#viewer@user:a") is False  # store in memory
    latencies = []
    for i in range(5):
        spec = f"doc:{i}#viewer@user:a"
        started = time.perf_counter()
        await write(project.api, store, [spec])
        waited = await _poll_until(project.api, store, spec, True, within=2 * VISIBLE_WITHIN_S)
        latencies.append(time.perf_counter() - started)
        assert waited < VISIBLE_WITHIN_S
    print(f"\nwrite->visible (combined app, no token): max {max(latencies) * 1000:.1f} ms, "
          f"all {[round(x * 1000, 1) for x in latencies]} ms")
    assert max(latencies) < VISIBLE_WITHIN_S, latencies


async def test_delete_then_denied(project: Project) -> None:
    store = await new_store(project.api)
    rev = await write(project.api, store, ["doc:1#viewer@group:g#member", "group:g#member@user:a",
                                           "doc:1#viewer@user:b"])
    assert await allowed(project.api, store, "doc:1#viewer@user:a", rev) is True
    assert await allowed(project.api, store, "doc:1#viewer@user:b", rev) is True
    rev = await write(project.api, store, deletes=["group:g#member@user:a"])
    assert await allowed(project.api, store, "doc:1#viewer@user:a", rev) is False
    assert await allowed(project.api, store, "doc:1#viewer@user:b", rev) is True
    # without a token: becomes denied within a second
    await write(project.api, store, deletes=["doc:1#viewer@user:b"])
    waited = await _poll_until(project.api, store, "doc:1#viewer@user:b", False,
                               within=2 * VISIBLE_WITHIN_S)
    assert waited < VISIBLE_WITHIN_S


# --- consistency timeout ------------------------------------------------------------------------


async def test_a_revision_beyond_the_head_is_revision_ahead_at_once(
        project: Project, http: ClientSession, settings_factory: Callable[..., Settings]) -> None:
    """A revision the store never reached is 400 ``revision_ahead`` without waiting (no wait
    makes it true), naming the store's latest revision; not a 503 to retry forever."""
    store = await new_store(project.api)
    rev = await write(project.api, store, ["doc:1#viewer@user:a"])
    async with own_engine(http, settings_factory(consistency_timeout_ms=2000)) as engine:
        api = engine.with_key(project.key)
        assert await allowed(api, store, "doc:1#viewer@user:a", rev) is True
        started = time.perf_counter()
        r = await check(api, store, "doc:1#viewer@user:a", rev + 1)
        assert time.perf_counter() - started < 1.0  # far below the 2 s wait
        assert_error(r, 400, "revision_ahead")
        assert r.body["error"]["details"] == {"requested": rev + 1, "current": rev}
        assert "Retry-After" not in r.headers
        # batch: a top-level token fails the call, an item's own token fails that item only
        started = time.perf_counter()
        r = await batch(api, store, [{"tuple_key": tk("doc:1#viewer@user:a")}],
                        consistency={"at_least_revision": rev + 1_000_000})
        assert_error(r, 400, "revision_ahead")
        assert r.body["error"]["details"] == {"requested": rev + 1_000_000, "current": rev}
        r = await batch(api, store, [
            {"tuple_key": tk("doc:1#viewer@user:a"), "consistency": {"at_least_revision": rev}},
            {"tuple_key": tk("doc:1#viewer@user:a"),
             "consistency": {"at_least_revision": rev + 1_000_000}},
        ])
        assert time.perf_counter() - started < 1.0
        assert r.status == 200, r.body
        assert r.body["results"][0]["allowed"] is True
        assert r.body["results"][1]["error"]["code"] == "revision_ahead", r.body
        assert r.body["results"][1]["error"]["details"] == {"requested": rev + 1_000_000,
                                                            "current": rev}
        # Once written, the same revision is answered.
        assert await write(project.api, store, ["doc:2#viewer@user:a"]) == rev + 1
        assert await allowed(api, store, "doc:2#viewer@user:a", rev + 1) is True


# --- batch ------------------------------------------------------------------------------------


async def test_batch_preserves_order(project: Project) -> None:
    store = await new_store(project.api)
    rev = await write(project.api, store, ["doc:1#viewer@user:a", "doc:2#viewer@group:g#member",
                                           "group:g#member@user:b"])
    specs = ["doc:1#viewer@user:a", "doc:1#viewer@user:b", "doc:2#viewer@user:b",
             "doc:2#viewer@user:a", "doc:2#viewer@group:g#member", "doc:3#viewer@user:a",
             "doc:1#viewer@user:a", "doc:2#viewer@user:b", "doc:3#viewer@user:a"]
    expected = [True, False, True, False, True, False, True, True, False]
    r = await batch(project.api, store, [{"tuple_key": tk(s)} for s in specs],
                    consistency={"at_least_revision": rev})
    assert r.status == 200, r.body
    assert r.body["revision"] >= rev
    assert r.headers["X-Request-Id"] == r.body["request_id"]
    results = r.body["results"]
    assert [x["allowed"] for x in results] == expected, results
    assert results[0]["resolution_path"] == ["doc:1#viewer@user:a"]
    assert results[2]["resolution_path"] == ["doc:2#viewer@group:g#member", "group:g#member@user:b"]
    assert [x["resolution"] for x in results] == ["direct", "none", "userset", "none", "direct",
                                                  "none", "direct", "userset", "none"]
    assert results[7]["resolution_path"] == results[2]["resolution_path"]  # a repeated answer
    for x in results:
        assert x["revision"] == r.body["revision"]
        # each answer agrees with the single check
        assert "request_id" not in x
    singles = [await allowed(project.api, store, s, rev) for s in specs]
    assert singles == expected


async def test_batch_bad_item_gets_its_own_error(project: Project) -> None:
    store = await new_store(project.api)
    rev = await write(project.api, store, ["doc:1#viewer@user:a"])
    items = [
        {"tuple_key": tk("doc:1#viewer@user:a")},
        {"tuple_key": {"object": "doc:1", "relation": "viewer", "user": "not a user"}},
        {"tuple_key": tk("doc:1#viewer@user:b")},
        {"tuple_key": {"object": "doc:1", "relation": "viewer"}},
        {"tuple_key": tk("doc:1#viewer@user:a"), "unexpected": 1},
        "not an object",
        {"tuple_key": tk("doc:1#viewer@user:a")},
    ]
    r = await batch(project.api, store, items, consistency={"at_least_revision": rev})
    assert r.status == 200, r.body
    results = r.body["results"]
    assert len(results) == len(items)
    assert results[0]["allowed"] is True
    assert results[2]["allowed"] is False
    assert results[6]["allowed"] is True
    for i in (1, 3, 4, 5):
        err = results[i]["error"]
        assert err["code"] == "invalid_request", (i, results[i])
        assert isinstance(err["message"], str) and err["message"], (i, results[i])
        assert isinstance(err["details"], dict), (i, results[i])
        assert set(results[i]) == {"error"}, (i, results[i])
    assert any("user" in f["field"] for f in results[1]["error"]["details"]["fields"]), results[1]


@pytest.mark.parametrize("count", [0, 1001])
async def test_batch_size_bounds(project: Project, count: int) -> None:
    store = await new_store(project.api)
    r = await batch(project.api, store, [{"tuple_key": tk(f"doc:{i}#viewer@user:a")}
                                         for i in range(count)])
    assert_error(r, 400, "invalid_request")


async def test_batch_of_1000_is_accepted(project: Project) -> None:
    store = await new_store(project.api)
    rev = await write(project.api, store, [f"doc:{i}#viewer@user:a" for i in range(0, 1000, 2)])
    r = await batch(project.api, store, [{"tuple_key": tk(f"doc:{i}#viewer@user:a")}
                                         for i in range(1000)],
                    consistency={"at_least_revision": rev})
    assert r.status == 200, r.body
    assert [x["allowed"] for x in r.body["results"]] == [i % 2 == 0 for i in range(1000)]


@pytest.mark.parametrize("body", [
    {},
    {"checks": "nope"},
    {"checks": [{"tuple_key": tk("doc:1#viewer@user:a")}], "unknown": True},
])
async def test_batch_envelope_errors(project: Project, body: dict[str, Any]) -> None:
    store = await new_store(project.api)
    r = await project.api.post(f"/v1/stores/{store}/batch-check", body)
    assert_error(r, 400, "invalid_request")


# --- validation of check bodies -----------------------------------------------------------------


@pytest.mark.parametrize("body, field", [
    ({}, "tuple_key"),
    ({"consistency": {"at_least_revision": 1}}, "tuple_key"),
    ({"tuple_key": None}, "tuple_key"),
    ({"tuple_key": "doc:1#viewer@user:a"}, "tuple_key"),
    ({"tuple_key": tk("doc:1#viewer@user:a"), "contextual_tuples": []}, "contextual_tuples"),
    ({"tuple_key": {**tk("doc:1#viewer@user:a"), "condition": {}}}, "tuple_key.condition"),
    ({"tuple_key": {"object": "doc:1", "relation": "viewer"}}, "tuple_key.user"),
    ({"tuple_key": {"object": "doc:1", "user": "user:a"}}, "tuple_key.relation"),
    ({"tuple_key": {"relation": "viewer", "user": "user:a"}}, "tuple_key.object"),
    ({"tuple_key": {**tk("doc:1#viewer@user:a"), "user": 7}}, "tuple_key.user"),
    ({"tuple_key": tk("doc:1#viewer@user:a"), "consistency": {"at_least_revision": -1}},
     "consistency.at_least_revision"),
    ({"tuple_key": tk("doc:1#viewer@user:a"), "consistency": {"at_least_revision": "3"}},
     "consistency.at_least_revision"),
    ({"tuple_key": tk("doc:1#viewer@user:a"), "consistency": {"at_least_revision": 1.5}},
     "consistency.at_least_revision"),
    ({"tuple_key": tk("doc:1#viewer@user:a"), "consistency": {"revision": 1}},
     "consistency.revision"),
])
async def test_invalid_check_body(project: Project, body: dict[str, Any], field: str) -> None:
    store = await new_store(project.api)
    r = await project.api.post(f"/v1/stores/{store}/check", body)
    assert_error(r, 400, "invalid_request")
    fields = [f["field"] for f in r.body["error"]["details"].get("fields", [])]
    assert field in fields, r.body


async def test_an_integral_number_is_an_integer_revision(project: Project) -> None:
    """JSON Schema's ``integer`` is any number without a fractional part: 0.0 is revision 0
    (schemathesis sends such numbers as valid data)."""
    store = await new_store(project.api)
    r = await project.api.post(f"/v1/stores/{store}/check", {
        "tuple_key": tk("doc:1#viewer@user:a"), "consistency": {"at_least_revision": 0.0}})
    assert r.status == 200, r.body
    assert r.body["allowed"] is False


@pytest.mark.parametrize("user", [
    "nocolon", "user:", ":a", "user:a#", "user:a#b#c", "user:*", "user:a b", "user:a:b", "",
    "group:x#mem ber", "user:a\n",
])
async def test_bad_user_format(project: Project, user: str) -> None:
    store = await new_store(project.api)
    r = await project.api.post(f"/v1/stores/{store}/check",
                               {"tuple_key": {"object": "doc:1", "relation": "viewer", "user": user}})
    assert_error(r, 400, "invalid_request")
    assert [f["field"] for f in r.body["error"]["details"]["fields"]] == ["tuple_key.user"], r.body


@pytest.mark.parametrize("key", [
    {"object": "doc", "relation": "viewer", "user": "user:a"},
    {"object": "doc:1#viewer", "relation": "viewer", "user": "user:a"},
    {"object": "doc:1", "relation": "", "user": "user:a"},
    {"object": "doc:1", "relation": "view er", "user": "user:a"},
    {"object": "doc:1", "relation": "viewer#x", "user": "user:a"},
])
async def test_bad_object_or_relation_format(project: Project, key: dict[str, str]) -> None:
    store = await new_store(project.api)
    r = await project.api.post(f"/v1/stores/{store}/check", {"tuple_key": key})
    assert_error(r, 400, "invalid_request")


@pytest.mark.parametrize("raw", [b"", b"{not json", b"[]", b"null"])
async def test_non_object_body(project: Project, raw: bytes) -> None:
    store = await new_store(project.api)
    r = await project.api.request("POST", f"/v1/stores/{store}/check", data=raw,
                                  headers={"Content-Type": "application/json"})
    assert_error(r, 400, "invalid_request")


# --- stores and isolation ---------------------------------------------------------------------


@pytest.mark.parametrize("store_id", [
    "store_01hzzzzzzzzzzzzzzzzzzzzzzz",  # well-formed, unknown
    "not-a-store", "store_", "proj_01hzzzzzzzzzzzzzzzzzzzzzzz", "store_01HZZZZZZZZZZZZZZZZZZZZZZZ",
    "store_01hzzzzzzzzzzzzzzzzzzzzzz", "x" * 500,  # malformed: refused before any lookup
])
async def test_unknown_store_is_store_not_found(project: Project, store_id: str) -> None:
    r = await check(project.api, store_id, "doc:1#viewer@user:a")
    assert_error(r, 404, "store_not_found")
    r = await batch(project.api, store_id, [{"tuple_key": tk("doc:1#viewer@user:a")}])
    assert_error(r, 404, "store_not_found")


@pytest.mark.parametrize("store_id", ["%00", "store_%00", "store_%1B"])
async def test_a_control_character_in_a_store_id_is_invalid_request_naming_it(
    project: Project, store_id: str
) -> None:
    """The same answer as the control plane's routes of the store (no id holds one)."""
    r = await check(project.api, store_id, "doc:1#viewer@user:a")
    assert_invalid_field(r, "store_id", "must not contain control characters")
    r = await batch(project.api, store_id, [{"tuple_key": tk("doc:1#viewer@user:a")}])
    assert_invalid_field(r, "store_id", "must not contain control characters")


async def test_a_nul_in_one_batch_item_fails_that_item_alone(project: Project) -> None:
    store = (await project.api.post("/v1/stores", {"name": "nul"})).body["id"]
    r = await batch(project.api, store, [{"tuple_key": tk("doc:1#viewer@user:a")},
                                         {"tuple_key": tk("doc:\u0000#viewer@user:a")}])
    assert r.status == 200, r.body
    assert r.body["results"][0]["allowed"] is False
    assert r.body["results"][1]["error"]["code"] == "invalid_request"


async def test_other_projects_store_is_store_not_found(project: Project, new_project: Any) -> None:
    other = await new_project("B")
    store = await new_store(project.api)
    rev = await write(project.api, store, ["doc:1#viewer@user:a"])
    # B asks first, before A ever checked (the engine loads the store for B's request)
    r = await check(other.api, store, "doc:1#viewer@user:a", rev)
    assert_error(r, 404, "store_not_found")
    assert await allowed(project.api, store, "doc:1#viewer@user:a", rev) is True
    r = await check(other.api, store, "doc:1#viewer@user:a", rev)
    assert_error(r, 404, "store_not_found")
    r = await check(other.api, store, "doc:1#viewer@user:nobody")
    assert_error(r, 404, "store_not_found")
    r = await batch(other.api, store, [{"tuple_key": tk("doc:1#viewer@user:a")}])
    assert_error(r, 404, "store_not_found")
    # a check-only key of B is no better
    b_check = await scoped_key(other, ["authz:check"])
    r = await check(other.api.with_key(b_check["secret"]), store, "doc:1#viewer@user:a")
    assert_error(r, 404, "store_not_found")


async def test_same_tuples_in_two_projects_never_leak(project: Project, new_project: Any) -> None:
    other = await new_project("B")
    store_a = await new_store(project.api, "same")
    store_b = await new_store(other.api, "same")
    rev_a = await write(project.api, store_a, ["doc:1#viewer@group:g#member", "group:g#member@user:a"])
    rev_b = await write(other.api, store_b, ["doc:1#viewer@group:g#member", "group:g#member@user:b"])
    assert await allowed(project.api, store_a, "doc:1#viewer@user:a", rev_a) is True
    assert await allowed(project.api, store_a, "doc:1#viewer@user:b", rev_a) is False
    assert await allowed(other.api, store_b, "doc:1#viewer@user:b", rev_b) is True
    assert await allowed(other.api, store_b, "doc:1#viewer@user:a", rev_b) is False
    # two stores of one project are separate too
    store_a2 = await new_store(project.api, "same")
    assert await allowed(project.api, store_a2, "doc:1#viewer@user:a") is False


# --- authentication and scopes ----------------------------------------------------------------


async def test_missing_and_invalid_key(project: Project, service: Api) -> None:
    store = await new_store(project.api)
    body = {"tuple_key": tk("doc:1#viewer@user:a")}
    for path, payload in ((f"/v1/stores/{store}/check", body),
                          (f"/v1/stores/{store}/batch-check", {"checks": [body]})):
        assert_error(await service.post(path, payload, key=None), 401, "missing_api_key")
        for bad in ("sk_test_" + "A" * 43, "sk_live_nope", "not-a-key"):
            assert_error(await service.post(path, payload, key=bad), 401, "invalid_api_key")
    # authentication comes before validation: an invalid body does not leak a 400
    r = await service.post(f"/v1/stores/{store}/check", {"bogus": 1}, key=None)
    assert_error(r, 401, "missing_api_key")


@pytest.mark.parametrize("scopes", [["users:read"], ["authz:write"], ["users:read", "keys:write"]])
async def test_key_without_authz_check_is_insufficient_scope(project: Project,
                                                             scopes: list[str]) -> None:
    store = await new_store(project.api)
    key = await scoped_key(project, scopes)
    api = project.api.with_key(key["secret"])
    r = await check(api, store, "doc:1#viewer@user:a")
    assert_error(r, 403, "insufficient_scope")
    r = await batch(api, store, [{"tuple_key": tk("doc:1#viewer@user:a")}])
    assert_error(r, 403, "insufficient_scope")


async def test_check_only_key_can_check(project: Project) -> None:
    store = await new_store(project.api)
    rev = await write(project.api, store, ["doc:1#viewer@user:a"])
    key = await scoped_key(project, ["authz:check"])
    api = project.api.with_key(key["secret"])
    assert await allowed(api, store, "doc:1#viewer@user:a", rev) is True
    assert await allowed(api, store, "doc:1#viewer@user:b", rev) is False
    r = await batch(api, store, [{"tuple_key": tk("doc:1#viewer@user:a")}])
    assert r.status == 200 and r.body["results"][0]["allowed"] is True, r.body


@pytest.mark.parametrize("where", ["combined", "separate_engine"])
async def test_revoked_key_is_refused_within_1s(
        project: Project, http: ClientSession, settings_factory: Callable[..., Settings],
        where: str) -> None:
    store = await new_store(project.api)
    rev = await write(project.api, store, ["doc:1#viewer@user:a"])
    key = await scoped_key(project, ["authz:check"])

    async def run(engine: Api) -> float:
        api = engine.with_key(key["secret"])
        assert await allowed(api, store, "doc:1#viewer@user:a", rev) is True  # cached as valid
        r = await project.api.delete(f"/v1/api-keys/{key['id']}")
        assert r.status == 200, r.body
        started = time.perf_counter()
        while True:
            r = await check(api, store, "doc:1#viewer@user:a")
            if r.status == 401:
                elapsed = time.perf_counter() - started
                assert_error(r, 401, "invalid_api_key")
                return elapsed
            assert r.status == 200, r.body
            assert time.perf_counter() - started < 3.0, "revoked key still accepted after 3 s"
            await asyncio.sleep(POLL_INTERVAL_S)

    if where == "combined":
        elapsed = await run(project.api)
    else:
        async with own_engine(http, settings_factory()) as engine:
            elapsed = await run(engine)
    print(f"\nrevoked key refused ({where}) after {elapsed * 1000:.1f} ms")
    assert elapsed < 1.0, elapsed
