"""Risk decisions over HTTP: ``GET /v1/risk/decisions`` and ``/{id}`` (DESIGN.md "risk"): one
decision per primary sign-in, what it holds, the filters, keyset pagination, and who may read.
"""

from __future__ import annotations

import re
from typing import Any

import asyncpg
import pytest

from control_plane.risk import signals
from tests.fixtures.geo import PLACES
from tests.fixtures.identity import email, latest_link, send_link, token_of, verify
from tests.fixtures.peers import mailbox_messages
from tests.fixtures.service import (
    ULID,
    Api,
    Project,
    Response,
    assert_error,
    assert_invalid_field,
    bootstrap_project,
    scoped,
    ts,
)
from tests.risk.helpers import (
    CHROME_MAC,
    FIREFOX_WINDOWS,
    SAFARI_IPHONE,
    attempt,
    client,
    decision,
    fired,
    set_policy,
)

DECISIONS = "/v1/risk/decisions"
DECISION_ID = re.compile(rf"^rd_{ULID}$")


async def _listed(api: Api, query: str = "") -> dict[str, Any]:
    r = await api.get(DECISIONS + query)
    assert r.status == 200, r.body
    return dict(r.body)


async def _signed_in(project: Project, address: str, ip: str, user_agent: str = CHROME_MAC) -> dict[str, Any]:
    r = await attempt(project, address, ip=ip, user_agent=user_agent)
    assert r.status == 200, r.body
    return dict(r.body)


# --- what a decision holds -----------------------------------------------------------------------


async def test_a_sign_in_leaves_one_decision_with_everything_it_saw(risk_project: Project) -> None:
    address = email()
    berlin = PLACES["berlin"]
    signed = await _signed_in(risk_project, address, berlin.ip, SAFARI_IPHONE)
    page = await _listed(risk_project.api)
    assert page["has_more"] is False and page["next_cursor"] is None
    assert len(page["data"]) == 1
    d = page["data"][0]
    assert DECISION_ID.match(d["id"]), d["id"]
    assert d["user_id"] == signed["user"]["id"]
    assert d["session_id"] == signed["session"]["id"]
    assert (d["method"], d["score"], d["decision"], d["reasons"]) == ("magic_link", 0, "allow", [])
    assert d["step_up_challenge_id"] is None
    assert ts(d["created_at"]) == ts(signed["session"]["created_at"])  # the same transaction
    assert [s["name"] for s in d["signals"]] == list(signals.NAMES)
    assert {s["name"]: (s["fired"], s["contribution"]) for s in d["signals"]} == {
        name: (False, 0) for name in signals.NAMES}
    assert {s["name"]: s["reason"] for s in d["signals"]} == {
        "new_device": "no earlier device to compare with",
        "new_network": "no earlier network to compare with",
        "new_country": "no earlier country to compare with",
        "impossible_travel": "no earlier located sign-in",
        "ip_velocity": f"1 attempt from {berlin.ip} in 10 min",
        "destination_velocity": "1 attempt on this account in 10 min",
        "failed_attempts": "0 refused sign-ins in the last 15 min",
        "blocked_network": "not in a blocked network",
    }
    inputs = d["inputs"]
    assert inputs["ip"] == berlin.ip
    assert inputs["user_agent"] == SAFARI_IPHONE
    assert inputs["device"]["label"] == "Mobile Safari on iOS (iPhone)"
    assert re.fullmatch(r"[0-9a-f]{32}", inputs["device"]["fingerprint"])
    assert inputs["geoip"] is True
    assert inputs["place"] == {"country": "DE", "city": "Berlin", "network": berlin.network,
                               "latitude": berlin.latitude, "longitude": berlin.longitude}
    assert (inputs["ip_attempts"], inputs["destination_attempts"], inputs["failed_attempts"]) == (1, 1, 0)
    assert inputs["new_user"] is True and inputs["last_sign_in"] is None
    assert inputs["thresholds"] == {"challenge": 50, "block": 90}
    one = await decision(risk_project, d["id"])
    assert {k: v for k, v in one.items() if k != "request_id"} == d


