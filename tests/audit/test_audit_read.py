"""Reading the audit log (SPEC.md 2 "Audit event", 4 "Audit query filters", 8, 9.2-9.3;
DESIGN.md "lists"): the filtered listing, CSV and JSONL exports, the types and the legacy listing.

Events come from real API actions (bootstrap, key create and revoke) and, for controlled values
and volume, from rows written straight into ``audit_events`` (the write path's table). Expected
results are computed in Python from the project's rows as stored, so every filter is checked
against an independent model of its rule.
"""

from __future__ import annotations

import asyncio
import base64
import re
import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote

import asyncpg
import orjson
import pytest

from tests.audit.helpers import (
    CSV_HEADER,
    EVENT_FIELDS,
    FILTER_CASES,
    TS,
    ULID,
    Fixture,
    audit_key,
    b64,
    csv_rows,
    event,
    get_ok,
    insert,
    iso,
    jsonl,
    make_catalog,
    model,
    resolve,
    secret,
    sign,
    stored,
    unpack,
    walk,
)
from tests.fixtures.service import Project, assert_error


@pytest.fixture
async def catalog(project: Project, db: asyncpg.Pool) -> Fixture:
    return await make_catalog(project, db)


# --- the listing ------------------------------------------------------------------------------


async def test_events_from_real_actions_are_listed_in_full(project: Project) -> None:
    api = await audit_key(project)
    made = await project.api.post("/v1/api-keys", {"prefix": "sk_test_", "name": "ci",
                                                   "scopes": ["authz:check"]},
                                  headers={"User-Agent": "audit-read/1"})
    assert made.status == 201
    assert (await project.api.delete(f"/v1/api-keys/{made.body['id']}")).status == 200
    r = await get_ok(api, "/v1/audit/events")
    assert r.headers["X-Request-Id"] == r.body["request_id"]
    assert set(r.body) == {"data", "next_cursor", "has_more", "request_id"}
    assert r.body["has_more"] is False and r.body["next_cursor"] is None
    events = r.body["data"]
    assert [e["action"] for e in events][:2] == ["api_key.revoked", "api_key.created"]
    assert sorted(e["action"] for e in events) == sorted([
        "api_key.revoked", "api_key.created", "api_key.created", "api_key.created",
        "dashboard_operator.bootstrapped"])
    for e in events:
        assert set(e) == EVENT_FIELDS, e
        assert re.fullmatch(rf"evt_{ULID}", e["id"]) and re.fullmatch(TS, e["created_at"]), e
        assert e["project_id"] == project.id
        assert isinstance(e["metadata"], dict)
    revoked = events[0]
    assert revoked["target_id"] == made.body["id"] and revoked["target_type"] == "api_key"
    assert revoked["actor_type"] == "api_key" and revoked["actor_id"] == project.key_id
    created = next(e for e in events if e["target_id"] == made.body["id"]
                   and e["action"] == "api_key.created")
    assert created["user_agent"] == "audit-read/1" and created["ip"] == "127.0.0.1"
    assert created["metadata"]["scopes"] == ["authz:check"]
    assert created["description"] == created["metadata"]["description"] == "Created API key 'ci'"
    # Newest first on (created_at, id).
    keys = [(e["created_at"], e["id"]) for e in events]
    assert keys == sorted(keys, reverse=True)


@pytest.mark.parametrize(("query", "args"), FILTER_CASES)
async def test_filters_match_the_rule(catalog: Fixture, query: dict[str, str],
                                      args: dict[str, Any]) -> None:
    qs, a = resolve(catalog, query, args)
    expected = model(catalog.rows, **a)
    r = await get_ok(catalog.api, "/v1/audit/events?limit=1000&" + qs)
    assert [e["id"] for e in r.body["data"]] == expected, (qs, [e["action"] for e in r.body["data"]])
    assert r.body["has_more"] is False


async def test_filters_are_not_vacuous(catalog: Fixture) -> None:
    """Each case selects a proper, non-empty subset, save the few meant to be empty (else a
    server ignoring the filter would pass); the literal-wildcard cases differ from wildcards."""
    meant_empty = [{"type": "api_key"}, {"type": "no.such.action"}, {"user": "USER_ANN"},
                   {"from": "@t3", "to": "@t3"}, {"q": "no such text anywhere"}]
    everything = [r["id"] for r in catalog.rows]
    for query, args in FILTER_CASES:
        _, a = resolve(catalog, query, args)
        ids = model(catalog.rows, **a)
        if query in meant_empty:
            assert ids == [], query
        elif query:
            assert ids and ids != everything, query
    assert model(catalog.rows, q="go_kart") != model(catalog.rows, q="kart")
    assert len(model(catalog.rows, q="0%")) == 1 and len(model(catalog.rows, q="0")) > 1
    assert len(model(catalog.rows, q="o_k")) == 1


