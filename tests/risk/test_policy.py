"""The risk policy over HTTP: ``GET``/``PUT /v1/risk/policy`` (DESIGN.md "risk"; SPEC.md 6
``risk.policy.updated``): the documented default, what a ``PUT`` stores and records, what it
refuses, who may call it, and that sign-ins are scored by it.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from control_plane.risk import signals
from tests.fixtures.database import events
from tests.fixtures.geo import PLACES
from tests.fixtures.identity import email
from tests.fixtures.service import (
    Api,
    Project,
    assert_error,
    assert_invalid_field,
    bootstrap_project,
    scoped,
    ts,
)
from tests.risk.helpers import CHROME_MAC, FIREFOX_WINDOWS, attempt, decision, fired, reason

POLICY = "/v1/risk/policy"
UPDATED = "risk.policy.updated"


def _default_signals() -> dict[str, dict[str, Any]]:
    return {name: {"enabled": True, "weight": signals.DEFAULT_WEIGHTS[name],
                   "description": signals.DESCRIPTIONS[name]} for name in signals.NAMES}


def _stored(body: dict[str, Any]) -> dict[str, Any]:
    """A policy answer without its request id."""
    return {k: v for k, v in body.items() if k != "request_id"}


async def _put(api: Api, body: Any) -> Any:
    return await api.request("PUT", POLICY, json=body)


async def _get(project: Project) -> dict[str, Any]:
    r = await project.api.get(POLICY)
    assert r.status == 200, r.body
    return _stored(r.body)


# --- the default ---------------------------------------------------------------------------------


async def test_a_new_project_has_the_documented_default(risk_project: Project) -> None:
    r = await risk_project.api.get(POLICY)
    assert r.status == 200, r.body
    assert _stored(r.body) == {"threshold_challenge": 50, "threshold_block": 90,
                               "signals": _default_signals(), "default": True, "updated_at": None}
    assert list(r.body["signals"]) == list(signals.NAMES)  # in the order decisions list them
    assert all(s["description"] for s in r.body["signals"].values())


def test_the_default_weights_are_the_documented_ones() -> None:
    """DESIGN.md/issue 19: no place or device signal alone, nor all of them together, blocks;
    a known-bad network alone does."""
    assert signals.DEFAULT_WEIGHTS == {
        "new_device": 15, "new_network": 10, "new_country": 20, "impossible_travel": 40,
        "ip_velocity": 30, "destination_velocity": 35, "failed_attempts": 30, "blocked_network": 100}
    place_and_device = sum(signals.DEFAULT_WEIGHTS[n] for n in
                           ("new_device", "new_network", "new_country", "impossible_travel"))
    assert place_and_device == 85 < 90 <= signals.DEFAULT_WEIGHTS["blocked_network"]


# --- PUT -----------------------------------------------------------------------------------------


async def test_put_stores_thresholds_and_signals_and_records_the_update(
        risk_project: Project, db: asyncpg.Pool) -> None:
    """Signals left out keep their defaults; GET answers what PUT answered; one
    ``risk.policy.updated`` per PUT, committed with the change (same transaction time)."""
    body = {"threshold_challenge": 40, "threshold_block": 80, "signals": {
        "new_device": {"enabled": False, "weight": 15},
        "ip_velocity": {"enabled": False, "weight": 0},
        "new_country": {"weight": 55},  # enabled by default
    }}
    r = await _put(risk_project.api, body)
    assert r.status == 200, r.body
    expected = _default_signals()
    expected["new_device"]["enabled"] = False
    expected["ip_velocity"].update(enabled=False, weight=0)
    expected["new_country"]["weight"] = 55
    put = _stored(r.body)
    assert put["default"] is False
    assert put.pop("updated_at") is not None
    assert put == {"threshold_challenge": 40, "threshold_block": 80, "signals": expected,
                   "default": False}
    assert await _get(risk_project) == _stored(r.body)

    recorded = await events(db, risk_project.id, UPDATED)
    assert len(recorded) == 1
    event = recorded[0]
    assert event["metadata"]["threshold_challenge"] == 40
    assert event["metadata"]["threshold_block"] == 80
    assert event["metadata"]["enabled_signals"] == 6
    assert event["metadata"]["signals"] == {n: {"enabled": s["enabled"], "weight": s["weight"]}
                                            for n, s in expected.items()}
    assert event["target_type"] == "risk_policy" and event["target_id"] == risk_project.id
    assert event["actor_type"] == "api_key" and event["actor_id"] == risk_project.key_id
    assert event["created_at"] == ts(r.body["updated_at"])  # one transaction

    # A second PUT replaces the whole policy: what it leaves out is back at its default.
    second = await _put(risk_project.api, {"threshold_challenge": 10, "threshold_block": 11})
    assert second.status == 200, second.body
    assert second.body["signals"] == _default_signals()
    assert ts(second.body["updated_at"]) > ts(r.body["updated_at"])
    assert await _get(risk_project) == _stored(second.body)
    recorded = await events(db, risk_project.id, UPDATED)
    assert [e["metadata"]["enabled_signals"] for e in recorded] == [6, 8]
    assert (recorded[1]["metadata"]["threshold_challenge"],
            recorded[1]["metadata"]["threshold_block"]) == (10, 11)
    assert recorded[1]["created_at"] == ts(second.body["updated_at"])


async def test_the_extreme_thresholds_are_accepted(risk_project: Project) -> None:
    r = await _put(risk_project.api, {"threshold_challenge": 0, "threshold_block": 100,
                                      "signals": {"blocked_network": {"weight": 0},
                                                  "new_device": {"weight": 100}}})
    assert r.status == 200, r.body
    assert (r.body["threshold_challenge"], r.body["threshold_block"]) == (0, 100)
    assert r.body["signals"]["blocked_network"] == {
        "enabled": True, "weight": 0, "description": signals.DESCRIPTIONS["blocked_network"]}
    assert r.body["signals"]["new_device"]["weight"] == 100


GOOD: dict[str, Any] = {"threshold_challenge": 50, "threshold_block": 90}


@pytest.mark.parametrize(("body", "field", "message"), [
    ({**GOOD, "signals": {"bogus": {"enabled": True, "weight": 5}}}, "signals",
     "unknown signal 'bogus'; the signals are " + ", ".join(signals.NAMES)),
    ({"threshold_challenge": 90, "threshold_block": 90}, "threshold_block",
     "must be greater than threshold_challenge"),
    ({"threshold_challenge": 91, "threshold_block": 90}, "threshold_block",
     "must be greater than threshold_challenge"),
    ({"threshold_challenge": -1, "threshold_block": 90}, "threshold_challenge",
     "Input should be greater than or equal to 0"),
    ({"threshold_challenge": 50, "threshold_block": 101}, "threshold_block",
     "Input should be less than or equal to 100"),
    ({**GOOD, "signals": {"new_device": {"weight": 101}}}, "signals.new_device.weight",
     "Input should be less than or equal to 100"),
    ({**GOOD, "signals": {"new_country": {"weight": -5}}}, "signals.new_country.weight",
     "Input should be greater than or equal to 0"),
    ({"threshold_challenge": 50.5, "threshold_block": 90}, "threshold_challenge",
     "Input should be a valid integer"),
    ({"threshold_challenge": "50", "threshold_block": 90}, "threshold_challenge",
     "Input should be a valid integer"),
    ({"threshold_challenge": True, "threshold_block": 90}, "threshold_challenge",
     "Input should be a valid integer"),
    ({**GOOD, "signals": {"ip_velocity": {"weight": 2.5}}}, "signals.ip_velocity.weight",
     "Input should be a valid integer"),
    ({**GOOD, "signals": {"ip_velocity": {"enabled": False}}}, "signals.ip_velocity.weight",
     "Field required"),
    ({**GOOD, "signals": {"ip_velocity": {"weight": 5, "enabled": "no"}}},
     "signals.ip_velocity.enabled", "Input should be a valid boolean"),
    ({**GOOD, "signals": {"ip_velocity": {"weight": 5, "boost": 2}}}, "signals.ip_velocity.boost",
     "unknown field"),
    ({**GOOD, "signals": ["new_device"]}, "signals", "Input should be a valid dictionary"),
    ({**GOOD, "default": False}, "default", "unknown field"),
    ({**GOOD, "threshold_allow": 10}, "threshold_allow", "unknown field"),
    ({"threshold_challenge": 50}, "threshold_block", "Field required"),
    ({"threshold_block": 90}, "threshold_challenge", "Field required"),
], ids=["unknown-signal", "challenge-equals-block", "challenge-above-block", "challenge-negative",
        "block-over-100", "weight-over-100", "weight-negative", "threshold-float",
        "threshold-string", "threshold-bool", "weight-float", "weight-missing",
        "enabled-not-bool", "signal-unknown-field", "signals-not-object", "default-field",
        "unknown-top-level-field", "missing-block", "missing-challenge"])
async def test_a_refused_put_names_the_field_and_changes_nothing(
        risk_project: Project, db: asyncpg.Pool, body: dict[str, Any], field: str,
        message: str) -> None:
    before = await _put(risk_project.api, {"threshold_challenge": 30, "threshold_block": 70,
                                           "signals": {"new_network": {"weight": 33}}})
    assert before.status == 200, before.body
    r = await _put(risk_project.api, body)
    assert_invalid_field(r, field, message)
    assert await _get(risk_project) == _stored(before.body)
    assert len(await events(db, risk_project.id, UPDATED)) == 1


async def test_a_refused_put_on_a_new_project_leaves_the_default(
        risk_project: Project, db: asyncpg.Pool) -> None:
    for bad in ({"threshold_challenge": 70, "threshold_block": 60},
                {**GOOD, "signals": {"nope": {"weight": 1}}}):
        assert_error(await _put(risk_project.api, bad), 400, "invalid_request")
    malformed = await risk_project.api.request("PUT", POLICY, data=b"{not json",
                                               headers={"Content-Type": "application/json"})
    assert_error(malformed, 400, "invalid_request")
    empty = await _put(risk_project.api, {})
    assert_error(empty, 400, "invalid_request")
    named = {f["field"] for f in empty.body["error"]["details"]["fields"]}
    assert {"threshold_challenge", "threshold_block"} <= named
    policy = await _get(risk_project)
    assert policy["default"] is True and policy["updated_at"] is None
    assert await events(db, risk_project.id, UPDATED) == []


# --- who may call it -----------------------------------------------------------------------------


async def test_a_risk_write_key_may_read_and_set_the_policy(risk_project: Project,
                                                          db: asyncpg.Pool) -> None:
    narrow = await scoped(risk_project, "risk:write")
    r = await narrow.get(POLICY)
    assert r.status == 200, r.body
    assert r.body["default"] is True
    r = await _put(narrow, {"threshold_challenge": 20, "threshold_block": 60})
    assert r.status == 200, r.body
    assert (await _get(risk_project))["threshold_block"] == 60
    recorded = await events(db, risk_project.id, UPDATED)
    assert len(recorded) == 1 and recorded[0]["actor_type"] == "api_key"
    assert recorded[0]["actor_id"] != risk_project.key_id  # the narrow key did it


@pytest.mark.parametrize("scopes", [("users:read",), ("audit:read",), ("users:read", "users:write")])
async def test_a_key_without_risk_write_may_not_touch_the_policy(
        risk_project: Project, db: asyncpg.Pool, scopes: tuple[str, ...]) -> None:
    narrow = await scoped(risk_project, *scopes)
    assert_error(await narrow.get(POLICY), 403, "insufficient_scope")
    assert_error(await _put(narrow, GOOD), 403, "insufficient_scope")
    assert (await _get(risk_project))["default"] is True
    assert await events(db, risk_project.id, UPDATED) == []


async def test_the_policy_needs_a_key(risk_project: Project, risk_service: Api) -> None:
    assert_error(await risk_service.get(POLICY, key=None), 401, "missing_api_key")
    assert_error(await risk_service.request("PUT", POLICY, json=GOOD, key=None), 401,
                 "missing_api_key")
    forged = "sk_live_" + "A" * 43
    assert_error(await risk_service.get(POLICY, key=forged), 401, "invalid_api_key")
    assert_error(await risk_service.request("PUT", POLICY, json=GOOD, key=forged), 401,
                 "invalid_api_key")
    assert (await _get(risk_project))["default"] is True


async def test_another_projects_put_does_not_change_this_one(risk_project: Project,
                                                              risk_service: Api,
                                                              db: asyncpg.Pool) -> None:
    mine = await _put(risk_project.api, {"threshold_challenge": 35, "threshold_block": 75})
    assert mine.status == 200, mine.body
    other = await bootstrap_project(risk_service, "other")
    theirs = await _put(other.api, {"threshold_challenge": 5, "threshold_block": 6,
                                    "signals": {"blocked_network": {"enabled": False, "weight": 0}}})
    assert theirs.status == 200, theirs.body
    assert await _get(risk_project) == _stored(mine.body)
    assert await _get(other) == _stored(theirs.body)
    assert len(await events(db, risk_project.id, UPDATED)) == 1
    assert [e["metadata"]["enabled_signals"] for e in await events(db, other.id, UPDATED)] == [7]


# --- the policy is applied -----------------------------------------------------------------------


async def test_a_disabled_blocked_network_signal_lets_the_sign_in_through(risk_project: Project) -> None:
    """With ``blocked_network`` off a sign-in from the known-bad network is allowed, and the
    decision does not list the signal; with it back at its default weight (100) the next one is
    blocked."""
    r = await _put(risk_project.api, {**GOOD, "signals": {
        "blocked_network": {"enabled": False, "weight": 100}}})
    assert r.status == 200, r.body
    allowed = await attempt(risk_project, email(), ip="203.0.113.20")
    assert allowed.status == 200, allowed.body
    listed = await risk_project.api.get("/v1/risk/decisions?limit=1")
    assert listed.status == 200, listed.body
    d = listed.body["data"][0]
    assert d["session_id"] == allowed.body["session"]["id"]
    assert (d["score"], d["decision"]) == (0, "allow")
    assert [s["name"] for s in d["signals"]] == [n for n in signals.NAMES if n != "blocked_network"]

    r = await _put(risk_project.api, GOOD)
    assert r.status == 200, r.body
    assert r.body["signals"]["blocked_network"]["weight"] == 100
    blocked = await attempt(risk_project, email(), ip="203.0.113.21")
    assert_error(blocked, 403, "blocked_by_risk_policy")
    d = await decision(risk_project, blocked.body["error"]["details"]["decision_id"])
    assert (d["score"], d["decision"], fired(d)) == (100, "block", {"blocked_network"})
    assert reason(d, "blocked_network") == "203.0.113.21 is in the blocked network 203.0.113.0/24"


@pytest.mark.parametrize(("challenge", "block", "status", "outcome"), [
    (16, 90, 200, "allow"),
    (15, 90, 401, "challenge"),  # at the challenge threshold: challenged
    (14, 15, 403, "block"),      # at the block threshold: blocked
    (0, 16, 401, "challenge"),
])
async def test_the_thresholds_are_inclusive(risk_project: Project, challenge: int, block: int,
                                            status: int, outcome: str) -> None:
    """A new device alone scores its weight (15): the decision is ``challenge`` at or above
    ``threshold_challenge`` and ``block`` at or above ``threshold_block``."""
    address = email()
    first = await attempt(risk_project, address, ip=PLACES["berlin"].ip, user_agent=CHROME_MAC)
    assert first.status == 200, first.body
    r = await _put(risk_project.api, {"threshold_challenge": challenge, "threshold_block": block})
    assert r.status == 200, r.body
    second = await attempt(risk_project, address, ip=PLACES["berlin"].ip,
                           user_agent=FIREFOX_WINDOWS)
    assert second.status == status, second.body
    listed = await risk_project.api.get("/v1/risk/decisions?limit=1")
    d = listed.body["data"][0]
    assert (d["score"], d["decision"], fired(d)) == (15, outcome, {"new_device"})
    assert d["inputs"]["thresholds"] == {"challenge": challenge, "block": block}


async def test_a_weight_of_zero_fires_but_adds_nothing(risk_project: Project) -> None:
    address = email()
    assert (await attempt(risk_project, address, ip=PLACES["berlin"].ip)).status == 200
    r = await _put(risk_project.api, {**GOOD, "signals": {"new_device": {"weight": 0}}})
    assert r.status == 200, r.body
    second = await attempt(risk_project, address, ip=PLACES["berlin"].ip, user_agent=FIREFOX_WINDOWS)
    assert second.status == 200, second.body
    d = (await risk_project.api.get("/v1/risk/decisions?limit=1")).body["data"][0]
    new_device = next(s for s in d["signals"] if s["name"] == "new_device")
    assert new_device == {"name": "new_device", "fired": True, "contribution": 0,
                          "reason": "new device: Firefox on Windows"}
    assert (d["score"], d["reasons"]) == (0, ["new device: Firefox on Windows"])