async def test_the_second_sign_in_sees_the_first(risk_project: Project) -> None:
    """The inputs of a returning user: not new, the last located sign-in, the counters."""
    address = email()
    berlin = PLACES["berlin"]
    first = await _signed_in(risk_project, address, berlin.ip)
    await _signed_in(risk_project, address, berlin.ip)
    newest, oldest = (await _listed(risk_project.api))["data"]
    assert newest["user_id"] == oldest["user_id"] == first["user"]["id"]
    assert newest["inputs"]["new_user"] is False
    last = newest["inputs"]["last_sign_in"]
    assert {k: last[k] for k in ("country", "city", "latitude", "longitude")} == {
        "country": "DE", "city": "Berlin", "latitude": berlin.latitude, "longitude": berlin.longitude}
    assert ts(last["at"]) == ts(oldest["created_at"])
    assert (newest["inputs"]["ip_attempts"], newest["inputs"]["destination_attempts"]) == (2, 2)
    assert fired(newest) == set()
    assert {s["name"]: s["reason"] for s in newest["signals"]}["new_device"] == (
        "known device (Chrome on Mac OS X)")


async def test_only_enabled_signals_are_listed(risk_project: Project) -> None:
    r = await risk_project.api.request("PUT", "/v1/risk/policy", json={
        "threshold_challenge": 50, "threshold_block": 90,
        "signals": {"new_country": {"enabled": False, "weight": 20},
                    "failed_attempts": {"enabled": False, "weight": 30}}})
    assert r.status == 200, r.body
    await _signed_in(risk_project, email(), PLACES["paris"].ip)
    d = (await _listed(risk_project.api))["data"][0]
    assert [s["name"] for s in d["signals"]] == [
        n for n in signals.NAMES if n not in ("new_country", "failed_attempts")]


async def test_each_primary_sign_in_leaves_exactly_one_decision(risk_project: Project,
                                                                db: asyncpg.Pool) -> None:
    """A refused redemption (a used link) is no sign-in the engine scores: no decision."""
    address = email()
    before = len(await mailbox_messages(risk_project.api, address, count=0))
    assert (await send_link(risk_project.api, risk_project, address)).status == 200
    token = token_of(await latest_link(risk_project, address, count=before + 1))
    ok = await verify(risk_project.api, risk_project, token, headers=client(PLACES["berlin"].ip))
    assert ok.status == 200, ok.body
    again = await verify(risk_project.api, risk_project, token, headers=client(PLACES["berlin"].ip))
    assert_error(again, 410, "token_consumed")
    await _signed_in(risk_project, address, PLACES["berlin"].ip)
    page = await _listed(risk_project.api)
    assert len(page["data"]) == 2
    stored = await db.fetchval("SELECT count(*) FROM risk_decisions WHERE project_id = $1",
                               risk_project.id)
    assert stored == 2


# --- listing: order, filters, pages --------------------------------------------------------------


async def _five_decisions(project: Project) -> tuple[list[str], dict[str, str]]:
    """Five decisions: three of user A (allowed), one of user B (allowed), one blocked of user C;
    ids newest first, and the user ids by letter."""
    a, b, c = email(), email(), email()
    users = {}
    users["a"] = (await _signed_in(project, a, PLACES["berlin"].ip))["user"]["id"]
    users["b"] = (await _signed_in(project, b, PLACES["munich"].ip))["user"]["id"]
    await _signed_in(project, a, PLACES["berlin"].ip)
    blocked = await attempt(project, c, ip="203.0.113.50")
    assert_error(blocked, 403, "blocked_by_risk_policy")
    await _signed_in(project, a, PLACES["berlin"].ip, FIREFOX_WINDOWS)
    ids = [d["id"] for d in (await _listed(project.api))["data"]]
    assert len(ids) == 5
    users["c"] = (await decision(project, blocked.body["error"]["details"]["decision_id"]))["user_id"]
    return ids, users