async def test_from_is_inclusive_and_to_exclusive_at_the_microsecond(catalog: Fixture) -> None:
    t5 = catalog.times["t5"]
    at = [r["id"] for r in catalog.rows if r["created_at"] == t5]
    assert len(at) == 1
    one = timedelta(microseconds=1)
    inclusive = await get_ok(catalog.api, f"/v1/audit/events?from={iso(t5)}&to={iso(t5 + one)}")
    assert [e["id"] for e in inclusive.body["data"]] == at
    exclusive = await get_ok(catalog.api, f"/v1/audit/events?from={iso(t5 - one)}&to={iso(t5)}")
    assert exclusive.body["data"] == []


@pytest.mark.parametrize("spelling", ["{d}T{t}+00:00", "{d}T{t}%2B00:00", "{d}T{t}+0000",
                                      "{d}T{t}Z", "{d}T{t}", "{d}T{t}-00:00", "{d} {t}Z"])
async def test_iso_8601_spellings_are_accepted(catalog: Fixture, spelling: str) -> None:
    t5 = catalog.times["t5"]
    value = spelling.format(d=t5.strftime("%Y-%m-%d"), t=t5.strftime("%H:%M:%S.%f"))
    r = await get_ok(catalog.api, f"/v1/audit/events?limit=1000&from={value.replace(' ', '%20')}")
    assert [e["id"] for e in r.body["data"]] == model(catalog.rows, since=t5)


async def test_an_offset_is_honoured(catalog: Fixture) -> None:
    t5 = catalog.times["t5"]
    local = t5.astimezone(timezone(timedelta(hours=5, minutes=30)))
    r = await get_ok(catalog.api, "/v1/audit/events?limit=1000&to=" + quote(local.isoformat()))
    assert [e["id"] for e in r.body["data"]] == model(catalog.rows, until=t5)


@pytest.mark.parametrize("limit", [1, 2, 3])
async def test_paging_collects_every_event_once_in_order(catalog: Fixture, limit: int) -> None:
    seen = await walk(catalog.api, "/v1/audit/events", limit)
    assert [e["id"] for e in seen] == [r["id"] for r in catalog.rows]
    # With a filter (several types: the merged branches) the cursor keeps to the filter.
    path = "/v1/audit/events?type=org.updated,api_key.created,auth.login.failed"
    filtered = await walk(catalog.api, path, limit)
    assert [e["id"] for e in filtered] == model(
        catalog.rows, types=["org.updated", "api_key.created", "auth.login.failed"])
    q = await walk(catalog.api, "/v1/audit/events?q=key", limit)
    assert [e["id"] for e in q] == model(catalog.rows, q="key")


async def test_paging_while_events_are_written_never_repeats_or_skips(
    project: Project, db: asyncpg.Pool
) -> None:
    api = await audit_key(project)
    now = datetime.now(UTC)
    await insert(db, [event(project.id, now - timedelta(seconds=30 * i), f"seed.{i % 3}")
                      for i in range(40)])
    before = [r["id"] for r in await stored(db, project.id)]
    first = await get_ok(api, "/v1/audit/events?limit=3")
    assert [e["id"] for e in first.body["data"]] == before[:3]
    stop = asyncio.Event()

    async def writer() -> int:
        n = 0
        while not stop.is_set():
            # New events, and late ones landing between pages already read and pages to come.
            late = now - timedelta(seconds=secrets.randbelow(30 * 40), microseconds=secrets.randbelow(10**6))
            await insert(db, [event(project.id, datetime.now(UTC), "live.new"),
                              event(project.id, late, "live.late")])
            if n % 5 == 0:
                made = await project.api.post("/v1/api-keys", {"prefix": "sk_test_", "name": "k",
                                                               "scopes": []})
                assert made.status == 201
            n += 1
            await asyncio.sleep(0)
        return n

    task = asyncio.create_task(writer())
    try:
        seen = list(first.body["data"])
        cursor = first.body["next_cursor"]
        while cursor:
            r = await get_ok(api, f"/v1/audit/events?limit=2&cursor={cursor}")
            seen += r.body["data"]
            cursor = r.body["next_cursor"]
    finally:
        stop.set()
        writes = await task
    assert writes > 3
    ids = [e["id"] for e in seen]
    assert len(ids) == len(set(ids)), "an event was listed twice"
    assert set(before) <= set(ids), "an event that existed at page 1 was skipped"
    keys = [(e["created_at"], e["id"]) for e in seen]
    assert keys == sorted(keys, reverse=True)
    # Nothing newer than page 1 sneaks in at the top.
    assert all(e["action"] != "live.new" for e in seen)


# --- cursors ----------------------------------------------------------------------------------


