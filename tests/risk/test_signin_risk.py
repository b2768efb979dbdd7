"""Sign-ins scored end to end (issue 19; SPEC.md 5.5 and 6): the public magic-link sign-in from an
address (``X-Forwarded-For`` behind the trusted loopback proxy, placed by the test GeoIP
database) and a device, and what the risk engine decided, answered, recorded and learned.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import asyncpg
import pytest_asyncio
from aiohttp import ClientSession

from common.settings import Settings
from control_plane.risk.signals.base import NO_GEO
from tests.fixtures.database import events
from tests.fixtures.geo import PLACES
from tests.fixtures.identity import email, latest_link, send_link, token_of, verify
from tests.fixtures.peers import mailbox_messages
from tests.fixtures.service import (
    ULID,
    Api,
    Project,
    Response,
    assert_error,
    bootstrap_project,
    combined_app,
    serving,
)
from tests.risk.helpers import (
    BLOCKED_NETWORK,
    CHROME_MAC,
    FIREFOX_WINDOWS,
    attempt,
    client,
    decision,
    fired,
    reason,
    set_policy,
)

BERLIN, PARIS, SYDNEY = PLACES["berlin"], PLACES["paris"], PLACES["sydney"]
GEO_SIGNALS = ("new_network", "new_country", "impossible_travel")


def _ok(r: Response) -> dict[str, Any]:
    assert r.status == 200, r.body
    return dict(r.body)


async def _latest(project: Project) -> dict[str, Any]:
    r = await project.api.get("/v1/risk/decisions?limit=1")
    assert r.status == 200, r.body
    return dict(r.body["data"][0])


async def _event(db: asyncpg.Pool, project_id: str, action: str) -> dict[str, Any]:
    """The project's newest event of ``action``."""
    found = await events(db, project_id, action)
    assert found, f"no {action} event"
    return found[-1]


async def _move_clock(db: asyncpg.Pool, user_id: str, interval: str) -> None:
    """Make the user's last located sign-in ``interval`` old."""
    status = await db.execute(
        f"UPDATE risk_last_locations SET signed_in_at = now() - interval '{interval}' WHERE user_id = $1",
        user_id)
    assert status == "UPDATE 1", status


async def _link(project: Project, address: str, also: Sequence[Api] = ()) -> str:
    """Send a sign-in link to ``address`` and read its token."""
    before = len(await mailbox_messages(project.api, address, count=0, also=also))
    assert (await send_link(project.api, project, address)).status == 200
    return token_of(await latest_link(project, address, count=before + 1, also=also))


def _no_cookie(r: Response) -> None:
    assert "Set-Cookie" not in r.headers, r.headers.getall("Set-Cookie")


# --- the first sign-in ---------------------------------------------------------------------------


async def test_a_first_sign_in_scores_zero_and_records_the_decision(risk_project: Project,
                                                                    db: asyncpg.Pool) -> None:
    r = await attempt(risk_project, email(), ip=BERLIN.ip)
    signed = _ok(r)
    assert any(c.startswith("service_session=") for c in r.headers.getall("Set-Cookie")), r.headers
    assert signed["user"]["email_verified"] is True
    user_id, session_id = signed["user"]["id"], signed["session"]["id"]

    attempt_event = await _event(db, risk_project.id, "auth.signin_attempt")
    meta = attempt_event["metadata"]
    assert (meta["outcome"], meta["score"], meta["decision"], meta["reasons"]) == ("success", 0, "allow", [])
    assert re.fullmatch(rf"rd_{ULID}", meta["decision_id"])
    assert meta["ip"] == BERLIN.ip and meta["user_agent"] == CHROME_MAC
    assert meta["device"]["label"] == "Chrome on Mac OS X"
    assert meta["device"]["user_agent"] == CHROME_MAC
    assert re.fullmatch(r"[0-9a-f]{32}", meta["device"]["fingerprint"])
    assert meta["session_id"] == session_id
    assert attempt_event["user_id"] == user_id and attempt_event["ip"] == BERLIN.ip

    evaluated = await _event(db, risk_project.id, "auth.risk_evaluated")
    assert evaluated["metadata"]["decision_id"] == meta["decision_id"]
    assert (evaluated["target_type"], evaluated["target_id"]) == ("risk_decision", meta["decision_id"])
    assert {k: evaluated["metadata"][k] for k in (
        "score", "decision", "signals", "reasons", "method", "threshold_challenge", "threshold_block")} == {
        "score": 0, "decision": "allow", "signals": [], "reasons": [], "method": "magic_link",
        "threshold_challenge": 50, "threshold_block": 90}
    assert evaluated["created_at"] == attempt_event["created_at"]  # one transaction

    row = await db.fetchrow("SELECT * FROM risk_decisions WHERE id = $1", meta["decision_id"])
    assert row is not None
    assert (row["project_id"], row["user_id"], row["session_id"], row["method"], row["score"],
            row["decision"], list(row["reasons"])) == (
        risk_project.id, user_id, session_id, "magic_link", 0, "allow", [])
    assert row["created_at"] == attempt_event["created_at"]
    d = await decision(risk_project, meta["decision_id"])
    assert (d["session_id"], d["user_id"], d["score"]) == (session_id, user_id, 0)


