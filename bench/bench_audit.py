"""Audit-log read side at scale: bulk-load millions of events, time first pages and exports.

    python bench/bench_audit.py [--events 10000000] [--months 6] [--database-url URL]
                                [--keep-db NAME] [--reuse-db NAME] [--json]

Issue 3, section 1: "first page p99 under 50 ms for each filter on its own; export at
>= 100,000 rows/s; the process's memory flat during an export", at 10 million events in a project.

1. A scratch database ``authio_bench_audit_<hex>`` (or ``--keep-db NAME``) on the server of
   ``--database-url`` (default ``$DATABASE_URL`` or the local PostgreSQL), migrated to head; the
   monthly partitions covering the span are made with ``manage_partitions``; one big project that
   holds the ``--events`` events, two small ones (``--other-events`` each, interleaved in time,
   for isolation realism) and an ``audit:read`` API key row per project.
2. Events are generated deterministically (``random.Random``, seeded per chunk of
   ``--chunk-rows``, so worker count and scheduling do not change the data) and streamed with
   ``COPY ... FROM STDIN`` (text format) by ``--workers`` processes, each with its own
   connection. Time is split into one slice per chunk, so each partition is filled roughly in
   time order, as an append-only log is. The audit table's secondary indexes are dropped for the
   load and rebuilt from their own definitions afterwards (same end state, much faster; time
   reported apart; ``--load-with-indexes`` keeps them), then ``VACUUM (ANALYZE)``.
3. The control plane runs as a subprocess (``authio serve control-plane``, ``OTEL_EXPORTER=none``
   unless ``--otel-exporter``) so its memory is its own: VmRSS from ``/proc/<pid>/status`` every
   50 ms during an export, and VmHWM after ``clear_refs`` for the exact peak.
4. First pages (limit 50) for each filter on its own, ``--requests`` each (at least 50), values
   varied among a few candidates, every answer checked against its filter, order and project;
   the first request per value is reported apart as "cold". Two rows ask as a small project, and
   one stress row (``q_common_none``: common words, no match) goes beyond the issue's list.
   Then ``--export-repeats`` rounds of a full 100,000-row export and of its continuation through
   the ``Service-Next-Cursor`` header, as CSV and as JSONL (rows counted by parsing; median and
   range reported). Then ``EXPLAIN (ANALYZE, BUFFERS)`` of each filter's first-page query and of
   the export's two queries, built by ``control_plane.audit.repository.build_query`` itself.
5. A table (or ``--json``, which also holds every plan's text); the scratch database is dropped
   unless ``--keep-db`` or ``--reuse-db`` named it. ``--reuse-db NAME`` skips creating and
   loading (the load parameters are read back from the database's ``bench_audit_meta`` table).
   ``--db-setting name=value`` runs ``ALTER DATABASE <scratch> SET`` for the timing part (reset
   afterwards): planner settings can be tried end to end without touching the shared server.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures as cf
import contextlib
import csv
import ctypes
import io
import itertools
import json
import math
import multiprocessing as mp
import os
import random
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode, urlsplit, urlunsplit

import asyncpg
import orjson

ROOT: Final = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.auth import generate_secret, hash_secret  # noqa: E402
from control_plane.audit.tasks import manage_partitions, retention_cutoff  # noqa: E402

DEFAULT_PG: Final = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS: Final = "redis://127.0.0.1:6379/0"
PAGE_LIMIT: Final = 50
EXPORT_CAP: Final = 100_000
CSV_COLUMNS: Final = ("id,created_at,action,actor_type,actor_id,user_id,project_id,target_type,target_id,"
                      "ip,user_agent,description").split(",")
TARGET_PAGE_P99_MS: Final = 50.0
TARGET_EXPORT_ROWS_S: Final = 100_000
TARGET_FLAT_MB: Final = 50.0
COPY_COLUMNS: Final = ("id", "created_at", "action", "actor_type", "actor_id", "user_id", "project_id",
                       "target_type", "target_id", "ip", "user_agent", "description", "api_key_id",
                       "metadata")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the event mix

# action, weight, actor mix (api key, admin user, operator, system), target type, P(user_id set)
ACTIONS: Final[tuple[tuple[str, int, tuple[int, int, int, int], str | None, float], ...]] = (
    ("auth.signin_attempt", 4200, (100, 0, 0, 0), "user", 0.97),
    ("session.refreshed", 1200, (100, 0, 0, 0), "session", 1.0),
    ("auth.magic_link.sent", 700, (100, 0, 0, 0), "user", 0.9),
    ("auth.magic_link.verified", 550, (100, 0, 0, 0), "user", 1.0),
    ("session.created", 500, (100, 0, 0, 0), "session", 1.0),
    ("auth.passkey.verified", 400, (100, 0, 0, 0), "user", 1.0),
    ("tuples.written", 400, (95, 5, 0, 0), "store", 0.0),
    ("auth.signout", 300, (100, 0, 0, 0), "session", 1.0),
    ("user.created", 300, (60, 40, 0, 0), "user", 1.0),
    ("session.org_selected", 250, (100, 0, 0, 0), "organization", 1.0),
    ("session.org_switched", 200, (100, 0, 0, 0), "organization", 1.0),
    ("membership.created", 200, (30, 70, 0, 0), "membership", 1.0),
    ("user.updated", 180, (60, 40, 0, 0), "user", 1.0),
    ("session.revoked", 150, (60, 30, 0, 10), "session", 1.0),
    ("auth.step_up.challenged", 120, (100, 0, 0, 0), "user", 1.0),
    ("auth.step_up.verified", 90, (100, 0, 0, 0), "user", 1.0),
    ("invitation.created", 90, (30, 70, 0, 0), "invitation", 0.0),
    ("membership.updated", 80, (30, 70, 0, 0), "membership", 1.0),
    ("invitation.accepted", 60, (40, 60, 0, 0), "invitation", 1.0),
    ("organization.updated", 50, (30, 70, 0, 0), "organization", 0.0),
    ("organization.created", 40, (40, 60, 0, 0), "organization", 0.0),
    ("membership.deleted", 40, (30, 70, 0, 0), "membership", 1.0),
    ("user.deleted", 20, (50, 40, 10, 0), "user", 0.5),
    ("api_key.created", 8, (0, 80, 20, 0), "api_key", 0.0),
    ("store.created", 6, (90, 10, 0, 0), "store", 0.0),
    ("organization.deleted", 5, (20, 80, 0, 0), "organization", 0.0),
    ("api_key.revoked", 4, (0, 70, 30, 0), "api_key", 0.0),
    ("compliance.dsr.created", 3, (20, 40, 40, 0), "dsr", 0.8),
    ("compliance.dsr.fulfilled", 2, (0, 40, 60, 0), "dsr", 0.5),
    ("webhook.endpoint.created", 2, (0, 100, 0, 0), "webhook", 0.0),
    ("risk.policy.updated", 1, (0, 60, 40, 0), "project", 0.0),
)
ACTION_NAMES: Final = tuple(a[0] for a in ACTIONS)
_ACTION_CUM: Final = tuple(sum(a[1] for a in ACTIONS[: i + 1]) for i in range(len(ACTIONS)))
_TARGET_PREFIX: Final = {"session": "sess", "membership": "mem", "invitation": "inv", "dsr": "dsr",
                         "webhook": "whep"}

# (user agent, browser, os)
USER_AGENTS: Final = (
    ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/124.0.0.0 Safari/537.36", "Chrome", "macOS"),
    ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/124.0.0.0 Safari/537.36", "Chrome", "Windows"),
    ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/124.0.0.0 Safari/537.36 Edg/124.0.0.0", "Edge", "Windows"),
    ("Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4) AppleWebKit/605.1.15 (KHTML, like Gecko) "
     "Version/17.4 Safari/605.1.15", "Safari", "macOS"),
    ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
     "Version/17.4 Mobile/15E148 Safari/604.1", "Safari", "iOS"),
    ("Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/124.0.0.0 Mobile Safari/537.36", "Chrome", "Android"),
    ("Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0", "Firefox", "Linux"),
    ("Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:125.0) Gecko/20100101 Firefox/125.0", "Firefox", "Windows"),
    ("authio-python/1.4.2", "SDK", "server"),
    ("authio-node/2.1.0", "SDK", "server"),
    ("okhttp/4.12.0", "okhttp", "Android"),
    ("curl/8.5.0", "curl", "server"),
)
_UA_WEIGHTS: Final = (30, 22, 8, 12, 10, 8, 2, 3, 2, 2, 1, 0.2)
FIRST: Final = ("ada", "alan", "grace", "linus", "ken", "barbara", "edsger", "john", "kim", "lea", "maria", "noor",
                "omar", "priya", "quinn", "ravi", "sara", "tomas", "uma", "viktor", "wen", "yara", "zoe", "ines")
LAST: Final = ("lovelace", "turing", "hopper", "torvalds", "thompson", "liskov", "dijkstra", "mccarthy", "ng",
               "garcia", "khan", "haddad", "patel", "kowalski", "nakamura", "okafor", "silva", "meyer")
DOMAINS: Final = ("gmail.com", "outlook.com", "acme.io", "example.org", "yahoo.com", "proton.me", "globex.com",
                  "initech.net", "umbrella.co", "hooli.xyz", "stark.industries", "wayne.enterprises")
_DECISIONS: Final = (("allowed", 85), ("challenged", 10), ("blocked", 5))
_REASONS: Final = ("new_device", "new_country", "impossible_travel", "tor_exit", "velocity", "bad_ip_reputation")

_B32: Final = "0123456789abcdefghjkmnpqrstvwxyz"
_PAIRS: Final = tuple(a + b for a in _B32 for b in _B32)
_SHIFTS: Final = tuple(range(120, -1, -10))


def _ulid(n: int) -> str:
    """26-character lowercase Crockford spelling of a 128-bit integer (as common.ids)."""
    pairs = _PAIRS
    return "".join([pairs[(n >> s) & 1023] for s in _SHIFTS])


def _zipf_cum(n: int, s: float) -> list[float]:
    acc, out = 0.0, []
    for rank in range(1, n + 1):
        acc += rank ** -s
        out.append(acc)
    return out


class Pools:
    """Everything events are drawn from, rebuilt identically from the seed in every process.

    Skew is Zipf-like, so a handful of users, actors and organizations carry many events and the
    long tail only a few: that gives the "user with many events" and the rare one the filters need.
    """

    def __init__(self, seed: int, tag: str, users: int, admins: int, keys: int) -> None:
        rng = random.Random(f"{seed}:{tag}:pools")

        def ids(prefix: str, n: int) -> list[str]:
            return [f"{prefix}_{_ulid(rng.getrandbits(128))}" for _ in range(n)]

        self.users = ids("user", users)
        self.emails = [
            f"{rng.choice(FIRST)}.{rng.choice(LAST)}{i}@{DOMAINS[min(int(rng.paretovariate(1.2)) - 1, 11)]}"
            for i in range(users)
        ]
        self.user_cum = _zipf_cum(users, 0.8)
        self.admins = rng.sample(range(users), admins)  # admins are users (index into self.users)
        self.admin_cum = _zipf_cum(admins, 1.0)
        self.keys = ids("key", keys)
        self.key_cum = _zipf_cum(keys, 1.2)
        self.operators = [f"op_{FIRST[i % len(FIRST)]}{i}" for i in range(40)]
        self.systems = ["system:session-reaper", "system:risk-engine", "system:scim-sync", "system:dsr-worker"]
        self.orgs = ids("org", 2_000)
        self.org_cum = _zipf_cum(2_000, 1.0)
        self.stores = ids("store", 300)
        self.ips = [f"{rng.randrange(1, 224)}.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
                    for _ in range(50_000)]
        self.ip_cum = _zipf_cum(50_000, 0.9)
        self.ua_cum = list(_cum(_UA_WEIGHTS))

    # Candidates for the timing part, chosen from the construction (no counting query needed).
    def heavy_users(self) -> list[str]:
        return self.users[:4]

    def rare_users(self) -> list[str]:
        n = len(self.users)
        return [self.users[n - 1 - 7 * i] for i in range(4)]

    def heavy_actors(self) -> list[str]:
        return self.keys[:3]

    def rare_actors(self) -> list[str]:
        n = len(self.admins)
        return [self.users[self.admins[n - 1 - 5 * i]] for i in range(4)]

    def rare_emails(self) -> list[str]:
        n = len(self.users)
        return [self.emails[n - 3 - 11 * i] for i in range(3)]


def _cum(weights: Sequence[float]) -> list[float]:
    acc, out = 0.0, []
    for w in weights:
        acc += w
        out.append(acc)
    return out


@dataclass(frozen=True)
class LoadSpec:
    """What gets loaded; stored in the database (bench_audit_meta) so --reuse-db can time it again."""

    seed: int
    events: int
    months: int
    start: str  # ISO 8601, inclusive
    end: str  # ISO 8601, exclusive
    chunk_rows: int
    other_events: int
    project_id: str
    other_project_ids: tuple[str, ...]
    tenant_id: str

    @property
    def n_chunks(self) -> int:
        return max(1, math.ceil(self.events / self.chunk_rows))

    def pools(self) -> Pools:
        return Pools(self.seed, "main", users=100_000, admins=2_900, keys=60)

    def other_pools(self) -> Pools:
        return Pools(self.seed, "other", users=5_000, admins=100, keys=5)


def _slice(total: int, parts: int, i: int) -> int:
    return total * (i + 1) // parts - total * i // parts


def generate_chunk(spec: LoadSpec, pools: Pools, other: Pools, chunk: int) -> tuple[bytes, int]:
    """The COPY text of chunk ``chunk``: its share of the big project's events and of each small
    project's, with timestamps in the chunk's time slice, sorted. Same spec + chunk => same bytes."""
    rng = random.Random(f"{spec.seed}:chunk:{chunk}")
    t0 = datetime.fromisoformat(spec.start).timestamp()
    t1 = datetime.fromisoformat(spec.end).timestamp()
    n = spec.n_chunks
    lo_us = int((t0 + (t1 - t0) * chunk / n) * 1e6)
    hi_us = int((t0 + (t1 - t0) * (chunk + 1) / n) * 1e6)
    parts = [(spec.project_id, pools, _slice(spec.events, n, chunk))]
    parts += [(pid, other, _slice(spec.other_events, n, chunk)) for pid in spec.other_project_ids]
    rows: list[tuple[int, str]] = []  # (created_at in µs, line)
    for project_id, p, k in parts:
        if k:
            rows.extend(_rows(rng, p, project_id, k, lo_us, hi_us))
    rows.sort()
    buf = "".join([line for _, line in rows]).encode()
    if buf.count(b"\\") != buf.count(b"\\N"):  # text-format COPY reads a backslash as an escape
        raise AssertionError("generated data contains a backslash")
    return buf, len(rows)


def _rows(rng: random.Random, p: Pools, project_id: str, k: int, lo_us: int,
          hi_us: int) -> list[tuple[int, str]]:
    choices, rand, getrandbits = rng.choices, rng.random, rng.getrandbits
    acts = choices(range(len(ACTIONS)), cum_weights=_ACTION_CUM, k=k)
    users = choices(range(len(p.users)), cum_weights=p.user_cum, k=k)
    keys = choices(p.keys, cum_weights=p.key_cum, k=k)
    admins = choices(p.admins, cum_weights=p.admin_cum, k=k)
    orgs = choices(p.orgs, cum_weights=p.org_cum, k=k)
    ips = choices(p.ips, cum_weights=p.ip_cum, k=k)
    uas = choices(USER_AGENTS, cum_weights=p.ua_cum, k=k)
    times = sorted(rng.randrange(lo_us, hi_us) for _ in range(k))
    out: list[tuple[int, str]] = []
    fromts = datetime.fromtimestamp
    dumps = orjson.dumps
    for i in range(k):
        action, _, mix, target_type, p_user = ACTIONS[acts[i]]
        ts = times[i]
        evt = "evt_" + _ulid(((ts // 1000) << 80) | getrandbits(80))
        created = fromts(ts / 1e6, UTC).isoformat(" ")
        ui = users[i]
        has_user = p_user >= 1.0 or rand() < p_user
        user_id = p.users[ui] if has_user else None
        email = p.emails[ui]
        # actor
        r = rand() * 100
        if r < mix[0]:
            actor_type, actor_id, api_key_id = "api_key", keys[i], keys[i]
        elif r < mix[0] + mix[1]:
            actor_type, actor_id, api_key_id = "user", p.users[admins[i]], None
        elif r < mix[0] + mix[1] + mix[2]:
            actor_type, actor_id, api_key_id = "operator", p.operators[ui % len(p.operators)], None
        else:
            actor_type, actor_id, api_key_id = "system", p.systems[ui % len(p.systems)], None
        # target
        if target_type == "user":
            target_id: str | None = p.users[ui]
        elif target_type == "organization":
            target_id = orgs[i]
        elif target_type == "store":
            target_id = p.stores[ui % len(p.stores)]
        elif target_type == "api_key":
            target_id = keys[i - 1]
        elif target_type == "project":
            target_id = project_id
        else:
            target_id = f"{_TARGET_PREFIX[target_type]}_{_ulid(getrandbits(128))}"  # type: ignore[index]
        ua, browser, os_name = uas[i]
        ip = ips[i]
        meta: dict[str, Any]
        if action == "auth.signin_attempt":
            d = rand() * 100
            decision = "allowed" if d < 85 else "challenged" if d < 95 else "blocked"
            score = int(rand() * 30) if decision == "allowed" else 40 + int(rand() * 60)
            reasons = [] if decision == "allowed" else [_REASONS[int(rand() * 6)]]
            desc = f"Sign-in attempt for {email} with {browser} on {os_name}: {decision} (risk score {score})"
            meta = {"description": desc, "user_email": email, "score": score, "decision": decision,
                    "reasons": reasons, "device": {"browser": browser, "os": os_name}, "ip": ip}
        else:
            desc = _describe(action, email, target_id, orgs[i], browser, os_name, rand)
            meta = {"description": desc}
            if user_id is not None:
                meta["user_email"] = email
            if target_type == "organization" or action.startswith(("membership.", "invitation.")):
                meta["organization_id"] = orgs[i]
        out.append((ts, "\t".join((
            evt, created, action, actor_type, actor_id or "\\N", user_id or "\\N", project_id,
            target_type or "\\N", target_id or "\\N", ip, ua, desc, api_key_id or "\\N",
            dumps(meta).decode(),
        )) + "\n"))
    return out


def _describe(action: str, email: str, target: str | None, org: str, browser: str, os_name: str,
              rand: Callable[[], float]) -> str:
    if action.startswith("session."):
        verb = action.split(".", 1)[1].replace("_", " ")
        return f"Session {verb} for {email} ({browser} on {os_name})"
    if action.startswith("auth."):
        what = action.split(".", 1)[1].replace(".", " ").replace("_", " ")
        return f"{what.capitalize()} for {email} ({browser} on {os_name})"
    if action.startswith("user."):
        return f"User {email} {action.split('.', 1)[1]}"
    if action.startswith(("membership.", "invitation.")):
        role = "admin" if rand() < 0.1 else "member"
        return f"{action.replace('.', ' ').capitalize()} for {email} in {org} as {role}"
    if action.startswith("organization."):
        return f"Organization {org} {action.split('.', 1)[1]}"
    if action == "tuples.written":
        return f"{1 + int(rand() * 40)} tuples written to {target}"
    if action == "risk.policy.updated":
        old = 60 + int(rand() * 30)
        return f"Risk policy updated: threshold_block {old} -> {old + 5}"
    if action.startswith("compliance."):
        return f"Data-subject request {target} {action.rsplit('.', 1)[1]} for {email}"
    return f"{action.replace('.', ' ').capitalize()}: {target}"


# --------------------------------------------------------------------------- load workers

_W: dict[str, Any] = {}


def _worker_init(url: str, spec_json: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    spec = _spec_from(json.loads(spec_json))
    loop = asyncio.new_event_loop()
    _W.update(spec=spec, pools=spec.pools(), other=spec.other_pools(), loop=loop,
              conn=loop.run_until_complete(asyncpg.connect(url)))
    loop.run_until_complete(_W["conn"].execute("SET synchronous_commit = off"))


def _worker_load(chunk: int) -> tuple[int, int, float, float]:
    t0 = time.perf_counter()
    buf, rows = generate_chunk(_W["spec"], _W["pools"], _W["other"], chunk)
    t1 = time.perf_counter()

    async def pieces() -> AsyncIterator[bytes]:
        view = memoryview(buf)
        for off in range(0, len(view), 1 << 20):
            yield bytes(view[off:off + (1 << 20)])

    _W["loop"].run_until_complete(_W["conn"].copy_to_table(
        "audit_events", source=pieces(), columns=list(COPY_COLUMNS), format="text"))
    return rows, len(buf), t1 - t0, time.perf_counter() - t1


# --------------------------------------------------------------------------- database set-up


def _with_db(url: str, db: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + db))


async def secondary_indexes(conn: asyncpg.Connection) -> list[tuple[str, str]]:
    """(name, CREATE INDEX statement) of audit_events' partitioned indexes other than the key."""
    rows = await conn.fetch(
        """SELECT i.relname AS name, pg_get_indexdef(i.oid) AS def
           FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
           WHERE x.indrelid = 'audit_events'::regclass AND NOT x.indisprimary
           ORDER BY i.relname"""
    )
    return [(r["name"], r["def"].replace(" ON ONLY ", " ON ", 1)) for r in rows]