async def test_cursor_round_trip_is_signed_and_opaque(catalog: Fixture, db: asyncpg.Pool) -> None:
    r = await get_ok(catalog.api, "/v1/audit/events?limit=2")
    cursor = r.body["next_cursor"]
    mac = cursor.split(".")[1]
    assert len(base64.urlsafe_b64decode(mac + "==")) >= 16
    key = await secret(db)
    decoded = unpack(cursor)
    assert decoded[:2] == ["audit_events", catalog.project.id]
    assert sign(key, decoded) == cursor  # the documented format, nothing else


def _flip(text: str, index: int) -> str:
    c = text[index]
    return text[:index] + ("B" if c != "B" else "C") + text[index + 1:]


async def test_forged_or_modified_cursors_are_invalid_request(catalog: Fixture, db: asyncpg.Pool) -> None:
    r = await get_ok(catalog.api, "/v1/audit/events?limit=2")
    good = r.body["next_cursor"]
    payload, mac = good.split(".")
    values = unpack(good)
    # A key moved further down, the MAC kept: the listing would skip events if it were believed.
    moved = [*values[:2], iso(catalog.times["t8"]), values[3]]
    key = await secret(db)
    bad = [
        "garbage!!", "W10", "bm90LWpzb24", good + "x", good[:-1], payload, "." + mac,
        _flip(good, 3), _flip(good, len(good) - 3),
        f"{b64(orjson.dumps(moved))}.{mac}",
        sign(secrets.token_bytes(32), values),  # another deployment's secret
        sign(key[:16], values),
        sign(key, [*values, "extra"]),  # signed but malformed: still refused
        sign(key, [values[0], values[1], 5, values[3]]),
        sign(key, [values[0], values[1], "not a time", values[3]]),
        sign(key, [values[0], values[1], values[2], None]),
    ]
    for cursor in bad:
        for path in ("/v1/audit/events", "/v1/audit/events.csv", "/v1/audit/events.jsonl"):
            resp = await catalog.api.get(f"{path}?cursor={quote(cursor)}")
            assert_error(resp, 400, "invalid_request")
            assert resp.body["error"]["details"]["fields"][0]["field"] == "cursor", cursor
    assert (await catalog.api.get(f"/v1/audit/events?cursor={good}")).status == 200


async def test_foreign_cursors_are_invalid_request(catalog: Fixture, new_project: Callable[..., Any],
                                                   db: asyncpg.Pool) -> None:
    # Another listing's cursor, either way round.
    for i in range(2):
        assert (await catalog.project.api.post("/v1/api-keys", {"prefix": "sk_test_", "name": f"k{i}",
                                                                "scopes": []})).status == 201
    keys = await get_ok(catalog.project.api, "/v1/api-keys?limit=1")
    assert_error(await catalog.api.get(f"/v1/audit/events?cursor={keys.body['next_cursor']}"), 400,
                 "invalid_request")
    audit = await get_ok(catalog.api, "/v1/audit/events?limit=1")
    assert_error(await catalog.project.api.get(f"/v1/api-keys?cursor={audit.body['next_cursor']}"),
                 400, "invalid_request")
    # Another project's cursor, genuine there.
    other = await new_project("audit-cursor-other")
    await insert(db, [event(other.id, datetime.now(UTC) - timedelta(minutes=i)) for i in range(3)])
    theirs = await get_ok(other.api, "/v1/audit/events?limit=1")
    assert theirs.body["next_cursor"]
    for path in ("/v1/audit/events", "/v1/audit/events.csv", "/v1/audit/events.jsonl"):
        assert_error(await catalog.api.get(f"{path}?cursor={theirs.body['next_cursor']}"), 400,
                     "invalid_request")
    # Even with a valid signature, a payload naming another project is refused.
    values = unpack(audit.body["next_cursor"])
    forged = sign(await secret(db), [values[0], other.id, *values[2:]])
    assert_error(await catalog.api.get(f"/v1/audit/events?cursor={forged}"), 400, "invalid_request")


async def test_cursor_survives_a_restart_and_other_processes(
    catalog: Fixture, settings_factory: Callable[..., Any], http: Any
) -> None:
    """The secret lives in PostgreSQL: a second app (another process, or after a restart)
    accepts the cursors of the first."""
    from tests.fixtures.service import combined_app, serving

    first = await get_ok(catalog.api, "/v1/audit/events?limit=2")
    async with serving(http, combined_app(settings_factory())) as second:
        api = second.with_key(catalog.api.key)
        r = await get_ok(api, f"/v1/audit/events?limit=2&cursor={first.body['next_cursor']}")
        assert [e["id"] for e in r.body["data"]] == [x["id"] for x in catalog.rows[2:4]]


# --- validation and access --------------------------------------------------------------------