# --- history: devices, networks, countries -------------------------------------------------------


async def test_history_is_learned_and_a_new_place_and_device_fire(risk_project: Project,
                                                                  db: asyncpg.Pool) -> None:
    """Berlin with Chrome twice: the second sign-in fires nothing. Then Paris with Firefox, a day
    later (so the trip is possible): a new country, network and device, 20 + 10 + 15 = 45 on the
    default policy, allowed."""
    address = email()
    first = _ok(await attempt(risk_project, address, ip=BERLIN.ip, user_agent=CHROME_MAC))
    _ok(await attempt(risk_project, address, ip=BERLIN.ip, user_agent=CHROME_MAC))
    again = await _latest(risk_project)
    assert (fired(again), again["score"], again["decision"]) == (set(), 0, "allow")
    assert {s["name"]: s["reason"] for s in again["signals"] if s["name"] in (*GEO_SIGNALS, "new_device")} == {
        "new_device": "known device (Chrome on Mac OS X)",
        "new_network": f"known network {BERLIN.network}",
        "new_country": "known country DE",
        "impossible_travel": "0 km from the last sign-in (Berlin, DE to Berlin, DE)",
    }

    await _move_clock(db, first["user"]["id"], "30 hours")
    paris = _ok(await attempt(risk_project, address, ip=PARIS.ip, user_agent=FIREFOX_WINDOWS))
    d = await _latest(risk_project)
    assert d["session_id"] == paris["session"]["id"]
    assert fired(d) == {"new_country", "new_network", "new_device"}
    assert (d["score"], d["decision"]) == (45, "allow")
    assert {s["name"]: s["contribution"] for s in d["signals"] if s["fired"]} == {
        "new_country": 20, "new_network": 10, "new_device": 15}
    assert d["reasons"] == ["new device: Firefox on Windows", f"new network {PARIS.network}",
                            "new country FR"]
    assert re.fullmatch(r"8\d\d km in 30\.0 h \(Berlin, DE to Paris, FR\): possible",
                        reason(d, "impossible_travel")), reason(d, "impossible_travel")
    meta = (await _event(db, risk_project.id, "auth.signin_attempt"))["metadata"]
    assert (meta["score"], meta["decision"], meta["reasons"], meta["decision_id"]) == (
        45, "allow", d["reasons"], d["id"])
    assert meta["device"]["label"] == "Firefox on Windows"