async def create_and_load(args: argparse.Namespace, admin_url: str, name: str) -> dict[str, Any]:
    """Create database ``name``, migrate it and load it; returns the load report."""
    report: dict[str, Any] = {}
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = _with_db(args.database_url, name)
    t = time.perf_counter()
    from control_plane.migrate import upgrade

    await asyncio.to_thread(upgrade, url)
    report["migrate_seconds"] = round(time.perf_counter() - t, 2)

    end = (datetime.fromisoformat(args.end) if args.end
           else datetime.now(UTC).replace(minute=0, second=0, microsecond=0))
    if end.tzinfo is None:
        end = end.replace(tzinfo=UTC)
    start = retention_cutoff(end, args.months)
    rng = random.Random(f"{args.seed}:ids")

    def rid(prefix: str) -> str:
        return f"{prefix}_{_ulid(rng.getrandbits(128))}"

    spec = LoadSpec(
        seed=args.seed, events=args.events, months=args.months, start=start.isoformat(),
        end=end.isoformat(), chunk_rows=args.chunk_rows,
        other_events=args.events // 100 if args.other_events is None else args.other_events,
        project_id=rid("proj"), other_project_ids=(rid("proj"), rid("proj")), tenant_id=rid("ten"),
    )
    conn = await asyncpg.connect(url)
    try:
        part = await manage_partitions(conn, now=end, forward_months=1, retention_months=args.months + 1)
        report["partitions"] = len(part.created)
        await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, 'bench audit')", spec.tenant_id)
        for i, pid in enumerate((spec.project_id, *spec.other_project_ids)):
            await conn.execute(
                "INSERT INTO projects (id, tenant_id, name, environment) VALUES ($1, $2, $3, 'bench')",
                pid, spec.tenant_id, "audit big" if i == 0 else f"audit small {i}")
        await conn.execute("CREATE TABLE bench_audit_meta (k text PRIMARY KEY, v jsonb NOT NULL)")
        await conn.execute("INSERT INTO bench_audit_meta VALUES ('spec', $1::jsonb)", json.dumps(asdict(spec)))
        indexes = await secondary_indexes(conn)
        if not args.load_with_indexes:
            for idx_name, _ in indexes:
                await conn.execute(f'DROP INDEX "{idx_name}"')
    finally:
        await conn.close()

    total = spec.events + spec.other_events * len(spec.other_project_ids)
    log(f"loading {total:,} events ({spec.events:,} in the big project) from {spec.start} to {spec.end} "
        f"in {spec.n_chunks} chunks with {args.workers} workers"
        + ("" if args.load_with_indexes else f"; {len(indexes)} secondary indexes dropped for the load"))
    t_load = time.perf_counter()
    loaded = nbytes = 0
    gen_s = copy_s = 0.0
    last_print = 0.0
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(args.workers, mp_context=ctx, initializer=_worker_init,
                                initargs=(url, json.dumps(asdict(spec)))) as pool:
        try:
            futures = [asyncio.wrap_future(pool.submit(_worker_load, c)) for c in range(spec.n_chunks)]
            for fut in asyncio.as_completed(futures):
                rows, size, g, c = await fut
                loaded, nbytes, gen_s, copy_s = loaded + rows, nbytes + size, gen_s + g, copy_s + c
                now = time.perf_counter()
                if now - last_print > 5 or loaded == total:
                    last_print = now
                    el = now - t_load
                    log(f"  {loaded:>12,} / {total:,} rows  {loaded / el:>9,.0f} rows/s  "
                        f"{nbytes / 2**30:.2f} GiB  {el:.0f} s")
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    load_s = time.perf_counter() - t_load
    report.update(rows_loaded=loaded, copy_gib=round(nbytes / 2**30, 2), load_seconds=round(load_s, 1),
                  load_rows_per_second=round(loaded / load_s),
                  generate_cpu_seconds=round(gen_s, 1), copy_wait_seconds=round(copy_s, 1))

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f"SET maintenance_work_mem = '{args.maintenance_work_mem}'")
        index_times = {}
        if not args.load_with_indexes:
            for idx_name, ddl in indexes:
                t = time.perf_counter()
                log(f"building {idx_name}: {ddl}")
                await conn.execute(ddl, timeout=None)
                index_times[idx_name] = round(time.perf_counter() - t, 1)
                log(f"  {idx_name} built in {index_times[idx_name]} s")
        report["index_build_seconds"] = index_times
        t = time.perf_counter()
        log("VACUUM (ANALYZE) audit_events")
        await conn.execute("VACUUM (ANALYZE) audit_events", timeout=None)
        report["vacuum_analyze_seconds"] = round(time.perf_counter() - t, 1)
        report["sizes"] = await table_sizes(conn)
        await conn.execute("INSERT INTO bench_audit_meta VALUES ('load', $1::jsonb)", json.dumps(report))
    finally:
        await conn.close()
    return report