@pytest.mark.parametrize(("query", "field"), [
    ("from=yesterday", "from"), ("to=2026-13-01T00:00:00Z", "to"), ("from=12", "from"),
    ("to=2026-01-01T00:00:00%2B99:00", "to"), ("from=0001-01-01T00:00:00%2B01:00", "from"),
    ("from=2026-02-01T00:00:00Z&to=2026-01-01T00:00:00Z", "to"),
    ("limit=0", "limit"), ("limit=1001", "limit"), ("limit=abc", "limit"), ("limit=-1", "limit"),
    ("limit=%C2%B2", "limit"), ("limit=", "limit"),
    ("tpye=user.created", "tpye"), ("user_id=user_ann", "user_id"), ("before=2026-01-01", "before"),
    ("user=a&user=b", "user"), ("user=", "user"), ("actor=", "actor"), ("q=", "q"),
    ("type=", "type"), ("type=,,", "type"), ("q=a%00b", "q"), ("user=a%00", "user"),
    ("q=" + "x" * 201, "q"), ("actor=" + "k" * 257, "actor"),
    ("type=" + "t," * 512 + "t", "type"),  # 1,025 characters
])
async def test_bad_parameters_are_invalid_request_naming_the_field(catalog: Fixture, query: str,
                                                                   field: str) -> None:
    for path in ("/v1/audit/events", "/v1/audit/events.csv", "/v1/audit/events.jsonl"):
        if path != "/v1/audit/events" and field == "limit" and query == "limit=1001":
            continue  # exports take up to 100000
        r = await catalog.api.get(f"{path}?{query}")
        assert_error(r, 400, "invalid_request")
        assert field in [f["field"] for f in r.body["error"]["details"]["fields"]], (path, r.body)


async def test_type_takes_up_to_1024_characters_however_split(catalog: Fixture) -> None:
    """The cap is on the whole list: 50 names of 256 characters were allowed, which no request
    line (8,190 bytes) could carry, and the document said so."""
    for names in (["n" * 1024], [f"n{i}" for i in range(300)][:255], ["user.created"] * 100):
        value = ",".join(names)[:1024]
        r = await get_ok(catalog.api, f"/v1/audit/events?type={value}")
        assert r.status == 200


@pytest.mark.parametrize("query", ["limit=100001", "limit=0", "limit=x"])
async def test_export_limit_is_bounded_by_the_cap(catalog: Fixture, query: str) -> None:
    assert_error(await catalog.api.get(f"/v1/audit/events.csv?{query}"), 400, "invalid_request")


ENDPOINTS = ["/v1/audit/events", "/v1/audit/events.csv", "/v1/audit/events.jsonl",
             "/v1/audit/events/types", "/v1/audit-events"]


@pytest.mark.parametrize("path", ENDPOINTS)
async def test_scope_audit_read_is_required(project: Project, path: str) -> None:
    without = await audit_key(project, ["authz:check", "keys:write", "users:read"])
    r = await without.get(path)
    assert_error(r, 403, "insufficient_scope")
    assert r.body["error"]["details"]["required_scopes"] == ["audit:read"]
    assert_error(await project.api.get(path, key=None), 401, "missing_api_key")
    assert_error(await project.api.get(path, key="sk_test_" + "Z" * 43), 401, "invalid_api_key")
    assert (await (await audit_key(project)).get(path)).status == 200
    assert (await project.api.get(path)).status == 200  # full access


@pytest.mark.parametrize("path", ["/v1/audit/events/types", "/v1/audit-events"])
async def test_unknown_parameters_elsewhere_are_invalid_request(catalog: Fixture, path: str) -> None:
    assert_error(await catalog.api.get(f"{path}?type=x"), 400, "invalid_request")


async def test_a_project_never_sees_another_projects_events(catalog: Fixture, db: asyncpg.Pool) -> None:
    theirs = await db.fetch("SELECT id, action FROM audit_events WHERE project_id <> $1 "
                            "AND project_id IS NOT NULL", catalog.project.id)
    their_ids = {r["id"] for r in theirs}
    assert their_ids
    mine = {r["id"] for r in catalog.rows}
    listed = {e["id"] for e in await walk(catalog.api, "/v1/audit/events", 1000)}
    assert listed == mine
    # Filters that match the other project's look-alike rows still stay inside this one.
    for query in ("q=zebra", "actor=OPERATOR_X", "user=user_bob", "type=user.deleted", "q=removed"):
        r = await get_ok(catalog.api, f"/v1/audit/events?limit=1000&{query}")
        assert {e["id"] for e in r.body["data"]} <= mine
        csv_ids = {row[0] for row in csv_rows((await get_ok(catalog.api, f"/v1/audit/events.csv?{query}")).raw)[1:]}
        assert csv_ids <= mine and not csv_ids & their_ids
        lines = jsonl((await get_ok(catalog.api, f"/v1/audit/events.jsonl?{query}")).raw)
        assert {e["id"] for e in lines} <= mine
        legacy = await get_ok(catalog.api, "/v1/audit-events?limit=1000")
        assert {e["id"] for e in legacy.body["data"]} == mine
    exported = {row[0] for row in csv_rows((await get_ok(catalog.api, "/v1/audit/events.csv")).raw)[1:]}
    assert exported == mine
    assert {e["id"] for e in jsonl((await get_ok(catalog.api, "/v1/audit/events.jsonl")).raw)} == mine
    types = await get_ok(catalog.api, "/v1/audit/events/types")
    assert set(types.body["data"]) == {r["action"] for r in catalog.rows}