async def test_a_score_at_the_challenge_threshold_requires_a_step_up(risk_project: Project,
                                                                     db: asyncpg.Pool) -> None:
    """With ``new_country`` at 60 the same trip scores 85: 401 ``step_up_required`` with a
    challenge, no cookie, no session, and the three events."""
    address = email()
    first = _ok(await attempt(risk_project, address, ip=BERLIN.ip))
    user_id = first["user"]["id"]
    await _move_clock(db, user_id, "30 hours")
    await set_policy(risk_project, new_country=60)
    r = await attempt(risk_project, address, ip=PARIS.ip, user_agent=FIREFOX_WINDOWS)
    assert_error(r, 401, "step_up_required")
    _no_cookie(r)
    details = r.body["error"]["details"]
    assert re.fullmatch(rf"chal_{ULID}", details["challenge_id"])
    assert re.fullmatch(rf"rd_{ULID}", details["decision_id"])
    assert "magic_link" in details["methods"]
    assert details["methods"] == ["magic_link"]  # no passkey registered
    assert details["expires_in"] == 300

    d = await decision(risk_project, details["decision_id"])
    assert (d["score"], d["decision"], d["session_id"], d["user_id"]) == (85, "challenge", None, user_id)
    assert d["step_up_challenge_id"] == details["challenge_id"]
    assert fired(d) == {"new_country", "new_network", "new_device"}
    sessions = await db.fetchval("SELECT count(*) FROM sessions WHERE user_id = $1", user_id)
    assert sessions == 1  # the first sign-in's only
    challenge = await db.fetchrow("SELECT * FROM step_up_challenges WHERE id = $1", details["challenge_id"])
    assert challenge is not None
    assert (challenge["user_id"], challenge["decision_id"], challenge["status"], challenge["method"]) == (
        user_id, d["id"], "pending", "magic_link")

    signin = await _event(db, risk_project.id, "auth.signin_attempt")
    meta = signin["metadata"]
    assert (meta["outcome"], meta["score"], meta["decision"], meta["decision_id"]) == (
        "challenged", 85, "challenge", d["id"])
    assert meta["reasons"] == d["reasons"]
    assert meta["ip"] == PARIS.ip and meta["user_agent"] == FIREFOX_WINDOWS
    assert "session_id" not in meta
    assert (signin["target_type"], signin["target_id"], signin["user_id"]) == ("risk_decision", d["id"], user_id)
    evaluated = await _event(db, risk_project.id, "auth.risk_evaluated")
    assert (evaluated["metadata"]["decision_id"], evaluated["metadata"]["score"],
            evaluated["metadata"]["decision"]) == (d["id"], 85, "challenge")
    required = await _event(db, risk_project.id, "auth.step_up_required")
    assert {k: required["metadata"][k] for k in ("challenge_id", "decision_id", "score", "threshold_challenge",
                                                 "expires_in", "method")} == {
        "challenge_id": details["challenge_id"], "decision_id": d["id"], "score": 85,
        "threshold_challenge": 50, "expires_in": 300, "method": "magic_link"}
    assert (required["target_type"], required["target_id"]) == ("step_up_challenge", details["challenge_id"])
    assert signin["created_at"] == evaluated["created_at"] == required["created_at"]  # one transaction
    # A refused sign-in teaches nothing: Paris and Firefox stay unknown.
    known = await db.fetch("SELECT kind, value FROM risk_known WHERE user_id = $1", user_id)
    assert sorted(k["kind"] for k in known) == ["country", "device", "network"]
    assert {k["value"] for k in known if k["kind"] != "device"} == {"DE", BERLIN.network}


async def test_a_refused_sign_in_attempt_records_the_device_as_the_risk_engine_saw_it(
        risk_project: Project, db: asyncpg.Pool) -> None:
    """``auth.signin_attempt`` of a challenged or blocked sign-in carries the device's label and
    fingerprint as a successful one does (SPEC.md 6: "every primary auth regardless of
    outcome; metadata has ... device")."""
    address = email()
    _ok(await attempt(risk_project, address, ip=BERLIN.ip))
    await set_policy(risk_project, challenge=10, block=90)
    challenged = await attempt(risk_project, address, ip=BERLIN.ip, user_agent=FIREFOX_WINDOWS)
    assert_error(challenged, 401, "step_up_required")
    d = await decision(risk_project, challenged.body["error"]["details"]["decision_id"])
    meta = (await _event(db, risk_project.id, "auth.signin_attempt"))["metadata"]
    assert meta["outcome"] == "challenged"
    assert meta["device"].get("label") == "Firefox on Windows", meta["device"]
    assert meta["device"].get("fingerprint") == d["inputs"]["device"]["fingerprint"], meta["device"]

    blocked = await attempt(risk_project, email(), ip="203.0.113.8", user_agent=FIREFOX_WINDOWS)
    assert_error(blocked, 403, "blocked_by_risk_policy")
    meta = (await _event(db, risk_project.id, "auth.signin_attempt"))["metadata"]
    assert meta["outcome"] == "blocked"
    assert meta["device"].get("label") == "Firefox on Windows", meta["device"]


# --- impossible travel ---------------------------------------------------------------------------