async def table_sizes(conn: asyncpg.Connection) -> dict[str, Any]:
    heap = await conn.fetchval(
        """SELECT sum(pg_table_size(c.oid)) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
           WHERE i.inhparent = 'audit_events'::regclass""")
    idx = await conn.fetch(
        """SELECT p.relname AS name, sum(pg_relation_size(ci.inhrelid)) AS size
           FROM pg_class p JOIN pg_inherits ci ON ci.inhparent = p.oid
           JOIN pg_index x ON x.indexrelid = p.oid
           WHERE x.indrelid = 'audit_events'::regclass GROUP BY p.relname ORDER BY p.relname""")
    return {"heap_gib": round(int(heap or 0) / 2**30, 2),
            "indexes_mib": {r["name"]: round(int(r["size"]) / 2**20) for r in idx}}


async def read_spec(url: str) -> tuple[LoadSpec, dict[str, Any]]:
    conn = await asyncpg.connect(url)
    try:
        rows = {r["k"]: json.loads(r["v"]) for r in await conn.fetch("SELECT k, v::text AS v FROM bench_audit_meta")}
    finally:
        await conn.close()
    return _spec_from(rows["spec"]), rows.get("load", {})


def _spec_from(d: dict[str, Any]) -> LoadSpec:
    return LoadSpec(**{**d, "other_project_ids": tuple(d["other_project_ids"])})