async def test_decisions_are_listed_newest_first_and_filtered(risk_project: Project) -> None:
    ids, users = await _five_decisions(risk_project)
    assert ids == sorted(ids, reverse=True)
    every = (await _listed(risk_project.api))["data"]
    assert [d["user_id"] for d in every] == [users["a"], users["c"], users["a"], users["b"], users["a"]]
    assert [d["decision"] for d in every] == ["allow", "block", "allow", "allow", "allow"]

    of_a = (await _listed(risk_project.api, f"?user={users['a']}"))["data"]
    assert [d["id"] for d in of_a] == [ids[0], ids[2], ids[4]]
    assert (await _listed(risk_project.api, f"?user={users['b']}"))["data"][0]["id"] == ids[3]
    assert (await _listed(risk_project.api, "?user=user_01jd0000000000000000000000"))["data"] == []

    blocked = (await _listed(risk_project.api, "?decision=block"))["data"]
    assert [d["id"] for d in blocked] == [ids[1]]
    assert [d["id"] for d in (await _listed(risk_project.api, "?decision=allow"))["data"]] == [
        ids[0], ids[2], ids[3], ids[4]]
    assert (await _listed(risk_project.api, "?decision=challenge"))["data"] == []
    assert [d["id"] for d in (await _listed(
        risk_project.api, f"?decision=allow&user={users['b']}"))["data"]] == [ids[3]]


async def test_from_is_inclusive_and_to_exclusive(risk_project: Project) -> None:
    ids, _ = await _five_decisions(risk_project)
    every = {d["id"]: d["created_at"] for d in (await _listed(risk_project.api))["data"]}
    middle = every[ids[2]].replace("Z", "")  # no offset: UTC
    since = (await _listed(risk_project.api, f"?from={middle}"))["data"]
    assert [d["id"] for d in since] == ids[:3]
    until = (await _listed(risk_project.api, f"?to={middle}"))["data"]
    assert [d["id"] for d in until] == ids[3:]
    window = (await _listed(risk_project.api, f"?from={every[ids[3]]}&to={every[ids[1]]}"))["data"]
    assert [d["id"] for d in window] == [ids[2], ids[3]]
    assert (await _listed(risk_project.api, f"?from={middle}&to={middle}"))["data"] == []
    assert (await _listed(risk_project.api, "?from=2999-01-01T00:00:00Z"))["data"] == []


async def test_keyset_pages_have_no_gaps_nor_duplicates(risk_project: Project) -> None:
    ids, users = await _five_decisions(risk_project)
    seen: list[str] = []
    pages: list[tuple[int, bool]] = []
    cursor = None
    while True:
        query = "?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = await _listed(risk_project.api, query)
        seen += [d["id"] for d in page["data"]]
        pages.append((len(page["data"]), page["has_more"]))
        cursor = page["next_cursor"]
        assert (cursor is not None) == page["has_more"]
        if cursor is None:
            break
    assert pages == [(2, True), (2, True), (1, False)]
    assert seen == ids
    # A cursor keeps its position under a filter too.
    first = await _listed(risk_project.api, f"?limit=1&user={users['a']}")
    rest = await _listed(risk_project.api, f"?limit=5&user={users['a']}&cursor={first['next_cursor']}")
    assert [d["id"] for d in first["data"] + rest["data"]] == [ids[0], ids[2], ids[4]]
    assert rest["has_more"] is False and rest["next_cursor"] is None


@pytest.mark.parametrize(("query", "field"), [
    ("?cursor=abc", "cursor"),
    ("?cursor=" + "A" * 40 + "." + "B" * 22, "cursor"),
    ("?decision=maybe", "decision"),
    ("?user=", "user"),
    ("?from=yesterday", "from"),
    ("?to=2026-13-01T00:00:00Z", "to"),
    ("?from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z", "to"),
    ("?limit=0", "limit"),
    ("?limit=1001", "limit"),
    ("?status=allow", "status"),
])
async def test_a_bad_query_is_invalid_request_naming_it(risk_project: Project, query: str,
                                                        field: str) -> None:
    assert_invalid_field(await risk_project.api.get(DECISIONS + query), field)