async def test_berlin_then_sydney_ten_minutes_later_is_impossible_travel(risk_project: Project,
                                                                         db: asyncpg.Pool) -> None:
    address = email()
    user_id = _ok(await attempt(risk_project, address, ip=BERLIN.ip))["user"]["id"]
    await _move_clock(db, user_id, "10 minutes")
    r = await attempt(risk_project, address, ip=SYDNEY.ip)
    # new country 20 + new network 10 + impossible travel 40 = 70: challenged on the default.
    assert_error(r, 401, "step_up_required")
    d = await decision(risk_project, r.body["error"]["details"]["decision_id"])
    assert fired(d) == {"impossible_travel", "new_country", "new_network"}
    assert (d["score"], d["decision"]) == (70, "challenge")
    why = reason(d, "impossible_travel")
    assert "Berlin" in why and "Sydney" in why and "faster than" in why
    m = re.fullmatch(r"([\d,]+) km in 10 min \(Berlin, DE to Sydney, AU\): faster than 1,000 km/h", why)
    assert m, why
    assert 16_000 <= int(m.group(1).replace(",", "")) <= 16_200  # great circle Berlin-Sydney
    assert why in d["reasons"]
    assert (d["inputs"]["last_sign_in"]["city"], d["inputs"]["last_sign_in"]["country"]) == ("Berlin", "DE")

    # The same trip over 30 hours is possible (about 535 km/h).
    await _move_clock(db, user_id, "30 hours")
    allowed = _ok(await attempt(risk_project, address, ip=SYDNEY.ip))
    d = await _latest(risk_project)
    assert d["session_id"] == allowed["session"]["id"]
    assert "impossible_travel" not in fired(d)
    assert re.fullmatch(r"[\d,]+ km in 30\.0 h \(Berlin, DE to Sydney, AU\): possible",
                        reason(d, "impossible_travel")), reason(d, "impossible_travel")
    assert (d["score"], d["decision"]) == (30, "allow")


async def test_a_short_trip_is_never_impossible_travel(risk_project: Project) -> None:
    """Berlin then Potsdam at once: about 27 km, under the 500 km floor, however fast."""
    address = email()
    _ok(await attempt(risk_project, address, ip=BERLIN.ip))
    _ok(await attempt(risk_project, address, ip=PLACES["potsdam"].ip))
    d = await _latest(risk_project)
    assert "impossible_travel" not in fired(d)
    m = re.fullmatch(r"(\d+) km from the last sign-in \(Berlin, DE to Potsdam, DE\)", reason(d, "impossible_travel"))
    assert m, reason(d, "impossible_travel")
    assert 20 <= int(m.group(1)) <= 30
    assert fired(d) == {"new_network"} and d["score"] == 10


async def test_a_place_without_location_cannot_judge_travel(risk_project: Project) -> None:
    address = email()
    _ok(await attempt(risk_project, address, ip=BERLIN.ip))
    _ok(await attempt(risk_project, address, ip=PLACES["netherlands"].ip))
    d = await _latest(risk_project)
    assert reason(d, "impossible_travel") == "not evaluated: the GeoIP database has no location for the address"
    assert fired(d) == {"new_country", "new_network"} and d["score"] == 30


# --- velocity ------------------------------------------------------------------------------------


async def test_more_than_five_attempts_from_one_address_fire_ip_velocity(risk_project: Project) -> None:
    """The risk service counts 5 attempts per address: the 6th (of six different users) fires
    ``ip_velocity`` (30, allowed); weighted at 60 the 7th is challenged."""
    ip = PLACES["munich"].ip
    for n in range(1, 6):
        _ok(await attempt(risk_project, email(), ip=ip))
        d = await _latest(risk_project)
        assert d["inputs"]["ip_attempts"] == n
        assert d["inputs"]["destination_attempts"] == 1
        assert "ip_velocity" not in fired(d)
        assert reason(d, "ip_velocity") == f"{n} attempt{'s' if n > 1 else ''} from {ip} in 10 min"
    _ok(await attempt(risk_project, email(), ip=ip))
    d = await _latest(risk_project)
    assert fired(d) == {"ip_velocity"}
    assert (d["score"], d["decision"]) == (30, "allow")
    assert reason(d, "ip_velocity") == f"6 attempts from {ip} in 10 min (more than 5)"

    await set_policy(risk_project, ip_velocity=60)
    r = await attempt(risk_project, email(), ip=ip)
    assert_error(r, 401, "step_up_required")
    _no_cookie(r)
    d = await decision(risk_project, r.body["error"]["details"]["decision_id"])
    assert (d["score"], d["decision"], fired(d)) == (60, "challenge", {"ip_velocity"})
    assert reason(d, "ip_velocity") == f"7 attempts from {ip} in 10 min (more than 5)"
    # Another address is counted on its own.
    _ok(await attempt(risk_project, email(), ip=BERLIN.ip))
    d = await _latest(risk_project)
    assert (d["inputs"]["ip_attempts"], d["score"]) == (1, 0)