async def make_key(url: str, project_id: str) -> str:
    """A fresh audit:read key row for ``project_id``; returns its plaintext."""
    secret = generate_secret("sk_test_")
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            """INSERT INTO api_keys (id, project_id, name, prefix, secret_hash, last_four, scopes)
               VALUES ($1, $2, 'bench audit', 'sk_test_', $3, $4, '{audit:read}')""",
            f"key_{_ulid(random.getrandbits(128))}", project_id, hash_secret(secret), secret[-4:])
    finally:
        await conn.close()
    return secret


# --------------------------------------------------------------------------- the server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a server still running, then SIGKILL it if it has not ended within 20 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _die_with_parent() -> None:  # preexec_fn: SIGTERM the server if this process dies first
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    base_url: str
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def status(self, field_name: str) -> int:
        """A ``kB`` line of /proc/<pid>/status, in bytes."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) * 1024
        raise KeyError(field_name)

    def rss(self) -> int:
        return self.status("VmRSS")

    def reset_peak(self) -> bool:
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        stop_process(self.proc)


def months_to_keep(start: datetime, now: datetime) -> int:
    """The smallest SERVICE_AUDIT_RETENTION_MONTHS that keeps every partition from ``start`` on
    (the server runs its partition pass at start and would drop older months)."""
    r = 1
    while retention_cutoff(now, r) > start.replace(day=1, hour=0, minute=0, second=0, microsecond=0):
        r += 1
    return r


def _spawn(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "control_plane.cli.main", "serve", "control-plane"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)


def _tail(path: Path) -> str:
    return path.read_text()[-3000:]


async def start_server(url: str, spec: LoadSpec, args: argparse.Namespace, tag: str) -> Server:
    port = _free_port()
    retention = months_to_keep(datetime.fromisoformat(spec.start), datetime.now(UTC))
    env = {**os.environ, "DATABASE_URL": url, "REDIS_URL": args.redis_url,
           "SERVICE_REDIS_PREFIX": f"{tag}:", "PORT": str(port), "SERVICE_HOST": "127.0.0.1",
           "SERVICE_AUDIT_RETENTION_MONTHS": str(retention), "SERVICE_LOG_LEVEL": "WARNING",
           "PYTHONPATH": str(ROOT)}
    if args.otel_exporter:
        env["OTEL_EXPORTER"] = args.otel_exporter
    if "SERVICE_KMS_KEY" not in env and "SERVICE_KMS_KEY_FILE" not in env:
        # The server refuses to start without a key-encryption key; nothing here is sealed.
        env["SERVICE_KMS_KEY"] = base64.b64encode(secrets.token_bytes(32)).decode()
    log_path = Path(f"/tmp/{tag}-server.log")
    server = Server(_spawn(env, log_path), f"http://127.0.0.1:{port}", log_path)
    proc = server.proc
    import aiohttp

    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as http:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited ({proc.returncode}); see {log_path}:\n" + _tail(log_path))
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(server.base_url + "/readyz") as r:
                    if r.status == 200:
                        return server
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"server not ready within 60 s; see {log_path}")
            await asyncio.sleep(0.1)


# --------------------------------------------------------------------------- first pages


@dataclass
class FilterCase:
    name: str
    what: str
    candidates: list[dict[str, str]]
    check: Callable[[dict[str, Any], dict[str, str]], bool]
    small_project: bool = False  # asked with a small project's key instead of the big one's


def _in_window(e: dict[str, Any], f: dict[str, str]) -> bool:
    t = datetime.fromisoformat(e["created_at"].replace("Z", "+00:00"))
    return datetime.fromisoformat(f["from"]) <= t <= datetime.fromisoformat(f["to"])


def _q_match(e: dict[str, Any], f: dict[str, str]) -> bool:
    q = f["q"].lower()
    meta = e.get("metadata") or {}
    hay = (e.get("action"), e.get("actor_id"), e.get("target_id"),
           meta.get("description") if isinstance(meta, dict) else None, e.get("description"))
    return any(h is not None and q in h.lower() for h in hay)


def filter_cases(spec: LoadSpec) -> list[FilterCase]:
    p = spec.pools()
    start, end = datetime.fromisoformat(spec.start), datetime.fromisoformat(spec.end)
    mid = start + (end - start) / 2
    weeks = []
    for k in (-2, -1, 0, 1):
        lo = (mid + timedelta(days=7 * k)).replace(minute=0, second=0, microsecond=0)
        weeks.append({"from": lo.isoformat(), "to": (lo + timedelta(days=7)).isoformat()})
    return [
        FilterCase("none", "no filter", [{}], lambda e, f: True),
        FilterCase("type_common", "type=<common action>",
                   [{"type": a} for a in ("auth.signin_attempt", "session.refreshed", "auth.magic_link.sent")],
                   lambda e, f: e["action"] in f["type"].split(",")),
        FilterCase("type_rare", "type=<rare action> (~0.01-0.02%)",
                   [{"type": a} for a in ("risk.policy.updated", "webhook.endpoint.created",
                                          "compliance.dsr.fulfilled")],
                   lambda e, f: e["action"] in f["type"].split(",")),
        FilterCase("type_multi", "type=a,b,c (three mid-frequency actions)",
                   [{"type": "membership.created,membership.deleted,organization.created"},
                    {"type": "api_key.created,api_key.revoked,user.deleted"}],
                   lambda e, f: e["action"] in f["type"].split(",")),
        FilterCase("user_heavy", "user=<user with many events>", [{"user": u} for u in p.heavy_users()],
                   lambda e, f: e["user_id"] == f["user"]),
        FilterCase("user_rare", "user=<user with few events>", [{"user": u} for u in p.rare_users()],
                   lambda e, f: e["user_id"] == f["user"]),
        FilterCase("actor_heavy", "actor=<busiest API key>", [{"actor": a} for a in p.heavy_actors()],
                   lambda e, f: e["actor_id"] == f["actor"]),
        FilterCase("actor_rare", "actor=<admin with few events>", [{"actor": a} for a in p.rare_actors()],
                   lambda e, f: e["actor_id"] == f["actor"]),
        FilterCase("from_to", "from/to one-week window mid-span", weeks, _in_window),
        FilterCase("q_common", "q=<common substring>",
                   [{"q": q} for q in ("allowed", "Chrome on macOS", "session", "gmail.com")], _q_match),
        FilterCase("q_rare", "q=<rare substring (email of a rare user, policy text)>",
                   [{"q": q} for q in (*p.rare_emails(), "threshold_block")], _q_match),
        FilterCase("q_none", "q=<substring matching nothing, rare trigrams>",
                   [{"q": q} for q in ("zz-no-such-thing", "qq-nothing-here")], _q_match),
        FilterCase("small_none", "no filter, a small project (1% of the table's rows)", [{}],
                   lambda e, f: True, small_project=True),
        FilterCase("small_q", "q=<common substring>, a small project", [{"q": "allowed"}, {"q": "Chrome on macOS"}],
                   _q_match, small_project=True),
        # Stress, beyond the list: every trigram is frequent, the combination never occurs.
        FilterCase("q_common_none", "q=<common words, no match> (stress: 'Safari on Windows')",
                   [{"q": q} for q in ("Safari on Windows", "Firefox on iOS")], _q_match),
    ]


def _pct(values: Sequence[float], pct: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * pct / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


async def time_first_pages(http: Any, server: Server, key: str, small_key: str, spec: LoadSpec,
                           cases: list[FilterCase], requests: int, budget_s: float) -> list[dict[str, Any]]:
    out = []
    for case in cases:
        headers = {"Authorization": f"Bearer {small_key if case.small_project else key}"}
        project = spec.other_project_ids[0] if case.small_project else spec.project_id
        lat: list[float] = []
        cold: list[float] = []
        stats = PageStats()
        for f in case.candidates:  # first touch of each value, reported apart as "cold"
            await first_page(http, server, headers, project, case, f, cold, stats)
        t0 = time.perf_counter()
        i = 0
        while i < requests and (i < 50 or time.perf_counter() - t0 < budget_s):
            await first_page(http, server, headers, project, case, case.candidates[i % len(case.candidates)], lat,
                             stats)
            i += 1
        rows_seen, bad, errors, first_error = stats.rows, stats.bad, stats.errors, stats.first_error
        res = {"filter": case.name, "what": case.what, "requests": len(lat),
               "p50_ms": round(_pct(lat, 50), 2), "p99_ms": round(_pct(lat, 99), 2),
               "max_ms": round(max(lat), 2) if lat else None,
               "cold_max_ms": round(max(cold), 2) if cold else None,
               "rows_min": min(rows_seen) if rows_seen else None, "wrong_answers": bad, "errors": errors,
               "values": case.candidates}
        if first_error:
            res["first_error"] = first_error
        res["meets_target"] = bool(lat) and not errors and res["p99_ms"] < TARGET_PAGE_P99_MS
        log(f"  {case.name:13} p50 {res['p50_ms']:>9.2f} ms  p99 {res['p99_ms']:>9.2f} ms  "
            f"({len(lat)} requests, rows/page >= {res['rows_min']}, wrong {bad}, errors {errors})")
        out.append(res)
    return out


@dataclass
class PageStats:
    rows: list[int] = field(default_factory=list)
    bad: int = 0
    errors: int = 0
    first_error: str | None = None


async def first_page(http: Any, server: Server, headers: dict[str, str], project: str, case: FilterCase,
                     f: dict[str, str], sink: list[float], stats: PageStats) -> None:
    """One first page; its latency goes to ``sink``, its verdict to ``stats``."""
    url = f"{server.base_url}/v1/audit/events?{urlencode({**f, 'limit': PAGE_LIMIT})}"
    t = time.perf_counter()
    async with http.get(url, headers=headers) as r:
        raw = await r.read()
    dt = (time.perf_counter() - t) * 1000
    if r.status != 200:
        stats.errors += 1
        stats.first_error = stats.first_error or f"{r.status} {raw[:300]!r}"
        return
    sink.append(dt)
    data = orjson.loads(raw)["data"]
    stats.rows.append(len(data))
    keys = [_ts((e["created_at"], e["id"])) for e in data]
    if (len(data) > PAGE_LIMIT or any(e.get("project_id") != project for e in data)
            or not all(case.check(e, f) for e in data)
            or any(a < b for a, b in itertools.pairwise(keys))):
        stats.bad += 1


def _ts(key: tuple[str, str]) -> tuple[datetime, str]:
    return datetime.fromisoformat(key[0].replace("Z", "+00:00")), key[1]


# --------------------------------------------------------------------------- exports


class CsvCounter:
    """Counts and parses the RFC 4180 records of a byte stream with ``csv`` (C speed): each chunk
    is cut at its last newline outside quotes (an even number of quotes before it: an escaped
    quote is two quotes), so a quoted field holding a newline is never split."""

    def __init__(self) -> None:
        self.pending = b""
        self.header: list[str] | None = None
        self.rows = 0
        self.bad_rows = 0
        self.first: list[str] | None = None
        self.last: list[str] | None = None

    def feed(self, chunk: bytes, final: bool = False) -> None:
        data = self.pending + chunk
        if final:
            cut = len(data) - 1
        else:
            cut = data.rfind(b"\n")
            while cut >= 0 and data.count(b'"', 0, cut) % 2:
                cut = data.rfind(b"\n", 0, cut)
            if cut < 0:
                self.pending = data
                return
        block, self.pending = data[: cut + 1], data[cut + 1:]
        if block:
            self._parse(block.decode())

    def _parse(self, text: str) -> None:
        width = len(CSV_COLUMNS)
        row: list[str] | None = None
        n = bad = 0
        for row in csv.reader(io.StringIO(text, newline="")):
            if self.header is None:
                self.header = row
                continue
            if self.first is None:
                self.first = row
            n += 1
            if len(row) != width:
                bad += 1
        if n:
            self.last = row
        self.rows += n
        self.bad_rows += bad


class JsonlCounter:
    def __init__(self) -> None:
        self.pending = b""
        self.rows = 0
        self.bad_rows = 0
        self.first: dict[str, Any] | None = None
        self.last: dict[str, Any] | None = None

    def feed(self, chunk: bytes, final: bool = False) -> None:
        lines = (self.pending + chunk).split(b"\n")
        self.pending = b"" if final else lines.pop()
        for line in lines:
            if not line.strip():
                continue
            e = orjson.loads(line)
            self.rows += 1
            if not isinstance(e.get("metadata"), dict):
                self.bad_rows += 1
            if self.first is None:
                self.first = e
            self.last = e


async def run_export(http: Any, server: Server, key: str, fmt: str, query: dict[str, str],
                     label: str) -> dict[str, Any]:
    url = f"{server.base_url}/v1/audit/events.{fmt}?{urlencode(query)}"
    counter: CsvCounter | JsonlCounter = CsvCounter() if fmt == "csv" else JsonlCounter()
    samples: list[int] = []
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                samples.append(server.rss())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)

    await asyncio.sleep(0.3)
    rss_before = server.rss()
    hwm_reset = server.reset_peak()
    cpu0 = server.cpu_seconds()
    client0 = time.process_time()
    sampler = asyncio.create_task(sample())
    nbytes = 0
    t0 = time.perf_counter()
    ttfb = None
    async with http.get(url, headers={"Authorization": f"Bearer {key}"}) as r:
        status, headers = r.status, r.headers
        async for chunk in r.content.iter_any():
            if ttfb is None:
                ttfb = time.perf_counter() - t0
            nbytes += len(chunk)
            if status == 200:
                counter.feed(chunk)
    counter.feed(b"", final=True)
    elapsed = time.perf_counter() - t0
    cpu = server.cpu_seconds() - cpu0
    client_cpu = time.process_time() - client0
    stop.set()
    await sampler
    peak_hwm = server.status("VmHWM") if hwm_reset else 0
    await asyncio.sleep(1.0)
    rss_after = server.rss()
    peak = max([rss_before, peak_hwm, *samples])
    res: dict[str, Any] = {
        "label": label, "format": fmt, "status": status, "query": query, "rows": counter.rows,
        "bad_rows": counter.bad_rows, "bytes": nbytes, "seconds": round(elapsed, 3),
        "ttfb_ms": round((ttfb or 0) * 1000, 1), "rows_per_second": round(counter.rows / elapsed) if elapsed else 0,
        "server_cpu_seconds": round(cpu, 2), "client_cpu_seconds": round(client_cpu, 2),
        "rss_before_mib": round(rss_before / 2**20, 1), "rss_peak_mib": round(peak / 2**20, 1),
        "rss_after_mib": round(rss_after / 2**20, 1), "rss_growth_mib": round((peak - rss_before) / 2**20, 1),
        "rss_samples": len(samples), "peak_from_vmhwm": hwm_reset,
        "next_cursor": headers.get("Service-Next-Cursor"),
        "content_type": headers.get("Content-Type"), "content_disposition": headers.get("Content-Disposition"),
    }
    if status != 200:
        res["error"] = (await _safe_text(r))[:300]
    if isinstance(counter, CsvCounter):
        res["header_ok"] = counter.header == list(CSV_COLUMNS)
        res["first_key"] = [counter.first[1], counter.first[0]] if counter.first else None  # (created_at, id)
        res["last_key"] = [counter.last[1], counter.last[0]] if counter.last else None
    else:
        res["first_key"] = [counter.first["created_at"], counter.first["id"]] if counter.first else None
        res["last_key"] = [counter.last["created_at"], counter.last["id"]] if counter.last else None
    log(f"  {label:22} {res['rows']:>7,} rows  {res['rows_per_second']:>8,} rows/s  {nbytes / 2**20:7.1f} MiB  "
        f"RSS {res['rss_before_mib']} -> peak {res['rss_peak_mib']} -> {res['rss_after_mib']} MiB  "
        f"CPU server {res['server_cpu_seconds']} s client {res['client_cpu_seconds']} s")
    return res


async def _safe_text(r: Any) -> str:
    with contextlib.suppress(Exception):
        return str(await r.text())
    return ""


async def exports(http: Any, server: Server, key: str, repeats: int) -> list[dict[str, Any]]:
    """``repeats`` rounds of: the newest 100,000 rows, then the next 100,000 through the
    ``Service-Next-Cursor`` header, for CSV and for JSONL."""
    out = []
    for fmt in ("csv", "jsonl"):
        for _ in range(repeats):
            first = await run_export(http, server, key, fmt, {}, f"{fmt} full")
            out.append(first)
            cursor = first.get("next_cursor")
            if cursor:
                cont = await run_export(http, server, key, fmt, {"cursor": cursor}, f"{fmt} continuation")
                if first["last_key"] and cont["first_key"]:
                    cont["continues_strictly_older"] = (
                        _ts(tuple(cont["first_key"])) < _ts(tuple(first["last_key"])))
                out.append(cont)
    return out


def summarize_exports(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per label: median and range of rows/s and time to first byte; memory over all its runs."""
    out = []
    for label in dict.fromkeys(r["label"] for r in runs):
        rs = [r for r in runs if r["label"] == label]
        rates = [r["rows_per_second"] for r in rs]
        out.append({
            "label": label, "runs": len(rs), "rows": rs[0]["rows"], "bytes": rs[0]["bytes"],
            "rows_per_second_median": round(statistics.median(rates)), "rows_per_second_min": min(rates),
            "rows_per_second_max": max(rates), "ttfb_ms_median": round(statistics.median(r["ttfb_ms"] for r in rs), 1),
            "server_cpu_seconds_median": round(statistics.median(r["server_cpu_seconds"] for r in rs), 2),
            "client_cpu_seconds_median": round(statistics.median(r["client_cpu_seconds"] for r in rs), 2),
            "rss_before_mib": rs[0]["rss_before_mib"], "rss_peak_mib": max(r["rss_peak_mib"] for r in rs),
            "rss_after_mib": rs[-1]["rss_after_mib"], "rss_growth_mib_max": max(r["rss_growth_mib"] for r in rs),
            "all_rows_parsed": all(r["rows"] == EXPORT_CAP and not r["bad_rows"] and r["status"] == 200 for r in rs),
            "continuation_ok": all(r.get("continues_strictly_older", True) for r in rs),
            "meets_rate": statistics.median(rates) >= TARGET_EXPORT_ROWS_S,
            "meets_flat": max(r["rss_growth_mib"] for r in rs) < TARGET_FLAT_MB,
        })
    return out