async def test_another_projects_cursor_is_refused(risk_project: Project, risk_service: Api) -> None:
    other = await bootstrap_project(risk_service, "other")
    for _ in range(2):
        await _signed_in(other, email(), PLACES["berlin"].ip)
    cursor = (await _listed(other.api, "?limit=1"))["next_cursor"]
    assert cursor is not None
    assert (await _listed(other.api, f"?limit=1&cursor={cursor}"))["data"]
    assert_invalid_field(await risk_project.api.get(f"{DECISIONS}?limit=1&cursor={cursor}"), "cursor",
                         "is not a cursor this listing issued")


# --- one decision; projects; scopes --------------------------------------------------------------


async def test_another_projects_decision_is_not_found(risk_project: Project, risk_service: Api) -> None:
    other = await bootstrap_project(risk_service, "other")
    await _signed_in(other, email(), PLACES["berlin"].ip)
    theirs = (await _listed(other.api))["data"][0]["id"]
    assert (await other.api.get(f"{DECISIONS}/{theirs}")).status == 200
    assert_error(await risk_project.api.get(f"{DECISIONS}/{theirs}"), 404, "not_found")
    assert (await _listed(risk_project.api))["data"] == []
    assert (await _listed(risk_project.api, f"?user={(await _listed(other.api))['data'][0]['user_id']}"))[
        "data"] == []


@pytest.mark.parametrize("decision_id", [
    "rd_01jd0000000000000000000000", "rd_x", "abc", "user_01jd0000000000000000000000",
    "RD_01JD0000000000000000000000", "rd_01jd0000000000000000000000x"])
async def test_an_unknown_or_malformed_id_is_not_found(risk_project: Project, decision_id: str) -> None:
    await _signed_in(risk_project, email(), PLACES["berlin"].ip)
    assert_error(await risk_project.api.get(f"{DECISIONS}/{decision_id}"), 404, "not_found")


@pytest.mark.parametrize("scope", ["audit:read", "risk:write"])
async def test_a_key_with_audit_read_or_risk_write_may_read(risk_project: Project, scope: str) -> None:
    await _signed_in(risk_project, email(), PLACES["berlin"].ip)
    narrow = await scoped(risk_project, scope)
    page = await _listed(narrow)
    assert len(page["data"]) == 1
    one = await narrow.get(f"{DECISIONS}/{page['data'][0]['id']}")
    assert one.status == 200, one.body
    assert one.body["id"] == page["data"][0]["id"]


@pytest.mark.parametrize("scopes", [("users:read",), ("users:read", "users:write"), ("authz:check",)])
async def test_other_scopes_may_not_read(risk_project: Project, scopes: tuple[str, ...]) -> None:
    await _signed_in(risk_project, email(), PLACES["berlin"].ip)
    decision_id = (await _listed(risk_project.api))["data"][0]["id"]
    narrow = await scoped(risk_project, *scopes)
    assert_error(await narrow.get(DECISIONS), 403, "insufficient_scope")
    assert_error(await narrow.get(f"{DECISIONS}/{decision_id}"), 403, "insufficient_scope")


async def test_decisions_need_a_key(risk_service: Api) -> None:
    r: Response = await risk_service.get(DECISIONS, key=None)
    assert_error(r, 401, "missing_api_key")
    assert_error(await risk_service.get(f"{DECISIONS}/rd_01jd0000000000000000000000", key=None), 401,
                 "missing_api_key")


async def test_a_challenged_decision_names_its_challenge(risk_project: Project) -> None:
    """A ``challenge`` decision has no session (yet) and names the step-up challenge it made;
    the ``decision`` filter finds it."""
    address = email()
    await _signed_in(risk_project, address, PLACES["berlin"].ip)
    await set_policy(risk_project, challenge=10, block=90)
    r = await attempt(risk_project, address, ip=PLACES["berlin"].ip, user_agent=FIREFOX_WINDOWS)
    assert_error(r, 401, "step_up_required")
    details = r.body["error"]["details"]
    challenged = (await _listed(risk_project.api, "?decision=challenge"))["data"]
    assert [d["id"] for d in challenged] == [details["decision_id"]]
    d = challenged[0]
    assert d["step_up_challenge_id"] == details["challenge_id"]
    assert d["session_id"] is None
    assert (d["score"], d["reasons"]) == (15, ["new device: Firefox on Windows"])