async def test_the_sixth_attempt_from_one_address_is_challenged_when_velocity_weighs_60(
        risk_project: Project, db: asyncpg.Pool) -> None:
    ip = PLACES["new_york"].ip
    await set_policy(risk_project, ip_velocity=60)
    for _ in range(5):
        _ok(await attempt(risk_project, email(), ip=ip))
    r = await attempt(risk_project, email(), ip=ip)
    assert_error(r, 401, "step_up_required")
    _no_cookie(r)
    details = r.body["error"]["details"]
    d = await decision(risk_project, details["decision_id"])
    assert (d["score"], d["decision"], fired(d)) == (60, "challenge", {"ip_velocity"})
    assert d["reasons"] == [f"6 attempts from {ip} in 10 min (more than 5)"]
    required = await _event(db, risk_project.id, "auth.step_up_required")
    assert (required["metadata"]["challenge_id"], required["metadata"]["decision_id"],
            required["metadata"]["score"]) == (details["challenge_id"], d["id"], 60)


async def test_more_than_four_attempts_on_one_account_fire_destination_velocity(
        risk_project: Project) -> None:
    address = email()
    addresses = [BERLIN.ip, PLACES["berlin_mobile"].ip]  # two addresses: counted per account
    for n in range(1, 5):
        _ok(await attempt(risk_project, address, ip=addresses[n % 2]))
        d = await _latest(risk_project)
        assert d["inputs"]["destination_attempts"] == n
        assert "destination_velocity" not in fired(d)
        assert reason(d, "destination_velocity") == f"{n} attempt{'s' if n > 1 else ''} on this account in 10 min"
    _ok(await attempt(risk_project, address, ip=BERLIN.ip))
    d = await _latest(risk_project)
    assert fired(d) == {"destination_velocity"}
    assert reason(d, "destination_velocity") == "5 attempts on this account in 10 min (more than 4)"
    assert (d["score"], d["decision"]) == (35, "allow")


# --- failed attempts -----------------------------------------------------------------------------


async def test_refused_redemptions_before_a_sign_in_fire_failed_attempts(risk_project: Project,
                                                                         db: asyncpg.Pool) -> None:
    """Three redemptions of a used link of the user (each 410 and a failed
    ``auth.signin_attempt``), then a good sign-in: ``failed_attempts`` fires."""
    address = email()
    user_id = _ok(await attempt(risk_project, address, ip=BERLIN.ip))["user"]["id"]
    token = await _link(risk_project, address)
    _ok(await verify(risk_project.api, risk_project, token, headers=client(BERLIN.ip)))
    for _ in range(3):
        assert_error(await verify(risk_project.api, risk_project, token, headers=client(BERLIN.ip)),
                     410, "token_consumed")
    failures = [e for e in await events(db, risk_project.id, "auth.signin_attempt")
                if e["metadata"]["outcome"] == "failure"]
    assert [(e["user_id"], e["metadata"]["reason"]) for e in failures] == [(user_id, "token_consumed")] * 3
    _ok(await attempt(risk_project, address, ip=BERLIN.ip))
    d = await _latest(risk_project)
    assert fired(d) == {"failed_attempts"}
    assert reason(d, "failed_attempts") == "3 refused sign-ins in the last 15 min (at least 3)"
    assert (d["inputs"]["failed_attempts"], d["score"], d["decision"]) == (3, 30, "allow")


async def test_two_refused_redemptions_are_not_enough(risk_project: Project) -> None:
    address = email()
    _ok(await attempt(risk_project, address, ip=BERLIN.ip))
    token = await _link(risk_project, address)
    _ok(await verify(risk_project.api, risk_project, token, headers=client(BERLIN.ip)))
    for _ in range(2):
        assert_error(await verify(risk_project.api, risk_project, token), 410, "token_consumed")
    _ok(await attempt(risk_project, address, ip=BERLIN.ip))
    d = await _latest(risk_project)
    assert "failed_attempts" not in fired(d)
    assert reason(d, "failed_attempts") == "2 refused sign-ins in the last 15 min"