# --------------------------------------------------------------------------- EXPLAIN


async def explain_first_pages(url: str, spec: LoadSpec, cases: list[FilterCase]) -> list[dict[str, Any]]:
    """EXPLAIN (ANALYZE, BUFFERS) of each filter's first-page query, built by the service's own
    query builder (``control_plane.audit.repository``) for the first candidate value."""
    try:
        build = _query_builder()
    except Exception as exc:  # the module's shape is the read-endpoint author's to choose
        log(f"EXPLAIN skipped: no query builder found in control_plane.audit ({exc})")
        return []
    out = []
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("SET plan_cache_mode = force_custom_plan")  # as the service does
        from control_plane.audit import repository as ae

        frequencies = await ae.search_trigram_frequencies(conn)  # as the service reads them
        for case in cases:
            project = spec.other_project_ids[0] if case.small_project else spec.project_id
            for f in case.candidates[: 2 if case.name.startswith("q_") else 1]:
                sql, params = build(project, f, PAGE_LIMIT, frequencies)
                out.append(await _explain_one(conn, case.name, f, sql, params))
    finally:
        await conn.close()
    return out


async def _explain_text(conn: asyncpg.Connection, sql: str, params: Sequence[Any]) -> str:
    rows = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + sql, *params)
    return "\n".join(r[0] for r in rows)


