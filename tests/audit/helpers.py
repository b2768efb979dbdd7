"""Helpers of the audit-log read tests: rows written straight into ``audit_events`` with
controlled values, a catalog of them exercising each filter, and the model of SPEC.md 4's filter
rules the answers are checked against."""

from __future__ import annotations

import base64
import csv
import hashlib
import hmac
import io
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode

import asyncpg
import orjson

from common.ids import new_id
from tests.fixtures.service import Api, Project, Response

ULID = r"[0-9a-hjkmnp-tv-z]{26}"
TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"
EVENT_FIELDS = {"id", "created_at", "action", "actor_type", "actor_id", "user_id", "project_id",
                "target_type", "target_id", "ip", "user_agent", "description", "metadata"}
CSV_HEADER = ("id,created_at,action,actor_type,actor_id,user_id,project_id,target_type,target_id,"
              "ip,user_agent,description")
COLUMNS = ("id", "created_at", "action", "actor_type", "actor_id", "user_id", "project_id",
           "target_type", "target_id", "ip", "user_agent", "description", "api_key_id", "metadata")


# --- helpers ----------------------------------------------------------------------------------


def iso(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event(project_id: str, created_at: datetime, action: str = "test.event", *,
          actor_id: str | None = "key_actor", user_id: str | None = None,
          target_id: str | None = None, description: str | None = "an event",
          metadata: dict[str, Any] | None = None, meta_description: bool = True,
          user_agent: str | None = "tests/audit-read", ip: str | None = "127.0.0.1") -> tuple[Any, ...]:
    """One audit_events row in COLUMNS order (metadata as JSON text)."""
    meta = dict(metadata or {})
    if description is not None and meta_description:
        meta.setdefault("description", description)
    return (new_id("evt"), created_at, action, "api_key", actor_id, user_id, project_id, "thing",
            target_id, ip, user_agent, description, actor_id, orjson.dumps(meta).decode())


async def insert(db: asyncpg.Pool, rows: Iterable[tuple[Any, ...]]) -> None:
    await db.copy_records_to_table("audit_events", records=list(rows), columns=COLUMNS)


async def stored(db: asyncpg.Pool, project_id: str) -> list[dict[str, Any]]:
    """The project's events as stored, newest first (the listing order)."""
    rows = await db.fetch("SELECT * FROM audit_events WHERE project_id = $1 "
                          "ORDER BY created_at DESC, id DESC", project_id)
    out = []
    for r in rows:
        d = dict(r)
        d["metadata"] = orjson.loads(d["metadata"])
        out.append(d)
    return out


async def audit_key(project: Project, scopes: list[str] | None = None) -> Api:
    r = await project.api.post("/v1/api-keys", {"prefix": "sk_test_", "name": "auditor",
                                                "scopes": ["audit:read"] if scopes is None else scopes})
    assert r.status == 201, r.body
    return project.api.with_key(r.body["secret"])


async def get_ok(api: Api, path: str) -> Response:
    r = await api.get(path)
    assert r.status == 200, (path, r.status, r.body if r.body is not None else r.raw[:500])
    return r


async def walk(api: Api, path: str, limit: int) -> list[dict[str, Any]]:
    """Every event of a listing, page by page."""
    sep = "&" if "?" in path else "?"
    seen: list[dict[str, Any]] = []
    cursor = None
    for _ in range(10_000):
        r = await get_ok(api, f"{path}{sep}limit={limit}" + (f"&cursor={cursor}" if cursor else ""))
        assert len(r.body["data"]) <= limit
        seen += r.body["data"]
        if not r.body["has_more"]:
            assert r.body["next_cursor"] is None
            return seen
        assert len(r.body["data"]) == limit
        cursor = r.body["next_cursor"]
        assert isinstance(cursor, str) and cursor
    raise AssertionError("listing did not end")


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


async def secret(db: asyncpg.Pool) -> bytes:
    value = await db.fetchval("SELECT value FROM service_secrets WHERE name = 'cursor_hmac'")
    assert isinstance(value, bytes) and len(value) >= 32
    return value


def sign(key: bytes, values: list[Any]) -> str:
    """A cursor in the documented format, signed with ``key``."""
    payload = orjson.dumps(values)
    mac = hmac.new(key, b"authio/cursor/v1\x00" + payload, hashlib.sha256).digest()[:16]
    return f"{b64(payload)}.{b64(mac)}"


def unpack(cursor: str) -> Any:
    payload = cursor.split(".")[0]
    return orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def csv_rows(raw: bytes) -> list[list[str]]:
    text = raw.decode("utf-8")
    return list(csv.reader(io.StringIO(text, newline="")))


def jsonl(raw: bytes) -> list[dict[str, Any]]:
    text = raw.decode("utf-8")
    assert text == "" or text.endswith("\n")
    return [orjson.loads(line) for line in text.split("\n")[:-1]]


# --- a project with controlled events ---------------------------------------------------------


class Fixture:
    def __init__(self, project: Project, api: Api, rows: list[dict[str, Any]],
                 times: dict[str, datetime]) -> None:
        self.project, self.api, self.rows, self.times = project, api, rows, times


async def make_catalog(project: Project, db: asyncpg.Pool) -> Fixture:
    """Bootstrap events, one real key creation and revocation, and hand-made rows whose values
    exercise each filter; a second project holds look-alike rows that must never show."""
    api = await audit_key(project)
    made = await project.api.post("/v1/api-keys", {"prefix": "sk_test_", "name": "Deploy bot",
                                                   "scopes": ["authz:check"]})
    assert made.status == 201
    assert (await project.api.delete(f"/v1/api-keys/{made.body['id']}")).status == 200
    base = datetime.now(UTC).replace(microsecond=123456) - timedelta(hours=3)
    t = {f"t{i}": base - timedelta(minutes=7 * i) for i in range(12)}
    p = project.id
    rows = [
        event(p, t["t0"], "api_key.created", actor_id="key_alpha", user_id="user_ann",
              target_id="key_t1", description="Created API key 'Deploy'"),
        event(p, t["t1"], "api_key.revoked", actor_id="key_alpha", user_id="user_bob",
              target_id="key_t1", description="Revoked API key"),
        event(p, t["t2"], "user.created", actor_id="key_beta", user_id="user_ann",
              target_id="user_ann", description="Signed up as Zebra"),
        event(p, t["t3"], "user.deleted", actor_id="OPERATOR_X", user_id=None,
              target_id="user_cat", description=None,
              metadata={"description": "Removed the QUARTERLY report"}),
        event(p, t["t4"], "session.created", actor_id=None, user_id="user_bob",
              target_id="sess_9", description="100% of go_kart laps"),
        event(p, t["t5"], "auth.login.failed", actor_id="key_beta", user_id="user_ann",
              target_id="TGT_Mixed", description="Login failed from 10.0.0.1"),
        event(p, t["t6"], "auth.login.failed", actor_id="key_beta", user_id="user_cat",
              target_id="tgt_other", description="goXkart bookkeeping"),
        # Two events sharing a timestamp (one transaction): the id breaks the tie.
        event(p, t["t7"], "org.updated", actor_id="key_alpha", user_id="user_cat",
              target_id="org_1", description="Renamed"),
        event(p, t["t7"], "org.updated", actor_id="key_alpha", user_id="user_cat",
              target_id="org_2", description="Renamed again"),
        event(p, t["t8"], "webhook.created", actor_id="key_gamma", user_id=None,
              target_id="whep_1", description="Created webhook for https://x.example/?a=1,b=2"),
    ]
    await insert(db, rows)
    other = await bootstrap_other(project, db, base)
    assert other
    return Fixture(project, api, await stored(db, p), t)


async def bootstrap_other(project: Project, db: asyncpg.Pool, base: datetime) -> str:
    from tests.fixtures.service import bootstrap_project

    other = await bootstrap_project(project.api.with_key(None), "audit-other")
    await insert(db, [
        event(other.id, base - timedelta(minutes=5), "api_key.created", actor_id="key_alpha",
              user_id="user_ann", target_id="key_t1", description="Zebra QUARTERLY go_kart"),
        event(other.id, base, "user.deleted", actor_id="OPERATOR_X", user_id="user_bob",
              target_id="TGT_Mixed", description="Removed"),
    ])
    return other.id


def _text(row: dict[str, Any]) -> str:
    desc = row["metadata"].get("description") or ""
    return "\x1f".join([row["action"], row["actor_id"] or "", row["target_id"] or "", desc]).lower()


def model(rows: list[dict[str, Any]], *, types: Iterable[str] | None = None, user: str | None = None,
          actor: str | None = None, since: datetime | None = None, until: datetime | None = None,
          q: str | None = None) -> list[str]:
    """The ids the listing must return, in order, by the rules of SPEC.md 4."""
    wanted = set(types) if types is not None else None
    return [
        r["id"] for r in rows
        if (wanted is None or r["action"] in wanted)
        and (user is None or r["user_id"] == user)
        and (actor is None or r["actor_id"] == actor)
        and (since is None or r["created_at"] >= since)
        and (until is None or r["created_at"] < until)
        and (q is None or q.lower() in _text(r))
    ]


# (query string, model arguments); times are names in Fixture.times.
FILTER_CASES: list[tuple[dict[str, str], dict[str, Any]]] = [
    ({}, {}),
    ({"type": "api_key.created"}, {"types": ["api_key.created"]}),
    ({"type": "auth.login.failed"}, {"types": ["auth.login.failed"]}),
    ({"type": "api_key.created,user.deleted"}, {"types": ["api_key.created", "user.deleted"]}),
    ({"type": " org.updated , ,webhook.created,org.updated"}, {"types": ["org.updated", "webhook.created"]}),
    ({"type": "api_key"}, {"types": ["api_key"]}),  # exact, not a prefix
    ({"type": "no.such.action"}, {"types": ["no.such.action"]}),
    ({"user": "user_ann"}, {"user": "user_ann"}),
    ({"user": "user_cat"}, {"user": "user_cat"}),
    ({"user": "USER_ANN"}, {"user": "USER_ANN"}),  # exact: case matters
    ({"actor": "key_alpha"}, {"actor": "key_alpha"}),
    ({"actor": "bootstrap_token"}, {"actor": "bootstrap_token"}),
    ({"from": "@t5"}, {"since": "t5"}),
    ({"to": "@t5"}, {"until": "t5"}),
    ({"from": "@t7", "to": "@t2"}, {"since": "t7", "until": "t2"}),
    ({"from": "@t3", "to": "@t3"}, {"since": "t3", "until": "t3"}),
    ({"q": "created"}, {"q": "created"}),  # action
    ({"q": "operator_x"}, {"q": "operator_x"}),  # actor_id, other case
    ({"q": "tgt_mixed"}, {"q": "tgt_mixed"}),  # target_id, other case
    ({"q": "Quarterly"}, {"q": "Quarterly"}),  # metadata description only
    ({"q": "ZEBRA"}, {"q": "ZEBRA"}),
    ({"q": "go_kart"}, {"q": "go_kart"}),  # '_' is literal: not goXkart
    ({"q": "o_k"}, {"q": "o_k"}),  # short, literal '_'
    ({"q": "0%"}, {"q": "0%"}),  # short, literal '%'
    ({"q": "100% of"}, {"q": "100% of"}),
    ({"q": "x"}, {"q": "x"}),
    ({"q": "no such text anywhere"}, {"q": "no such text anywhere"}),
    ({"q": "'deploy'"}, {"q": "'deploy'"}),
    ({"type": "auth.login.failed", "user": "user_ann"},
     {"types": ["auth.login.failed"], "user": "user_ann"}),
    ({"type": "org.updated,api_key.created", "actor": "key_alpha"},
     {"types": ["org.updated", "api_key.created"], "actor": "key_alpha"}),
    ({"user": "user_ann", "actor": "key_beta", "from": "@t5"},
     {"user": "user_ann", "actor": "key_beta", "since": "t5"}),
    ({"q": "key", "to": "@t0"}, {"q": "key", "until": "t0"}),
    ({"q": "kart", "type": "session.created,auth.login.failed"},
     {"q": "kart", "types": ["session.created", "auth.login.failed"]}),
    ({"type": "org.updated,user.created,api_key.revoked", "user": "user_cat", "actor": "key_alpha",
      "from": "@t8", "to": "@t0", "q": "renamed"},
     {"types": ["org.updated", "user.created", "api_key.revoked"], "user": "user_cat",
      "actor": "key_alpha", "since": "t8", "until": "t0", "q": "renamed"}),
]


def resolve(fx: Fixture, query: dict[str, str], args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    q = {k: (iso(fx.times[v[1:]]) if v.startswith("@") else v) for k, v in query.items()}
    a = {k: (fx.times[v] if k in ("since", "until") else v) for k, v in args.items()}
    return urlencode(q, quote_via=quote), a