async def test_replays_of_the_link_that_created_the_user_count_as_its_failed_attempts(
        risk_project: Project, db: asyncpg.Pool) -> None:
    """The link of a first sign-in, redeemed again, is a refused sign-in of the user it created:
    recorded about that user, and counted by ``failed_attempts``."""
    address = email()
    token = await _link(risk_project, address)
    user_id = _ok(await verify(risk_project.api, risk_project, token, headers=client(BERLIN.ip)))["user"]["id"]
    for _ in range(3):
        assert_error(await verify(risk_project.api, risk_project, token, headers=client(BERLIN.ip)),
                     410, "token_consumed")
    failures = [e for e in await events(db, risk_project.id, "auth.signin_attempt")
                if e["metadata"]["outcome"] == "failure"]
    assert len(failures) == 3
    assert [e["user_id"] for e in failures] == [user_id] * 3
    _ok(await attempt(risk_project, address, ip=BERLIN.ip))
    assert "failed_attempts" in fired(await _latest(risk_project))


# --- known-bad networks --------------------------------------------------------------------------


async def test_a_sign_in_from_a_blocked_network_is_refused(risk_project: Project, db: asyncpg.Pool) -> None:
    """403 ``blocked_by_risk_policy`` with the decision, no cookie, no session, the three events;
    the link is used up all the same."""
    address = email()
    user_id = _ok(await attempt(risk_project, address, ip=BERLIN.ip))["user"]["id"]
    token = await _link(risk_project, address)
    r = await verify(risk_project.api, risk_project, token, headers=client("203.0.113.7", FIREFOX_WINDOWS))
    assert_error(r, 403, "blocked_by_risk_policy")
    _no_cookie(r)
    decision_id = r.body["error"]["details"]["decision_id"]
    assert re.fullmatch(rf"rd_{ULID}", decision_id)
    d = await decision(risk_project, decision_id)
    assert (d["decision"], d["session_id"], d["step_up_challenge_id"], d["user_id"]) == (
        "block", None, None, user_id)
    # blocked_network 100 + new_device 15, capped at 100.
    assert fired(d) == {"blocked_network", "new_device"}
    assert sum(s["contribution"] for s in d["signals"]) == 115 and d["score"] == 100
    assert reason(d, "blocked_network") == f"203.0.113.7 is in the blocked network {BLOCKED_NETWORK}"
    assert d["inputs"]["ip"] == "203.0.113.7" and d["inputs"]["place"] is None
    assert {reason(d, n) for n in GEO_SIGNALS} == {"not evaluated: the address is not in the GeoIP database"}

    assert await db.fetchval("SELECT count(*) FROM sessions WHERE user_id = $1", user_id) == 1
    assert await db.fetchval("SELECT count(*) FROM step_up_challenges WHERE decision_id = $1", decision_id) == 0
    signin = await _event(db, risk_project.id, "auth.signin_attempt")
    assert {k: signin["metadata"][k] for k in ("outcome", "score", "decision", "decision_id", "reasons", "ip")} == {
        "outcome": "blocked", "score": 100, "decision": "block", "decision_id": decision_id,
        "reasons": d["reasons"], "ip": "203.0.113.7"}
    assert "session_id" not in signin["metadata"]
    evaluated = await _event(db, risk_project.id, "auth.risk_evaluated")
    assert (evaluated["metadata"]["decision_id"], evaluated["metadata"]["decision"]) == (decision_id, "block")
    blocked = await _event(db, risk_project.id, "auth.blocked_by_risk_policy")
    assert {k: blocked["metadata"][k] for k in ("decision_id", "score", "threshold_block")} == {
        "decision_id": decision_id, "score": 100, "threshold_block": 90}
    assert (blocked["target_type"], blocked["target_id"], blocked["user_id"]) == (
        "risk_decision", decision_id, user_id)
    assert signin["created_at"] == evaluated["created_at"] == blocked["created_at"]
    assert await events(db, risk_project.id, "auth.step_up_required") == []

    # The link is used up: redeemed again (from anywhere) it is 410, and no session either.
    assert_error(await verify(risk_project.api, risk_project, token, headers=client(BERLIN.ip)),
                 410, "token_consumed")
    assert await db.fetchval("SELECT count(*) FROM sessions WHERE user_id = $1", user_id) == 1


async def test_a_first_sign_in_from_a_blocked_network_starts_no_session(risk_project: Project,
                                                                        db: asyncpg.Pool) -> None:
    r = await attempt(risk_project, email(), ip="203.0.113.200")
    assert_error(r, 403, "blocked_by_risk_policy")
    _no_cookie(r)
    assert await db.fetchval("SELECT count(*) FROM sessions WHERE project_id = $1", risk_project.id) == 0
    d = await decision(risk_project, r.body["error"]["details"]["decision_id"])
    assert (d["score"], d["decision"], d["inputs"]["new_user"]) == (100, "block", True)