_PARTITION_RE: Final = re.compile(r"audit_events_y\d{4}m\d{2}_")


def _node_name(node: dict[str, Any]) -> str:
    name = str(node["Node Type"])
    if "Index Name" in node:  # per-partition index names, shown as the parent's columns
        name += f" using {_PARTITION_RE.sub('', node['Index Name'])}"
    return name


def _work(node: dict[str, Any]) -> tuple[int, float]:
    return (int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0)),
            float(node.get("Actual Total Time", 0)) * float(node.get("Actual Loops", 1)))


def _node_chain(node: dict[str, Any]) -> str:
    """The plan's spine, descending into the busiest child where a node has several (partitions):
    'Limit > Merge Append [9: 9x Index Scan using ...] > Index Scan using x (rows 51)'."""
    names = []
    for _ in range(8):
        name = _node_name(node)
        kids = node.get("Plans") or []
        if len(kids) > 1:
            kinds: dict[str, int] = {}
            for k in kids:
                kinds[_node_name(k)] = kinds.get(_node_name(k), 0) + 1
            name += " [" + ", ".join(f"{v}x {k}" for k, v in kinds.items()) + "; busiest:]"
        names.append(name)
        if not kids:
            names[-1] += f" (rows {node.get('Actual Rows')}, removed by filter {node.get('Rows Removed by Filter', 0)})"
            break
        node = max(kids, key=_work)
    return " > ".join(names)