async def test_types_of_another_project_are_not_listed(project: Project, new_project: Callable[..., Any],
                                                       db: asyncpg.Pool) -> None:
    other = await new_project("types-other")
    now = datetime.now(UTC)
    await insert(db, [event(other.id, now, "secret.other.action"),
                      event(other.id, now, "shared.action"),
                      event(project.id, now - timedelta(days=40), "shared.action")])
    r = await get_ok(await audit_key(project), "/v1/audit/events/types")
    # Recent only in the other project: old here, so not listed here.
    assert "secret.other.action" not in r.body["data"] and "shared.action" not in r.body["data"]
    assert r.body["data"] == ["api_key.created", "dashboard_operator.bootstrapped"]
    assert "secret.other.action" in (await get_ok(other.api, "/v1/audit/events/types")).body["data"]


# --- CSV --------------------------------------------------------------------------------------


async def test_csv_columns_header_and_values(catalog: Fixture) -> None:
    r = await get_ok(catalog.api, "/v1/audit/events.csv")
    assert r.headers["Content-Type"] == "text/csv; charset=utf-8"
    assert re.fullmatch(
        rf'attachment; filename="audit-events-{catalog.project.id}-\d{{8}}T\d{{6}}Z\.csv"',
        r.headers["Content-Disposition"]), r.headers["Content-Disposition"]
    assert r.headers["X-Request-Id"].startswith("req_")
    assert "Service-Next-Cursor" not in r.headers and "Link" not in r.headers
    assert r.raw.startswith(CSV_HEADER.encode() + b"\r\n")
    rows = csv_rows(r.raw)
    assert rows[0] == CSV_HEADER.split(",")
    assert all(len(row) == 12 for row in rows)
    listing = (await get_ok(catalog.api, "/v1/audit/events?limit=1000")).body["data"]
    assert [row[0] for row in rows[1:]] == [e["id"] for e in listing]
    for row, e in zip(rows[1:], listing, strict=True):
        expected = [e[c] if e[c] is not None else "" for c in CSV_HEADER.split(",")]
        assert row == expected, (row, expected)


async def test_csv_follows_rfc_4180(project: Project, db: asyncpg.Pool) -> None:
    api = await audit_key(project)
    now = datetime.now(UTC)
    tricky = ['comma, inside', 'say "hi"', "two\nlines", "carriage\rreturn", "crlf\r\nend",
              '",\n"', "plain", "ünïcødé ✓"]
    await insert(db, [event(project.id, now - timedelta(seconds=i), "csv.tricky", description=d)
                      for i, d in enumerate(tricky)])
    r = await get_ok(api, "/v1/audit/events.csv?type=csv.tricky")
    text = r.raw.decode()
    # Every record ends in CRLF; a bare LF or CR only ever appears inside a quoted field.
    assert text.endswith("\r\n")
    assert '"comma, inside"' in text and '"say ""hi"""' in text and '"two\nlines"' in text
    assert '"carriage\rreturn"' in text and '"crlf\r\nend"' in text and '""",\n"""' in text
    assert ",plain\r\n" in text
    rows = csv_rows(r.raw)
    assert [row[11] for row in rows[1:]] == tricky
    # Outside quotes, the only line breaks are record terminators.
    unquoted = re.sub(r'"(?:[^"]|"")*"', "", text)
    assert "\n" not in unquoted.replace("\r\n", "") and "\r" not in unquoted.replace("\r\n", "")
    assert unquoted.count("\r\n") == len(tricky) + 1


@pytest.mark.parametrize("lead", ["=", "+", "-", "@", "\t", "\r"])
async def test_csv_neutralises_formulas(project: Project, db: asyncpg.Pool, lead: str) -> None:
    api = await audit_key(project)
    payload = lead + "HYPERLINK(\"http://evil.example\")"
    row = event(project.id, datetime.now(UTC), "csv.formula", actor_id=payload, user_id=payload,
                target_id=payload, description=payload, user_agent=payload, ip=lead + "1")
    safe = event(project.id, datetime.now(UTC) - timedelta(seconds=1), "csv.formula",
                 description="a-b=c+d@e", user_agent="x\t=y")
    await insert(db, [row, safe])
    r = await get_ok(api, "/v1/audit/events.csv?type=csv.formula")
    rows = csv_rows(r.raw)
    got = dict(zip(rows[0], rows[1], strict=True))
    for column in ("actor_id", "user_id", "target_id", "description", "user_agent"):
        assert got[column] == "'" + payload, (column, got[column])
    assert got["ip"] == "'" + lead + "1"
    assert got["action"] == "csv.formula" and got["id"] == row[0]
    # Only a leading character counts, and JSON keeps the values as they are.
    calm = dict(zip(rows[0], rows[2], strict=True))
    assert calm["description"] == "a-b=c+d@e" and calm["user_agent"] == "x\t=y"
    listing = await get_ok(api, "/v1/audit/events?type=csv.formula")
    assert listing.body["data"][0]["description"] == payload
    lines = jsonl((await get_ok(api, "/v1/audit/events.jsonl?type=csv.formula")).raw)
    assert lines[0]["actor_id"] == payload