async def test_an_ipv4_mapped_address_of_a_blocked_network_is_blocked(risk_project: Project) -> None:
    r = await attempt(risk_project, email(), ip="::ffff:203.0.113.9")
    assert_error(r, 403, "blocked_by_risk_policy")
    d = await decision(risk_project, r.body["error"]["details"]["decision_id"])
    assert fired(d) == {"blocked_network"}
    assert reason(d, "blocked_network") == f"::ffff:203.0.113.9 is in the blocked network {BLOCKED_NETWORK}"


async def test_behind_the_trusted_proxy_the_address_it_saw_counts_not_the_clients_claim(
        risk_project: Project) -> None:
    """``X-Forwarded-For`` is read from the right: the entry the trusted proxy appended (the
    peer it saw) is the client; what the client put further left is its own claim."""
    claimed_good = await attempt(risk_project, email(), ip=f"{BERLIN.ip}, 203.0.113.30")
    assert_error(claimed_good, 403, "blocked_by_risk_policy")
    d = await decision(risk_project, claimed_good.body["error"]["details"]["decision_id"])
    assert d["inputs"]["ip"] == "203.0.113.30"

    claimed_bad = _ok(await attempt(risk_project, email(), ip=f"203.0.113.31, {BERLIN.ip}"))
    d = await _latest(risk_project)
    assert d["session_id"] == claimed_bad["session"]["id"]
    assert (d["inputs"]["ip"], d["inputs"]["place"]["city"], d["score"]) == (BERLIN.ip, "Berlin", 0)


# --- what a sign-in teaches, and what a deleted user leaves --------------------------------------


async def test_a_sign_in_teaches_devices_and_location_and_a_deleted_user_leaves_none(
        risk_project: Project, db: asyncpg.Pool) -> None:
    address = email()
    first = _ok(await attempt(risk_project, address, ip=BERLIN.ip, user_agent=CHROME_MAC))
    user_id = first["user"]["id"]
    chrome = (await _latest(risk_project))["inputs"]["device"]["fingerprint"]
    known = {(r["kind"], r["value"]) for r in await db.fetch(
        "SELECT kind, value FROM risk_known WHERE user_id = $1", user_id)}
    assert known == {("device", chrome), ("network", BERLIN.network), ("country", "DE")}
    last = await db.fetchrow("SELECT * FROM risk_last_locations WHERE user_id = $1", user_id)
    assert last is not None
    assert (last["ip"], last["country"], last["city"], last["latitude"], last["longitude"]) == (
        BERLIN.ip, "DE", "Berlin", BERLIN.latitude, BERLIN.longitude)

    await _move_clock(db, user_id, "30 hours")
    second = _ok(await attempt(risk_project, address, ip=PARIS.ip, user_agent=FIREFOX_WINDOWS))
    firefox = (await _latest(risk_project))["inputs"]["device"]["fingerprint"]
    known = {(r["kind"], r["value"]) for r in await db.fetch(
        "SELECT kind, value FROM risk_known WHERE user_id = $1", user_id)}
    assert known == {("device", chrome), ("device", firefox), ("network", BERLIN.network),
                     ("network", PARIS.network), ("country", "DE"), ("country", "FR")}
    last = await db.fetchrow("SELECT * FROM risk_last_locations WHERE user_id = $1", user_id)
    assert (last["ip"], last["country"], last["city"]) == (PARIS.ip, "FR", "Paris")
    assert last["signed_in_at"] == (await db.fetchval(
        "SELECT created_at FROM sessions WHERE id = $1", second["session"]["id"]))

    # A pending challenge of the user, then the user deleted.
    await set_policy(risk_project, challenge=10, block=90)
    challenged = await attempt(risk_project, address, ip=SYDNEY.ip)
    assert_error(challenged, 401, "step_up_required")
    assert await db.fetchval("SELECT count(*) FROM step_up_challenges WHERE user_id = $1", user_id) == 1
    decision_ids = [d["id"] for d in (await risk_project.api.get(
        f"/v1/risk/decisions?user={user_id}")).body["data"]]
    assert len(decision_ids) == 3

    gone = await risk_project.api.delete(f"/v1/users/{user_id}")
    assert gone.status == 200, gone.body
    for table in ("risk_known", "risk_last_locations", "step_up_challenges"):
        assert await db.fetchval(f"SELECT count(*) FROM {table} WHERE user_id = $1", user_id) == 0, table
    for decision_id in decision_ids:
        d = await decision(risk_project, decision_id)
        assert d["user_id"] is None
    assert (await risk_project.api.get(f"/v1/risk/decisions?user={user_id}")).body["data"] == []