def _query_builder() -> Callable[[str, dict[str, str], int, dict[str, float]], tuple[str, list[Any]]]:
    """The service's own SQL for a first page: ``audit.repository.build_query`` over the
    listing's columns with ``limit + 1`` rows (the extra row tells ``has_more``), a ``q``
    given the index the rare trigrams the service would choose from ``frequencies``."""
    from multidict import MultiDict

    from common.schemas import parse_query
    from control_plane.audit import repository as ae
    from control_plane.audit import service
    from control_plane.audit.schemas import EventsQuery

    def build(project_id: str, query: dict[str, str], limit: int,
              frequencies: dict[str, float]) -> tuple[str, list[Any]]:
        filters = service.with_rare_trigrams(service.filters(parse_query(MultiDict(query), EventsQuery)),
                                             frequencies)
        sql, args = ae.build_query(ae.JSON_COLUMNS, project_id, filters, limit=limit + 1)
        return sql, list(args)

    return build


async def explain_export(url: str, spec: LoadSpec) -> list[dict[str, Any]]:
    """EXPLAIN (ANALYZE, BUFFERS) of the unfiltered export's two queries: the probe that finds the
    100,000th row (for Service-Next-Cursor) and the stream itself (CSV columns), i.e. the
    database's share of an export."""
    try:
        from control_plane.audit import repository as ae

        probe_sql, probe_args = ae.build_query("e.created_at, e.id", spec.project_id, ae.Filters(),
                                               offset=EXPORT_CAP - 1, limit=2)
        conn = await asyncpg.connect(url)
    except Exception as exc:
        log(f"export EXPLAIN skipped ({exc})")
        return []
    out = []
    try:
        await conn.execute("SET plan_cache_mode = force_custom_plan")
        edge = await conn.fetch(probe_sql, *probe_args)
        bound = ae.Key(edge[0]["created_at"], edge[0]["id"]) if len(edge) == 2 else None
        stream_sql, stream_args = ae.build_query(ae.CSV_SELECT, spec.project_id,
                                                 ae.Filters(), bound=bound, limit=EXPORT_CAP)
        for label, sql, args in (("export_probe", probe_sql, probe_args),
                                 ("export_stream_csv", stream_sql, stream_args)):
            out.append(await _explain_one(conn, label, {}, sql, list(args)))
    finally:
        await conn.close()
    return out


async def _explain_one(conn: asyncpg.Connection, label: str, value: dict[str, str], sql: str,
                       params: list[Any]) -> dict[str, Any]:
    t = time.perf_counter()
    rows = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, *params)
    wall = (time.perf_counter() - t) * 1000
    plan = json.loads(rows[0][0])[0]
    top = plan["Plan"]
    res = {
        "filter": label, "value": value, "top_node": _node_name(top), "nodes": _node_chain(top),
        "planning_ms": round(plan.get("Planning Time", 0), 2),
        "execution_ms": round(plan.get("Execution Time", 0), 2), "wall_ms": round(wall, 2),
        "shared_hit": top.get("Shared Hit Blocks"), "shared_read": top.get("Shared Read Blocks"),
        "rows": top.get("Actual Rows"), "text": await _explain_text(conn, sql, params),
    }
    log(f"  {label:17} {res['execution_ms']:>9.2f} ms exec  {res['planning_ms']:>6.2f} ms plan  "
        f"hit {res['shared_hit']} read {res['shared_read']}  {res['nodes']}")
    return res


# --------------------------------------------------------------------------- main


def print_report(r: dict[str, Any]) -> None:
    load = r.get("load") or {}
    spec = r["spec"]
    print(f"\naudit benchmark: {spec['events']:,} events in the big project over {spec['months']} months "
          f"({spec['start']} .. {spec['end']}), +{spec['other_events']:,} in each of "
          f"{len(spec['other_project_ids'])} other projects; database {r['database']}")
    if r.get("db_settings"):
        print(f"database settings for the timing part: {r['db_settings']}")
    if r.get("loadavg_before_timing"):
        print(f"machine load average before/after the timing part: {r['loadavg_before_timing']} / "
              f"{r.get('loadavg_after_timing')} (2 cores, shared)")
    if load:
        print(f"load: {load.get('rows_loaded', 0):,} rows in {load.get('load_seconds')} s "
              f"({load.get('load_rows_per_second', 0):,} rows/s, {load.get('copy_gib')} GiB of COPY text); "
              f"index builds {load.get('index_build_seconds')} s; "
              f"VACUUM ANALYZE {load.get('vacuum_analyze_seconds')} s")
        print(f"sizes: {load.get('sizes')}")
    if r.get("pages"):
        print(f"\nfirst pages (limit {PAGE_LIMIT}), target p99 < {TARGET_PAGE_P99_MS:.0f} ms")
        print(f"| {'filter':13} | {'what':58} | {'n':>4} | {'p50 ms':>8} | {'p99 ms':>8} | {'max ms':>8} | "
              f"{'cold ms':>8} | wrong | verdict |")
        for p in r["pages"]:
            verdict = "met" if p["meets_target"] else "MISSED"
            print(f"| {p['filter']:13} | {p['what'][:58]:58} | {p['requests']:>4} | {p['p50_ms']:>8.2f} | "
                  f"{p['p99_ms']:>8.2f} | {p['max_ms'] or 0:>8.2f} | {p['cold_max_ms'] or 0:>8.2f} | "
                  f"{p['wrong_answers'] + p['errors']:>5} | {verdict:7} |")
    if r.get("export_summary"):
        print(f"\nexports of {EXPORT_CAP:,} rows, target >= {TARGET_EXPORT_ROWS_S:,} rows/s and server RSS growth "
              f"< {TARGET_FLAT_MB:.0f} MiB (median of the runs, range in brackets)")
        print(f"| {'export':18} | {'runs':>4} | {'MiB':>5} | {'rows/s median [min-max]':>27} | {'ttfb ms':>7} | "
              f"{'CPU srv/cli s':>13} | {'RSS before':>10} | {'peak':>6} | {'after':>6} | {'growth':>6} | verdict |")
        for e in r["export_summary"]:
            rate = f"{e['rows_per_second_median']:,} [{e['rows_per_second_min']:,}-{e['rows_per_second_max']:,}]"
            cpu = f"{e['server_cpu_seconds_median']:.2f}/{e['client_cpu_seconds_median']:.2f}"
            verdict = ("rate " + ("met" if e["meets_rate"] else "MISSED") + ", flat "
                       + ("met" if e["meets_flat"] else "MISSED"))
            print(f"| {e['label']:18} | {e['runs']:>4} | {e['bytes'] / 2**20:>5.1f} | {rate:>27} | "
                  f"{e['ttfb_ms_median']:>7.1f} | {cpu:>13} | {e['rss_before_mib']:>10.1f} | "
                  f"{e['rss_peak_mib']:>6.1f} | {e['rss_after_mib']:>6.1f} | {e['rss_growth_mib_max']:>6.1f} | "
                  f"{verdict} |")
    if r.get("explain"):
        print("\nEXPLAIN (ANALYZE, BUFFERS) of each first-page query (first candidate value)")
        for x in r["explain"]:
            print(f"  {x['filter']:17} exec {x['execution_ms']:>9.2f} ms  plan {x['planning_ms']:>6.2f} ms  "
                  f"hit {x['shared_hit']} read {x['shared_read']}  {x['nodes']}")
    for k, v in r.get("checks", {}).items():
        print(f"check {k}: {v}")


