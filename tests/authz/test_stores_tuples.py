"""Stores and tuples on the control plane (SPEC.md 2 "Authorization tuple", 4; DESIGN.md "lists").

POST/GET /v1/stores, GET /v1/stores/{id}, POST /v1/stores/{id}/write (``writes`` and ``deletes``,
atomic, 1 to 1000 tuples), GET /v1/stores/{id}/tuples (filters, keyset pagination), and the
``tuple_changes`` log the engine follows: one revision per effective write, no gaps.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import asyncpg
import orjson
import pytest

from tests.fixtures.service import Project, Response, assert_error, assert_invalid_field

ULID = r"[0-9a-hjkmnp-tv-z]{26}"


def t(obj: str, rel: str, user: str) -> dict[str, str]:
    return {"object": obj, "relation": rel, "user": user}


async def new_store(project: Project, name: str = "docs") -> str:
    r = await project.api.post("/v1/stores", {"name": name})
    assert r.status == 201, r.body
    return str(r.body["id"])


async def write(project: Project, store_id: str, writes: list[Any] | None = None,
                deletes: list[Any] | None = None) -> Response:
    payload: dict[str, Any] = {}
    if writes is not None:
        payload["writes"] = writes
    if deletes is not None:
        payload["deletes"] = deletes
    return await project.api.post(f"/v1/stores/{store_id}/write", payload)


async def ok_write(project: Project, store_id: str, writes: list[Any] | None = None,
                   deletes: list[Any] | None = None) -> dict[str, int]:
    r = await write(project, store_id, writes, deletes)
    assert r.status == 200, r.body
    return dict(r.body)


async def all_tuples(project: Project, store_id: str, query: str = "") -> list[dict[str, str]]:
    r = await project.api.get(f"/v1/stores/{store_id}/tuples?limit=1000{query}")
    assert r.status == 200, r.body
    assert r.body["has_more"] is False
    return [t(x["object"], x["relation"], x["user"]) for x in r.body["data"]]


async def revision(project: Project, store_id: str) -> int:
    r = await project.api.get(f"/v1/stores/{store_id}")
    assert r.status == 200, r.body
    return int(r.body["revision"])


async def changes(db: asyncpg.Pool, store_id: str) -> list[Any]:
    return await db.fetch(
        "SELECT revision, seq, operation, object, relation, subject FROM tuple_changes "
        "WHERE store_id = $1 ORDER BY revision, seq", store_id)


def key(x: dict[str, str]) -> tuple[str, str, str]:
    return (x["object"], x["relation"], x["user"])


# --- stores -----------------------------------------------------------------------------------


async def test_create_list_and_get_stores(project: Project) -> None:
    r = await project.api.post("/v1/stores", {"name": "documents"})
    assert r.status == 201, r.body
    assert r.headers["X-Request-Id"] == r.body["request_id"]
    store = r.body
    assert re.fullmatch(rf"store_{ULID}", store["id"]), store
    assert store["name"] == "documents"
    assert store["revision"] == 0

    other = await new_store(project, "folders")
    listing = await project.api.get("/v1/stores")
    assert listing.status == 200, listing.body
    by_id = {s["id"]: s for s in listing.body["data"]}
    assert set(by_id) == {store["id"], other}
    assert by_id[store["id"]]["name"] == "documents"
    assert listing.body["has_more"] is False and listing.body["next_cursor"] is None

    got = await project.api.get(f"/v1/stores/{store['id']}")
    assert got.status == 200
    assert got.body["id"] == store["id"] and got.body["name"] == "documents"
    assert got.body["revision"] == 0


async def test_forged_store_cursor_is_invalid_request_not_a_crash(project: Project,
                                                                   db: asyncpg.Pool) -> None:
    import base64
    import hashlib
    import hmac

    await new_store(project)
    # Signed with the deployment's real secret (the signed format of control_plane.web.pagination),
    # so the checks behind the signature are reached; unsigned, they are refused before.
    secret = await db.fetchval("SELECT value FROM service_secrets WHERE name = 'cursor_hmac'")
    for values in (["stores", project.id, 7], ["stores", project.id, False],
                   ["stores", project.id, None], ["stores", project.id]):
        payload = orjson.dumps(values)
        mac = hmac.new(secret, b"authio/cursor/v1\x00" + payload, hashlib.sha256).digest()[:16]
        signed = ".".join(base64.urlsafe_b64encode(p).decode().rstrip("=") for p in (payload, mac))
        unsigned = base64.urlsafe_b64encode(payload).decode().rstrip("=")
        for cursor in (signed, unsigned):
            assert_error(await project.api.get("/v1/stores?cursor=" + cursor), 400, "invalid_request")


async def test_store_listing_paginates(project: Project) -> None:
    ids = {await new_store(project, f"s{i}") for i in range(5)}
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        r = await project.api.get("/v1/stores?limit=2" + (f"&cursor={cursor}" if cursor else ""))
        assert r.status == 200, r.body
        seen += [s["id"] for s in r.body["data"]]
        cursor = r.body["next_cursor"]
        if not r.body["has_more"]:
            assert cursor is None
            break
    assert len(seen) == len(set(seen)) == 5 and set(seen) == ids


@pytest.mark.parametrize("payload", [{}, {"name": ""}, {"name": 3}, {"name": "a", "x": 1}])
async def test_invalid_store_body_is_invalid_request(project: Project, payload: dict[str, Any]) -> None:
    assert_error(await project.api.post("/v1/stores", payload), 400, "invalid_request")
    assert (await project.api.get("/v1/stores")).body["data"] == []


async def test_unknown_store_is_store_not_found(project: Project) -> None:
    missing = "store_01hzzzzzzzzzzzzzzzzzzzzzzz"
    assert_error(await project.api.get(f"/v1/stores/{missing}"), 404, "store_not_found")
    assert_error(await write(project, missing, [t("document:1", "viewer", "user:a")]), 404,
                 "store_not_found")
    assert_error(await project.api.get(f"/v1/stores/{missing}/tuples"), 404, "store_not_found")


@pytest.mark.parametrize("store_id", ["%00", "store_%00abc", "store_01hzzzzzzzzzzzzzzzzzzzzz%00",
                                      "store_%01", "%7F", "%C2%85"])
async def test_a_control_character_in_a_store_id_is_invalid_request_naming_it(
    project: Project, store_id: str
) -> None:
    """NUL went to PostgreSQL, which cannot take it (a 500); no id holds a control character."""
    for r in (await project.api.get(f"/v1/stores/{store_id}"),
              await project.api.get(f"/v1/stores/{store_id}/tuples"),
              await write(project, store_id, [t("document:1", "viewer", "user:a")])):
        assert_invalid_field(r, "store_id", "must not contain control characters")


async def test_a_malformed_or_over_long_store_id_is_not_found(project: Project) -> None:
    for store_id in ("nope", "store_" + "0" * 27, "x" * 5000):
        assert_error(await project.api.get(f"/v1/stores/{store_id}"), 404, "store_not_found")
        assert_error(await project.api.get(f"/v1/stores/{store_id}/tuples"), 404,
                     "store_not_found")
        assert_error(await write(project, store_id, [t("document:1", "viewer", "user:a")]), 404,
                     "store_not_found")


async def test_another_projects_store_is_invisible(
    project: Project, new_project: Callable[..., Any], db: asyncpg.Pool
) -> None:
    other = await new_project("tuples-other")
    theirs = await new_store(other, "private")
    await ok_write(other, theirs, [t("document:secret", "viewer", "user:eve")])

    assert_error(await project.api.get(f"/v1/stores/{theirs}"), 404, "store_not_found")
    assert_error(await write(project, theirs, [t("document:secret", "owner", "user:mallory")]),
                 404, "store_not_found")
    assert_error(await write(project, theirs, deletes=[t("document:secret", "viewer", "user:eve")]),
                 404, "store_not_found")
    r = await project.api.get(f"/v1/stores/{theirs}/tuples")
    assert_error(r, 404, "store_not_found")
    assert b"secret" not in r.raw
    listing = await project.api.get("/v1/stores")
    assert theirs not in {s["id"] for s in listing.body["data"]}

    # Nothing changed in their store.
    assert await all_tuples(other, theirs) == [t("document:secret", "viewer", "user:eve")]
    assert await revision(other, theirs) == 1
    assert len(await changes(db, theirs)) == 1


# --- write ------------------------------------------------------------------------------------


async def test_write_returns_counts_and_revision(project: Project, db: asyncpg.Pool) -> None:
    store = await new_store(project)
    r = await write(project, store, [t("document:1", "viewer", "user:anne"),
                                     t("document:1", "editor", "group:eng#member")])
    assert r.status == 200, r.body
    assert r.headers["X-Request-Id"] == r.body["request_id"]
    assert (r.body["written"], r.body["deleted"], r.body["revision"]) == (2, 0, 1)
    assert await revision(project, store) == 1
    assert sorted(map(key, await all_tuples(project, store))) == [
        ("document:1", "editor", "group:eng#member"), ("document:1", "viewer", "user:anne")]
    rows = await changes(db, store)
    assert [(c["revision"], c["operation"]) for c in rows] == [(1, "write"), (1, "write")]
    assert len({c["seq"] for c in rows}) == 2


async def test_rewriting_an_existing_tuple_is_a_noop(project: Project, db: asyncpg.Pool) -> None:
    store = await new_store(project)
    tup = t("document:1", "viewer", "user:anne")
    assert (await ok_write(project, store, [tup]))["revision"] == 1
    again = await ok_write(project, store, [tup])
    assert (again["written"], again["deleted"], again["revision"]) == (0, 0, 1)
    assert await revision(project, store) == 1
    assert len(await changes(db, store)) == 1
    # Partly new: only the new one counts, one new revision.
    mixed = await ok_write(project, store, [tup, t("document:2", "viewer", "user:anne")])
    assert (mixed["written"], mixed["revision"]) == (1, 2)
    assert [c["revision"] for c in await changes(db, store)] == [1, 2]


async def test_deleting_an_absent_tuple_is_a_noop(project: Project, db: asyncpg.Pool) -> None:
    store = await new_store(project)
    r = await ok_write(project, store, deletes=[t("document:1", "viewer", "user:anne")])
    assert (r["written"], r["deleted"], r["revision"]) == (0, 0, 0)
    assert await revision(project, store) == 0
    assert await changes(db, store) == []
    await ok_write(project, store, [t("document:1", "viewer", "user:bob")])
    r = await ok_write(project, store, deletes=[t("document:1", "viewer", "user:anne")])
    assert (r["deleted"], r["revision"]) == (0, 1)


async def test_write_and_delete_in_one_call_is_one_revision(project: Project,
                                                            db: asyncpg.Pool) -> None:
    store = await new_store(project)
    a, b, c = (t("document:1", "viewer", "user:anne"), t("document:1", "viewer", "user:bob"),
               t("folder:x", "owner", "user:carl"))
    await ok_write(project, store, [a, b])
    r = await ok_write(project, store, writes=[c], deletes=[a])
    assert (r["written"], r["deleted"], r["revision"]) == (1, 1, 2)
    assert sorted(map(key, await all_tuples(project, store))) == sorted(map(key, [b, c]))
    rev2 = [(x["operation"], x["object"], x["relation"], x["subject"])
            for x in await changes(db, store) if x["revision"] == 2]
    assert sorted(rev2) == [("delete", "document:1", "viewer", "user:anne"),
                            ("write", "folder:x", "owner", "user:carl")]


BAD_TUPLES = [
    pytest.param(t("document 1", "viewer", "user:anne"), "object", id="space-in-object"),
    pytest.param(t("document1", "viewer", "user:anne"), "object", id="object-missing-colon"),
    pytest.param(t("document:", "viewer", "user:anne"), "object", id="object-empty-id"),
    pytest.param(t(":1", "viewer", "user:anne"), "object", id="object-empty-type"),
    pytest.param(t("document:*", "viewer", "user:anne"), "object", id="object-wildcard"),
    pytest.param(t("document:1", "", "user:anne"), "relation", id="empty-relation"),
    pytest.param(t("document:1", "view er", "user:anne"), "relation", id="space-in-relation"),
    pytest.param(t("document:1", "viewer", "useranne"), "user", id="user-missing-colon"),
    pytest.param(t("document:1", "viewer", "user:*"), "user", id="user-wildcard"),
    pytest.param(t("document:1", "viewer", "group:x#"), "user", id="userset-empty-relation"),
    pytest.param(t("document:1", "viewer", "group:#member"), "user", id="userset-empty-id"),
    pytest.param(t("document:1", "viewer", ""), "user", id="empty-user"),
    pytest.param({"object": "document:1", "relation": "viewer"}, "user", id="user-missing"),
    pytest.param({"object": "document:1", "relation": "viewer", "user": 7}, "user", id="user-not-string"),
    pytest.param({**t("document:1", "viewer", "user:a"), "condition": "x"}, "condition",
                 id="unknown-field"),
    pytest.param("document:1#viewer@user:anne", None, id="not-an-object"),
]


def _names_index(r: Response, where: str) -> bool:
    text = r.body["error"]["message"] + orjson.dumps(r.body["error"]["details"]).decode()
    return where in text or where.replace(".", "[", 1).replace(".", "].", 1) in text


@pytest.mark.parametrize(("bad", "part"), BAD_TUPLES)
@pytest.mark.parametrize("side", ["writes", "deletes"])
async def test_one_bad_tuple_rejects_the_whole_call(
    project: Project, db: asyncpg.Pool, bad: Any, part: str | None, side: str
) -> None:
    store = await new_store(project)
    existing = t("document:0", "viewer", "user:zed")
    await ok_write(project, store, [existing])
    good = [t("document:1", "viewer", "user:anne"), t("document:2", "viewer", "user:bob"),
            t("document:3", "viewer", "user:carl")]
    items = [good[0], good[1], bad, good[2]]
    if side == "writes":
        r = await write(project, store, items, [existing])
    else:
        r = await write(project, store, good, [existing, good[0], bad])
    assert_error(r, 400, "invalid_request")
    index = 2
    assert _names_index(r, f"{side}.{index}"), r.body
    if part is not None:
        fields = [f["field"] for f in r.body["error"]["details"].get("fields", [])]
        assert f"{side}.{index}.{part}" in fields, r.body
    # Nothing happened: same tuples, same revision, no new change rows.
    assert await all_tuples(project, store) == [existing]
    assert await revision(project, store) == 1
    assert len(await changes(db, store)) == 1


async def test_bad_tuple_field_is_named(project: Project) -> None:
    store = await new_store(project)
    r = await write(project, store, [t("document:1", "viewer", "user:a"),
                                     t("document:1", "", "user:a")])
    assert_error(r, 400, "invalid_request")
    fields = [f["field"] for f in r.body["error"]["details"]["fields"]]
    assert "writes.1.relation" in fields, fields


async def test_valid_names_are_accepted(project: Project) -> None:
    store = await new_store(project)
    ok = [t("document:2024-q1_report", "can_view", "user:anne.smith%40example.com"),
          t("repo:acme/api", "writer", "team:backend#member"),
          t("doc:01HZX", "viewer", "user:12345")]
    r = await ok_write(project, store, ok)
    assert r["written"] == 3
    assert sorted(map(key, await all_tuples(project, store))) == sorted(map(key, ok))


async def test_exactly_1000_tuples_is_accepted_and_1001_rejected(project: Project,
                                                                 db: asyncpg.Pool) -> None:
    store = await new_store(project)
    too_many = [t(f"document:{i}", "viewer", "user:anne") for i in range(1001)]
    assert_error(await write(project, store, too_many), 400, "invalid_request")
    split = await write(project, store, too_many[:600],
                        [t(f"folder:{i}", "viewer", "user:anne") for i in range(401)])
    assert_error(split, 400, "invalid_request")
    assert await revision(project, store) == 0
    assert await all_tuples(project, store) == []

    r = await ok_write(project, store, too_many[:1000])
    assert (r["written"], r["revision"]) == (1000, 1)
    assert len(await all_tuples(project, store)) == 1000
    rows = await changes(db, store)
    assert len(rows) == 1000 and {c["revision"] for c in rows} == {1}
    assert sorted(c["seq"] for c in rows) == sorted({c["seq"] for c in rows})

    mixed = await ok_write(project, store, [t("document:x", "viewer", "user:anne")],
                           [t(f"document:{i}", "viewer", "user:anne") for i in range(999)])
    assert (mixed["written"], mixed["deleted"], mixed["revision"]) == (1, 999, 2)


@pytest.mark.parametrize("payload", [
    {},
    {"writes": []},
    {"deletes": []},
    {"writes": [], "deletes": []},
    {"writes": None},
    {"writes": {"object": "document:1", "relation": "viewer", "user": "user:a"}},
    {"tuples": [{"object": "document:1", "relation": "viewer", "user": "user:a"}]},
])
async def test_empty_or_malformed_call_is_invalid_request(project: Project,
                                                          payload: dict[str, Any]) -> None:
    store = await new_store(project)
    assert_error(await project.api.post(f"/v1/stores/{store}/write", payload), 400,
                 "invalid_request")
    assert await revision(project, store) == 0


async def test_duplicate_tuples_in_one_call_are_invalid_request(project: Project,
                                                                db: asyncpg.Pool) -> None:
    store = await new_store(project)
    a = t("document:1", "viewer", "user:anne")
    b = t("document:2", "viewer", "user:anne")
    for call, field, message in (
        (write(project, store, [a, b, dict(a)]), "writes.2", "repeats writes.0"),
        (write(project, store, deletes=[a, a]), "deletes.1", "repeats deletes.0"),
        (write(project, store, [a], [b, a]), "deletes.1", "repeats writes.0"),
    ):
        r = await call
        assert_error(r, 400, "invalid_request")
        assert r.body["error"]["details"]["fields"] == [{"field": field, "message": message}]
    assert await revision(project, store) == 0
    assert await all_tuples(project, store) == []
    assert await changes(db, store) == []


async def test_write_needs_authz_write_scope(project: Project) -> None:
    store = await new_store(project)
    reader = await project.api.post("/v1/api-keys", {"prefix": "sk_test_", "name": "reader",
                                                     "scopes": ["authz:check"]})
    api = project.api.with_key(reader.body["secret"])
    r = await api.post(f"/v1/stores/{store}/write", {"writes": [t("document:1", "viewer", "user:a")]})
    assert_error(r, 403, "insufficient_scope")
    assert (await api.get(f"/v1/stores/{store}/tuples")).status == 200
    assert await revision(project, store) == 0
    assert_error(await project.api.post(f"/v1/stores/{store}/write",
                                        {"writes": [t("document:1", "viewer", "user:a")]}, key=None),
                 401, "missing_api_key")


# --- listing ----------------------------------------------------------------------------------


@pytest.fixture
def sample() -> list[dict[str, str]]:
    return [
        t("document:1", "viewer", "user:anne"),
        t("document:1", "viewer", "user:bob"),
        t("document:1", "editor", "user:anne"),
        t("document:1", "viewer", "group:eng#member"),
        t("document:2", "viewer", "user:anne"),
        t("document:2", "owner", "user:carl"),
        t("folder:a", "viewer", "user:anne"),
        t("group:eng", "member", "user:bob"),
        t("group:eng", "member", "user:dora"),
    ]


async def test_listing_filters(project: Project, sample: list[dict[str, str]]) -> None:
    store = await new_store(project)
    await ok_write(project, store, sample)

    def expect(pred: Callable[[dict[str, str]], bool]) -> list[tuple[str, str, str]]:
        return sorted(key(x) for x in sample if pred(x))

    async def got(query: str) -> list[tuple[str, str, str]]:
        return [key(x) for x in await all_tuples(project, store, query)]

    assert await got("") == expect(lambda x: True)
    assert await got("&object=document:1") == expect(lambda x: x["object"] == "document:1")
    assert await got("&relation=viewer") == expect(lambda x: x["relation"] == "viewer")
    assert await got("&user=user:anne") == expect(lambda x: x["user"] == "user:anne")
    assert await got("&user=group:eng%23member") == [("document:1", "viewer", "group:eng#member")]
    assert await got("&object=document:1&relation=viewer") == expect(
        lambda x: x["object"] == "document:1" and x["relation"] == "viewer")
    assert await got("&object=document:1&relation=viewer&user=user:bob") == [
        ("document:1", "viewer", "user:bob")]
    assert await got("&relation=viewer&user=user:anne") == expect(
        lambda x: x["relation"] == "viewer" and x["user"] == "user:anne")
    assert await got("&object=document:404") == []


async def test_listing_items_have_the_tuple_fields(project: Project) -> None:
    store = await new_store(project)
    await ok_write(project, store, [t("document:1", "viewer", "user:anne")])
    r = await project.api.get(f"/v1/stores/{store}/tuples")
    assert r.status == 200
    assert r.headers["X-Request-Id"] == r.body["request_id"]
    (item,) = r.body["data"]
    assert (item["object"], item["relation"], item["user"]) == ("document:1", "viewer", "user:anne")


@pytest.mark.parametrize("query", ["object=document%201", "object=document", "relation=",
                                   "user=group:x%23", "limit=0", "limit=1001", "cursor=zzz"])
async def test_bad_listing_query_is_invalid_request(project: Project, query: str) -> None:
    store = await new_store(project)
    assert_error(await project.api.get(f"/v1/stores/{store}/tuples?{query}"), 400,
                 "invalid_request")


async def test_listing_pagination_walks_each_tuple_once_in_order(
    project: Project, sample: list[dict[str, str]]
) -> None:
    store = await new_store(project)
    await ok_write(project, store, sample)
    seen: list[tuple[str, str, str]] = []
    cursor = None
    pages = 0
    while True:
        r = await project.api.get(f"/v1/stores/{store}/tuples?limit=2"
                                  + (f"&cursor={cursor}" if cursor else ""))
        assert r.status == 200, r.body
        assert len(r.body["data"]) <= 2
        seen += [key(x) for x in r.body["data"]]
        pages += 1
        assert pages <= 10
        if not r.body["has_more"]:
            assert r.body["next_cursor"] is None
            break
        cursor = r.body["next_cursor"]
    assert seen == sorted(key(x) for x in sample)
    assert pages == 5

    # With a filter, the cursor keeps the filter's rows only.
    seen_f: list[tuple[str, str, str]] = []
    cursor = None
    while True:
        r = await project.api.get(f"/v1/stores/{store}/tuples?limit=1&relation=viewer"
                                  + (f"&cursor={cursor}" if cursor else ""))
        assert r.status == 200, r.body
        seen_f += [key(x) for x in r.body["data"]]
        if not r.body["has_more"]:
            break
        cursor = r.body["next_cursor"]
    assert seen_f == sorted(key(x) for x in sample if x["relation"] == "viewer")


async def test_cursor_of_another_store_is_invalid_request(project: Project,
                                                          sample: list[dict[str, str]]) -> None:
    a, b = await new_store(project, "a"), await new_store(project, "b")
    await ok_write(project, a, sample)
    await ok_write(project, b, sample)
    r = await project.api.get(f"/v1/stores/{a}/tuples?limit=1")
    assert_error(await project.api.get(f"/v1/stores/{b}/tuples?cursor={r.body['next_cursor']}"),
                 400, "invalid_request")


# --- the change log ---------------------------------------------------------------------------


async def test_change_log_revisions_are_contiguous(project: Project, db: asyncpg.Pool) -> None:
    store = await new_store(project)
    effective = 0
    for i in range(30):
        tup = t(f"document:{i % 7}", "viewer", f"user:{i % 5}")
        if i % 3 == 2:
            r = await ok_write(project, store, deletes=[tup])
        else:
            r = await ok_write(project, store, [tup])
        if r["written"] or r["deleted"]:
            effective += 1
            assert r["revision"] == effective
        else:
            assert r["revision"] == effective
    assert effective > 10
    rows = await changes(db, store)
    revisions = sorted({c["revision"] for c in rows})
    assert revisions == list(range(1, effective + 1))
    assert await revision(project, store) == effective
    # Replaying the log gives exactly the stored tuples.
    state: set[tuple[str, str, str]] = set()
    for c in rows:
        k = (c["object"], c["relation"], c["subject"])
        if c["operation"] == "write":
            assert k not in state
            state.add(k)
        else:
            assert k in state
            state.discard(k)
    assert state == set(map(key, await all_tuples(project, store)))


async def test_concurrent_writers_get_gapless_unique_revisions(project: Project,
                                                               db: asyncpg.Pool) -> None:
    store = await new_store(project)
    writers, per_writer = 8, 25

    async def writer(w: int) -> list[dict[str, int]]:
        results = []
        for i in range(per_writer):
            # Every fifth write repeats the writer's previous tuple: a no-op.
            n = i - 1 if i % 5 == 4 else i
            results.append(await ok_write(project, store, [t(f"document:{w}-{n}", "viewer",
                                                             "user:anne")]))
        return results

    results = [r for rs in await asyncio.gather(*(writer(w) for w in range(writers))) for r in rs]
    effective = [r for r in results if r["written"]]
    noops = [r for r in results if not r["written"]]
    assert len(effective) == writers * per_writer * 4 // 5
    assert len(noops) == writers * per_writer // 5
    assert sorted(r["revision"] for r in effective) == list(range(1, len(effective) + 1))
    assert await revision(project, store) == len(effective)

    rows = await changes(db, store)
    assert [c["revision"] for c in rows] == list(range(1, len(effective) + 1))
    assert len(await all_tuples(project, store)) == len(effective)
    stored = await db.fetch("SELECT object, revision FROM tuples WHERE store_id = $1", store)
    by_change = {c["object"]: c["revision"] for c in rows}
    assert {s["object"]: s["revision"] for s in stored} == by_change