async def test_an_ipv6_address_is_placed(risk_project: Project) -> None:
    v6 = PLACES["berlin_v6"]
    _ok(await attempt(risk_project, email(), ip=v6.ip))
    d = await _latest(risk_project)
    assert d["inputs"]["ip"] == v6.ip
    assert d["inputs"]["place"] == {"country": "DE", "city": "Berlin", "network": v6.network,
                                    "latitude": v6.latitude, "longitude": v6.longitude}


async def test_ipv6_and_ipv4_in_the_same_city_are_one_country_two_networks(risk_project: Project) -> None:
    address = email()
    _ok(await attempt(risk_project, address, ip=BERLIN.ip))
    _ok(await attempt(risk_project, address, ip=PLACES["berlin_v6"].ip))
    d = await _latest(risk_project)
    assert fired(d) == {"new_network"}
    assert reason(d, "new_country") == "known country DE"
    assert reason(d, "impossible_travel") == "0 km from the last sign-in (Berlin, DE to Berlin, DE)"


# --- a service without trusted proxies nor GeoIP database ----------------------------------------


@pytest_asyncio.fixture
async def plain_service(risk_settings_factory: Callable[..., Settings], http: ClientSession,
                        risk_service: Api) -> AsyncIterator[tuple[Api, Project, list[Api]]]:
    """The service as the default ``service`` fixture runs it (no trusted proxy, no GeoIP
    database) on the risk tests' database, started for this test only so that its outbox worker
    does not go on delivering other tests' links; with a project of its own and the other
    running app whose worker may deliver this project's links (``risk_service``)."""
    async with serving(http, combined_app(risk_settings_factory())) as api:
        project = await bootstrap_project(api, "plain")
        yield api, project, [risk_service]


async def test_a_spoofed_forwarded_for_from_an_untrusted_peer_is_ignored(
        plain_service: tuple[Api, Project, list[Api]], db: asyncpg.Pool) -> None:
    """Without ``SERVICE_TRUSTED_PROXIES`` the client address is the peer (127.0.0.1) whatever
    ``X-Forwarded-For`` says: nobody picks their own score (or place)."""
    _, project, also = plain_service
    token = await _link(project, email(), also=also)
    r = await verify(project.api, project, token,
                     headers={"User-Agent": CHROME_MAC, "X-Forwarded-For": "203.0.113.7"})
    signed = _ok(r)
    d = await _latest(project)
    assert d["session_id"] == signed["session"]["id"]
    assert d["inputs"]["ip"] == "127.0.0.1"
    assert (d["score"], d["decision"]) == (0, "allow")
    assert reason(d, "ip_velocity").endswith("from 127.0.0.1 in 10 min")
    assert {reason(d, n) for n in GEO_SIGNALS} == {NO_GEO}
    meta = (await _event(db, project.id, "auth.signin_attempt"))["metadata"]
    assert meta["ip"] == "127.0.0.1"


async def test_without_a_geoip_database_the_geo_signals_say_so(
        plain_service: tuple[Api, Project, list[Api]], db: asyncpg.Pool) -> None:
    _, project, also = plain_service
    address = email()
    for ua in (CHROME_MAC, FIREFOX_WINDOWS):
        token = await _link(project, address, also=also)
        _ok(await verify(project.api, project, token,
                         headers={"User-Agent": ua, "X-Forwarded-For": SYDNEY.ip}))
    d = await _latest(project)
    assert fired(d) == {"new_device"}  # devices still count
    for name in GEO_SIGNALS:
        signal = next(s for s in d["signals"] if s["name"] == name)
        assert signal == {"name": name, "fired": False, "contribution": 0, "reason": NO_GEO}
    assert "SERVICE_GEOIP_DATABASE" in NO_GEO
    assert d["inputs"]["geoip"] is False and d["inputs"]["place"] is None
    assert d["inputs"]["last_sign_in"] is None
    known = {r["kind"] for r in await db.fetch("SELECT kind FROM risk_known WHERE user_id = $1", d["user_id"])}
    assert known == {"device"}
    assert await db.fetchval("SELECT count(*) FROM risk_last_locations WHERE user_id = $1", d["user_id"]) == 0