async def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000, help="events in the big project")
    parser.add_argument("--months", type=int, default=6, help="months the events span (ending --end)")
    parser.add_argument("--end", help="ISO 8601 end of the span (default: the current hour, UTC)")
    parser.add_argument("--other-events", type=int, help="events in each of the 2 small projects (default events/100)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_PG))
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS))
    parser.add_argument("--keep-db", metavar="NAME", help="create the database under NAME and keep it")
    parser.add_argument("--reuse-db", metavar="NAME", help="time an already loaded database (kept)")
    parser.add_argument("--workers", type=int, default=3, help="loader processes (one connection each)")
    parser.add_argument("--chunk-rows", type=int, default=100_000)
    parser.add_argument("--load-with-indexes", action="store_true",
                        help="keep the secondary indexes during the load instead of rebuilding them after")
    parser.add_argument("--maintenance-work-mem", default="1GB", help="for the index builds (session setting)")
    parser.add_argument("--requests", type=int, default=100, help="timed first pages per filter (at least 50)")
    parser.add_argument("--filter-budget", type=float, default=120.0,
                        help="seconds per filter after which no more than 50 requests are made")
    parser.add_argument("--export-repeats", type=int, default=3, help="rounds of (full export, continuation)")
    parser.add_argument("--filters", help="comma-separated subset of filter names")
    parser.add_argument("--otel-exporter", default="none", help="OTEL_EXPORTER for the server ('' = inherit)")
    parser.add_argument("--db-setting", action="append", default=[], metavar="NAME=VALUE",
                        help="ALTER DATABASE <scratch db> SET NAME = VALUE for the timing part (the server's "
                             "sessions pick it up; reset at the end), e.g. random_page_cost=1.1")
    parser.add_argument("--load-only", action="store_true", help="stop after loading (with --keep-db)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    args = parser.parse_args()

    tag = f"authio_bench_audit_{secrets.token_hex(4)}"
    name = args.reuse_db or args.keep_db or tag
    keep = bool(args.reuse_db or args.keep_db)
    admin_url = _with_db(args.database_url, "postgres")
    url = _with_db(args.database_url, name)
    report: dict[str, Any] = {"database": name, "argv": sys.argv[1:]}
    server: Server | None = None
    created = False
    try:
        if args.reuse_db:
            spec, report["load"] = await read_spec(url)
        else:
            created = True
            report["load"] = await create_and_load(args, admin_url, name)
            spec, _ = await read_spec(url)
        report["spec"] = asdict(spec)
        if args.load_only:
            return report
        import aiohttp

        cases = filter_cases(spec)
        if args.filters:
            wanted = set(args.filters.split(","))
            cases = [c for c in cases if c.name in wanted]
        report["db_settings"] = await apply_db_settings(admin_url, name, args.db_setting)
        key = await make_key(url, spec.project_id)
        other_key = await make_key(url, spec.other_project_ids[0])
        server = await start_server(url, spec, args, tag)
        log(f"control plane pid {server.pid} at {server.base_url}, RSS {server.rss() / 2**20:.1f} MiB")
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            report["checks"] = await isolation_check(http, server, other_key, spec)
            report["loadavg_before_timing"] = [round(x, 2) for x in os.getloadavg()]
            log("first pages")
            report["pages"] = await time_first_pages(http, server, key, other_key, spec, cases,
                                                     max(args.requests, 50), args.filter_budget)
            log("exports")
            report["exports"] = await exports(http, server, key, args.export_repeats)
            report["export_summary"] = summarize_exports(report["exports"])
        report["server_rss_end_mib"] = round(server.rss() / 2**20, 1)
        report["loadavg_after_timing"] = [round(x, 2) for x in os.getloadavg()]
        log("EXPLAIN")
        report["explain"] = await explain_first_pages(url, spec, cases) + await explain_export(url, spec)
        if server is not None:
            server.stop()
            server.log_path.unlink(missing_ok=True)  # kept only when something went wrong
        return report
    finally:
        if server is not None:
            server.stop()
        await cleanup_redis(args.redis_url, tag)
        if args.db_setting and keep:
            await apply_db_settings(admin_url, name, args.db_setting, reset=True)
        if created and not keep:
            log(f"dropping {name}")
            admin = await asyncpg.connect(admin_url)
            try:
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                await admin.close()
        elif keep:
            log(f"database kept: {name} (drop with: DROP DATABASE \"{name}\" WITH (FORCE))")


_SETTING_RE: Final = re.compile(r"([a-z_]+)=([A-Za-z0-9_.]+)")


async def apply_db_settings(admin_url: str, db: str, settings: list[str], reset: bool = False) -> dict[str, str]:
    """``ALTER DATABASE db SET name = value`` (or ``RESET``) for each ``name=value``: per database,
    so nothing outside the scratch database changes."""
    done: dict[str, str] = {}
    if not settings:
        return done
    conn = await asyncpg.connect(admin_url)
    try:
        for item in settings:
            m = _SETTING_RE.fullmatch(item)
            if m is None:
                raise SystemExit(f"--db-setting {item!r}: expected name=value")
            if reset:
                await conn.execute(f'ALTER DATABASE "{db}" RESET {m.group(1)}')
            else:
                await conn.execute(f"ALTER DATABASE \"{db}\" SET {m.group(1)} = '{m.group(2)}'")
                done[m.group(1)] = m.group(2)
                log(f"ALTER DATABASE {db} SET {m.group(1)} = {m.group(2)}")
    finally:
        await conn.close()
    return done


async def isolation_check(http: Any, server: Server, other_key: str, spec: LoadSpec) -> dict[str, Any]:
    """A small project's key sees only its project's events (first page, no filter)."""
    async with http.get(f"{server.base_url}/v1/audit/events?limit=1000",
                        headers={"Authorization": f"Bearer {other_key}"}) as r:
        if r.status != 200:
            return {"other_project_status": r.status}
        data = (await r.json())["data"]
    foreign = sum(1 for e in data if e.get("project_id") != spec.other_project_ids[0])
    return {"other_project_rows": len(data), "other_project_foreign_rows": foreign}


async def cleanup_redis(redis_url: str, tag: str) -> None:
    with contextlib.suppress(Exception):
        from redis.asyncio import Redis

        client = Redis.from_url(redis_url)
        try:
            keys = [k async for k in client.scan_iter(match=f"{tag}:*")]
            if keys:
                await client.delete(*keys)
        finally:
            await client.aclose()


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # run the finally blocks: stop the server, drop the database


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _sigterm)
    result = asyncio.run(main())
    if "--json" in sys.argv:
        print(json.dumps(result, indent=2, default=str))
    else:
        print_report(result)