# --- JSONL ------------------------------------------------------------------------------------


async def test_jsonl_lines_are_full_events(catalog: Fixture) -> None:
    r = await get_ok(catalog.api, "/v1/audit/events.jsonl")
    assert r.headers["Content-Type"] == "application/x-ndjson"
    assert re.fullmatch(
        rf'attachment; filename="audit-events-{catalog.project.id}-\d{{8}}T\d{{6}}Z\.jsonl"',
        r.headers["Content-Disposition"])
    lines = jsonl(r.raw)
    listing = (await get_ok(catalog.api, "/v1/audit/events?limit=1000")).body["data"]
    assert lines == listing
    assert all(set(e) == EVENT_FIELDS for e in lines)
    deleted = next(e for e in lines if e["action"] == "user.deleted")
    assert deleted["metadata"] == {"description": "Removed the QUARTERLY report"}
    assert deleted["description"] == "Removed the QUARTERLY report"
    assert next(e for e in lines if e["action"] == "api_key.revoked")["metadata"]["description"]


@pytest.mark.parametrize(("fmt", "query"), [("csv", ""), ("jsonl", ""), ("csv", "&q=key"),
                                            ("jsonl", "&type=org.updated,auth.login.failed")])
async def test_export_continuation_with_a_small_limit(catalog: Fixture, fmt: str, query: str) -> None:
    """``limit`` lowers the cap; the continuation works the same as at 100,000."""
    ids: list[str] = []
    path: str | None = f"/v1/audit/events.{fmt}?limit=3{query}"
    pages = 0
    while path:
        r = await get_ok(catalog.api, path)
        got = [row[0] for row in csv_rows(r.raw)[1:]] if fmt == "csv" else [e["id"] for e in jsonl(r.raw)]
        assert len(got) <= 3
        ids += got
        pages += 1
        nxt = r.headers.get("Service-Next-Cursor")
        if nxt is None:
            assert "Link" not in r.headers
            path = None
        else:
            assert len(got) == 3
            link = re.fullmatch(r"<([^>]+)>; rel=\"next\"", r.headers["Link"])
            assert link, r.headers["Link"]
            assert f"cursor={nxt}" in link.group(1) and link.group(1).startswith(f"/v1/audit/events.{fmt}?")
            path = link.group(1)
    assert len(ids) == len(set(ids))
    args: dict[str, Any] = {}
    if "q=" in query:
        args["q"] = "key"
    if "type=" in query:
        args["types"] = ["org.updated", "auth.login.failed"]
    assert ids == model(catalog.rows, **args)
    assert pages == max(1, -(-len(ids) // 3))  # no empty last request when it divides evenly


async def test_export_cap_is_100000_rows_then_a_cursor(project: Project, db: asyncpg.Pool) -> None:
    api = await audit_key(project)
    start = datetime.now(UTC) - timedelta(hours=1)
    # Several events per microsecond-distinct timestamp group, so ties cross the cap too.
    rows = [event(project.id, start - timedelta(microseconds=(i // 3) * 7), f"bulk.{i % 4}",
                  description=f"bulk {i}") for i in range(100_050)]
    await insert(db, rows)
    everything = [r["id"] for r in await db.fetch(
        "SELECT id FROM audit_events WHERE project_id = $1 ORDER BY created_at DESC, id DESC",
        project.id)]
    assert len(everything) == 100_050 + 3  # the bootstrap's two events and the key created

    r = await get_ok(api, "/v1/audit/events.csv")
    got = csv_rows(r.raw)
    assert got[0] == CSV_HEADER.split(",")
    assert len(got) - 1 == 100_000
    assert [row[0] for row in got[1:]] == everything[:100_000]
    nxt = r.headers["Service-Next-Cursor"]
    assert r.headers["Link"] == f'</v1/audit/events.csv?cursor={nxt}>; rel="next"'

    rest = await get_ok(api, f"/v1/audit/events.csv?cursor={nxt}")
    tail = csv_rows(rest.raw)
    assert [row[0] for row in tail[1:]] == everything[100_000:]
    assert len(tail) - 1 == 53
    assert "Service-Next-Cursor" not in rest.headers and "Link" not in rest.headers

    # JSONL, and the JSON listing's cursor agreeing with the export's.
    j = await get_ok(api, "/v1/audit/events.jsonl?type=bulk.1,bulk.2")
    lines = jsonl(j.raw)
    expected = [r["id"] for r in await db.fetch(
        "SELECT id FROM audit_events WHERE project_id = $1 AND action IN ('bulk.1', 'bulk.2') "
        "ORDER BY created_at DESC, id DESC", project.id)]
    assert [e["id"] for e in lines] == expected and len(expected) == 50_025
    assert "Service-Next-Cursor" not in j.headers
    page = await get_ok(api, f"/v1/audit/events?limit=2&cursor={nxt}")
    assert [e["id"] for e in page.body["data"]] == everything[100_000:100_002]

    # Clients that leave mid-export give their database connection back (the pool holds 5).
    for _ in range(8):
        async with api.session.get(f"{api.base_url}/v1/audit/events.jsonl",
                                   headers={"Authorization": f"Bearer {api.key}"}) as resp:
            assert resp.status == 200
            assert len(await resp.content.readexactly(64 * 1024)) == 64 * 1024
            resp.close()
    for _ in range(3):
        assert (await asyncio.wait_for(api.get("/v1/audit/events?limit=1"), 10)).status == 200


async def test_export_of_an_empty_selection(catalog: Fixture) -> None:
    r = await get_ok(catalog.api, "/v1/audit/events.csv?type=nothing.here")
    assert r.raw == CSV_HEADER.encode() + b"\r\n"
    j = await get_ok(catalog.api, "/v1/audit/events.jsonl?type=nothing.here")
    assert j.raw == b""


# --- types ------------------------------------------------------------------------------------


async def test_types_lists_actions_of_the_last_30_days_sorted(project: Project, db: asyncpg.Pool) -> None:
    api = await audit_key(project)
    now = datetime.now(UTC)
    await insert(db, [
        event(project.id, now - timedelta(days=29, hours=23), "zeta.recent"),
        event(project.id, now - timedelta(days=31), "alpha.old"),
        event(project.id, now - timedelta(days=45), "alpha.old"),
        event(project.id, now - timedelta(days=40), "mixed.action"),
        event(project.id, now - timedelta(days=1), "mixed.action"),
        event(project.id, now - timedelta(minutes=1), "Beta.Upper"),
    ])
    r = await get_ok(api, "/v1/audit/events/types")
    assert set(r.body) == {"data", "request_id"}
    assert r.body["data"] == sorted(["zeta.recent", "mixed.action", "Beta.Upper",
                                     "dashboard_operator.bootstrapped", "api_key.created"])
    assert "alpha.old" not in r.body["data"]


# --- legacy -----------------------------------------------------------------------------------


async def test_legacy_listing_with_before_and_action_prefix(catalog: Fixture) -> None:
    r = await get_ok(catalog.api, "/v1/audit-events")
    assert set(r.body) == {"data", "next_before", "has_more", "request_id"}
    assert [e["id"] for e in r.body["data"]] == [x["id"] for x in catalog.rows]
    assert r.body["has_more"] is False and r.body["next_before"] is None
    assert all(set(e) == EVENT_FIELDS for e in r.body["data"])

    t5 = catalog.times["t5"]
    r = await get_ok(catalog.api, f"/v1/audit-events?before={iso(t5)}")
    assert [e["id"] for e in r.body["data"]] == model(catalog.rows, until=t5)  # strictly older
    r = await get_ok(catalog.api, "/v1/audit-events?action_prefix=auth.")
    assert [e["id"] for e in r.body["data"]] == [x["id"] for x in catalog.rows
                                                 if x["action"].startswith("auth.")]
    assert r.body["data"]
    r = await get_ok(catalog.api, f"/v1/audit-events?action_prefix=api_key.&before={iso(catalog.times['t0'])}")
    assert [e["action"] for e in r.body["data"]] == ["api_key.revoked"]


async def test_legacy_action_prefix_wildcards_are_literal(project: Project, db: asyncpg.Pool) -> None:
    api = await audit_key(project)
    now = datetime.now(UTC)
    await insert(db, [event(project.id, now - timedelta(seconds=1), "100%_done.x"),
                      event(project.id, now - timedelta(seconds=2), "100ab_done.y"),
                      event(project.id, now - timedelta(seconds=3), "1000_done.z"),
                      event(project.id, now - timedelta(seconds=4), "a\\b.w")])
    for prefix, expected in (("100%", ["100%_done.x"]), ("100%_", ["100%_done.x"]),
                             ("100_", []), ("1000_", ["1000_done.z"]), ("%", []), ("_", []),
                             ("a\\", ["a\\b.w"]), ("100", ["100%_done.x", "100ab_done.y", "1000_done.z"])):
        r = await get_ok(api, f"/v1/audit-events?action_prefix={quote(prefix)}")
        assert [e["action"] for e in r.body["data"]] == expected, prefix


async def test_legacy_paging_by_before_never_splits_a_timestamp(project: Project, db: asyncpg.Pool) -> None:
    api = await audit_key(project)
    now = datetime.now(UTC).replace(microsecond=0)
    # Groups of events that share a timestamp (as one transaction's events do).
    rows = [event(project.id, now - timedelta(seconds=s), f"group.{s}") for s in (1, 2, 2, 2, 3, 4, 4)]
    await insert(db, rows)
    expected = [r["id"] for r in await stored(db, project.id)]
    for limit in (1, 2, 3):
        seen: list[str] = []
        before: str | None = None
        for _ in range(50):
            r = await get_ok(api, f"/v1/audit-events?limit={limit}" + (f"&before={before}" if before else ""))
            page = r.body["data"]
            assert page
            stamps = [e["created_at"] for e in page]
            seen += [e["id"] for e in page]
            if not r.body["has_more"]:
                assert r.body["next_before"] is None
                break
            before = r.body["next_before"]
            assert before == stamps[-1]
            assert len(page) <= limit or len(set(stamps)) == 1
        assert seen == expected, limit
    # A group larger than the page comes whole.
    r = await get_ok(api, "/v1/audit-events?limit=1&action_prefix=group.2")
    assert len(r.body["data"]) == 3 and r.body["has_more"] is False


@pytest.mark.parametrize("query", ["before=soon", "limit=0", "limit=1001", "cursor=x",
                                   "action_prefix=a&action_prefix=b", "action_prefix=a%00"])
async def test_legacy_bad_parameters_are_invalid_request(catalog: Fixture, query: str) -> None:
    assert_error(await catalog.api.get(f"/v1/audit-events?{query}"), 400, "invalid_request")


async def test_legacy_empty_parameters_are_ignored(catalog: Fixture) -> None:
    r = await get_ok(catalog.api, "/v1/audit-events?before=&action_prefix=")
    assert [e["id"] for e in r.body["data"]] == [x["id"] for x in catalog.rows]


# --- the indexes ------------------------------------------------------------------------------


async def test_search_expression_is_the_trigram_index(db: asyncpg.Pool) -> None:
    """``q`` uses the indexed expression verbatim: with sequential scans off, the planner can
    only satisfy it through the trigram index (a drifted expression would show a Seq Scan)."""
    from control_plane.audit.repository import SEARCH_EXPR, Filters, build_query

    sql, _ = build_query("e.id", "proj_x", Filters(q="zebra"), limit=10)
    assert f"{SEARCH_EXPR} LIKE lower($2)" in sql
    async with db.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(r[0] for r in await conn.fetch(
            f"EXPLAIN SELECT e.id FROM audit_events e WHERE {SEARCH_EXPR} LIKE lower($1)", "%zebra%"))
        names = {r["relname"] for r in await conn.fetch(
            """SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
               WHERE i.inhparent = 'audit_events_search'::regclass""")}
    assert names
    used = set(re.findall(r"Bitmap Index Scan on (\S+)", plan))
    assert used and used <= names, plan
    assert "Seq Scan" not in plan, plan


@pytest.mark.parametrize(("filters", "index"), [
    ({"types": ("a.b",)}, "audit_events_project_action"),
    ({"user": "user_x"}, "audit_events_project_user"),
    ({"actor": "key_x"}, "audit_events_project_actor"),
])
async def test_filters_have_their_index(db: asyncpg.Pool, filters: dict[str, Any], index: str) -> None:
    from control_plane.audit.repository import Filters, build_query

    sql, args = build_query("e.id", "proj_x", Filters(**filters), limit=10)
    async with db.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        await conn.execute("SET LOCAL enable_bitmapscan = off")
        plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN {sql}", *args))
        names = {r["relname"] for r in await conn.fetch(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = $1::regclass", index)}
    used = set(re.findall(r"Index (?:Only )?Scan (?:Backward )?using (\S+)", plan))
    assert used and used <= names, plan
    assert "Sort" not in plan.replace("Sort Key", ""), plan


async def test_cursor_secret_is_made_once_whoever_starts_first(database_url: str) -> None:
    """A fresh deployment: processes starting together create one secret and all read it."""
    from urllib.parse import urlsplit, urlunsplit

    from control_plane.migrate import upgrade
    from control_plane.web.pagination import load_cursor_secret

    name = f"authio_secret_{secrets.token_hex(4)}"
    admin_url = urlunsplit(urlsplit(database_url)._replace(path="/postgres"))
    url = urlunsplit(urlsplit(database_url)._replace(path="/" + name))
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        await asyncio.to_thread(upgrade, url)
        pools = [await asyncpg.create_pool(url, min_size=1, max_size=1) for _ in range(6)]
        try:
            found = await asyncio.gather(*(load_cursor_secret(p) for p in pools))
            assert len(set(found)) == 1 and len(found[0]) == 32
            assert await pools[0].fetchval("SELECT count(*) FROM service_secrets") == 1
            assert await load_cursor_secret(pools[0]) == found[0]  # a restart reads it back
        finally:
            for p in pools:
                await p.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
