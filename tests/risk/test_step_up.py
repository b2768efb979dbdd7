"""Step-up end to end (DESIGN.md "risk", issue 19 "Decisions, events, step-up"): a sign-in the
risk engine challenges answers 401 ``step_up_required`` with a ``chal_`` challenge; a fresh
passkey assertion of the same user (``POST /v1/auth/step-up/passkey/options`` and ``/verify``)
or a step-up magic link (``POST /v1/auth/step-up/magic-link/send``, redeemed by
``POST /v1/auth/magic-link/verify``) satisfies it and answers what a sign-in answers. A failed,
expired, used, other user's or other project's challenge issues nothing, ever.

Every test challenges its user the same way: a first sign-in from Berlin, then one from Sydney
on the same device with a policy that challenges at 20 and blocks at 90 (new country 20, new
network 10 and impossible travel 40: score 70).
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
from dataclasses import dataclass
from typing import Any, Final

import asyncpg
import pytest

from tests.fixtures.database import events
from tests.fixtures.geo import PLACES
from tests.fixtures.identity import (
    SignedIn,
    add_member,
    email,
    link_in,
    make_org,
    session_call,
    token_of,
    verify,
)
from tests.fixtures.peers import mailbox_messages
from tests.fixtures.service import (
    ULID,
    Api,
    Project,
    Response,
    assert_error,
    assert_invalid_field,
    bootstrap_project,
)
from tests.fixtures.webauthn import SoftAuthenticator, b64url
from tests.passkeys.helpers import ORIGIN, RP_ID, configure, login_options, login_verify, register
from tests.risk.helpers import attempt, client, decision, fired, set_policy, step_up_call

BERLIN: Final = PLACES["berlin"].ip
SYDNEY: Final = PLACES["sydney"].ip
TTL: Final = 300
"""``SERVICE_STEP_UP_TTL_SECONDS`` by default: five minutes."""
SCORE: Final = 70
"""Berlin then Sydney at once on the same device: new country 20 + new network 10 + impossible
travel 40."""
FIRED: Final = {"new_country", "new_network", "impossible_travel"}
SIGN_IN_FIELDS: Final = {"session", "user", "access_token", "token_type", "expires_in", "refresh_token",
                          "request_id"}


# --- helpers ----------------------------------------------------------------------------------


@dataclass
class Challenged:
    """A user whose sign-in from Sydney was challenged (``details`` of the 401), with the
    authenticator holding their passkey when they have one."""

    project: Project
    address: str
    user_id: str
    details: dict[str, Any]
    authenticator: SoftAuthenticator | None = None
    passkey: dict[str, Any] | None = None

    @property
    def challenge_id(self) -> str:
        return str(self.details["challenge_id"])

    @property
    def decision_id(self) -> str:
        return str(self.details["decision_id"])


def _no_cookie(r: Response) -> None:
    assert "service_session" not in r.headers.get("Set-Cookie", ""), r.headers


def _signed_in(r: Response, user_id: str) -> None:
    """A sign-in's answer: the envelope for ``user_id`` and its access token as the cookie."""
    assert r.status == 200, r.body
    assert set(r.body) == SIGN_IN_FIELDS, r.body
    assert r.body["user"]["id"] == user_id
    assert r.body["session"]["user_id"] == user_id
    assert r.body["session"]["status"] == "active"
    assert re.fullmatch(rf"sess_{ULID}", r.body["session"]["id"]), r.body
    assert r.body["token_type"] == "Bearer"
    assert r.body["refresh_token"].startswith("rt_")
    assert r.headers["Set-Cookie"].startswith(f"service_session={r.body['access_token']};")


async def _ready(project: Project, *, passkeys: bool = True) -> None:
    """The step-up policy (challenge at 20, block at 90) and, with ``passkeys``, a relying party."""
    if passkeys:
        await configure(project)
    await set_policy(project, challenge=20, block=90)


async def _user(project: Project, address: str, *, passkey: bool) -> tuple[SignedIn, SoftAuthenticator | None,
                                                                           dict[str, Any] | None]:
    """A user signed in from Berlin (allowed), with a registered passkey when ``passkey``."""
    r = await attempt(project, address, ip=BERLIN)
    assert r.status == 200, r.body
    user = SignedIn(r.body, r)
    if not passkey:
        return user, None, None
    authenticator = SoftAuthenticator(ORIGIN)
    return user, authenticator, await register(project, user, authenticator)


async def _challenged(project: Project, *, passkey: bool = True, address: str | None = None) -> Challenged:
    """A new user (see :func:`_user`; ``address`` an e-mail address or phone number) whose next
    sign-in, from Sydney, is challenged."""
    address = address or email()
    user, authenticator, registered = await _user(project, address, passkey=passkey)
    r = await attempt(project, address, ip=SYDNEY)
    assert_error(r, 401, "step_up_required")
    _no_cookie(r)
    return Challenged(project, address, user.user_id, r.body["error"]["details"], authenticator,
                      registered)


async def _options(c: Challenged, challenge_id: str | None = None,
                   project: Project | None = None) -> Response:
    return await step_up_call(project or c.project, "passkey/options",
                              {"challenge_id": challenge_id or c.challenge_id}, client(SYDNEY))


async def _verify(c: Challenged, credential: dict[str, Any], challenge_id: str | None = None,
                  project: Project | None = None) -> Response:
    return await step_up_call(project or c.project, "passkey/verify",
                              {"challenge_id": challenge_id or c.challenge_id, **credential},
                              client(SYDNEY))


async def _send(c: Challenged, challenge_id: str | None = None,
                project: Project | None = None) -> Response:
    return await step_up_call(project or c.project, "magic-link/send",
                              {"challenge_id": challenge_id or c.challenge_id}, client(SYDNEY))


def _any_assertion() -> dict[str, Any]:
    """A well-formed assertion by a passkey no project has, over a challenge never issued."""
    authenticator = SoftAuthenticator(ORIGIN)
    authenticator.create({"rp": {"id": RP_ID}, "user": {"id": b64url(b"nobody")},
                          "challenge": b64url(os.urandom(32))})
    return authenticator.get({"rpId": RP_ID, "challenge": b64url(os.urandom(32))})


def _stray_assertion(c: Challenged) -> dict[str, Any]:
    """A well-formed assertion by the user's passkey over a challenge the service never issued."""
    assert c.authenticator is not None
    return c.authenticator.get({"rpId": RP_ID, "challenge": b64url(os.urandom(32))})


async def _step_up_message(c: Challenged) -> dict[str, Any]:
    """Send the step-up link of ``c`` and answer the message the dev mailbox got."""
    before = len(await mailbox_messages(c.project.api, c.address, count=0))
    r = await _send(c)
    assert r.status == 200, r.body
    return (await mailbox_messages(c.project.api, c.address, count=before + 1))[0]


async def _step_up_token(c: Challenged) -> str:
    return token_of(link_in((await _step_up_message(c))["text"]))


async def _redeem(c: Challenged, token: str) -> Response:
    return await verify(c.project.api, c.project, token, headers=client(SYDNEY))


async def _challenge_row(db: asyncpg.Pool, challenge_id: str) -> dict[str, Any]:
    row = await db.fetchrow("SELECT * FROM step_up_challenges WHERE id = $1", challenge_id)
    assert row is not None
    return dict(row)


async def _sessions(db: asyncpg.Pool, user_id: str) -> list[str]:
    """The user's sessions, oldest first."""
    return [r["id"] for r in await db.fetch(
        "SELECT id FROM sessions WHERE user_id = $1 ORDER BY created_at, id", user_id)]


async def _expire(db: asyncpg.Pool, challenge_id: str) -> None:
    """Move the challenge's clock past its five minutes."""
    await db.execute("UPDATE step_up_challenges SET expires_at = now() - interval '1 second' "
                     "WHERE id = $1", challenge_id)


async def _satisfied_events(db: asyncpg.Pool, project: Project) -> list[dict[str, Any]]:
    return await events(db, project.id, "auth.step_up_satisfied")


async def _refused_everywhere(c: Challenged, state: str, *, project: Project | None = None) -> None:
    """Options, verify and link send with the challenge: each 400 ``unknown_or_expired_challenge``
    naming it in ``state``, no cookie."""
    credential = _stray_assertion(c) if c.authenticator is not None else _any_assertion()
    for r in (await _options(c, project=project), await _verify(c, credential, project=project),
              await _send(c, project=project)):
        assert_error(r, 400, "unknown_or_expired_challenge")
        assert r.body["error"]["details"] == {"challenge_id": c.challenge_id, "state": state}
        _no_cookie(r)


# --- the challenge ----------------------------------------------------------------------------


async def test_a_challenged_sign_in_answers_the_challenge_and_no_session(
        risk_project: Project, db: asyncpg.Pool) -> None:
    p = risk_project
    await _ready(p)
    c = await _challenged(p)
    assert re.fullmatch(rf"chal_{ULID}", c.challenge_id), c.details
    assert re.fullmatch(rf"rd_{ULID}", c.decision_id), c.details
    assert c.details == {"challenge_id": c.challenge_id, "decision_id": c.decision_id,
                         "methods": ["passkey", "magic_link"], "expires_in": TTL}
    assert len(await _sessions(db, c.user_id)) == 1  # the Berlin one only

    d = await decision(p, c.decision_id)
    assert (d["decision"], d["score"], d["session_id"]) == ("challenge", SCORE, None)
    assert fired(d) == FIRED
    assert d["step_up_challenge_id"] == c.challenge_id and d["user_id"] == c.user_id

    row = await _challenge_row(db, c.challenge_id)
    assert (row["status"], row["satisfied_by"], row["session_id"], row["used_at"]) == (
        "pending", None, None, None)
    assert (row["project_id"], row["user_id"], row["decision_id"], row["method"]) == (
        p.id, c.user_id, c.decision_id, "magic_link")
    lifetime = (row["expires_at"] - row["created_at"]).total_seconds()
    assert abs(lifetime - TTL) < 1, lifetime

    required = await events(db, p.id, "auth.step_up_required")
    assert len(required) == 1
    assert required[0]["target_type"] == "step_up_challenge"
    assert required[0]["target_id"] == c.challenge_id and required[0]["user_id"] == c.user_id
    assert required[0]["metadata"] == {
        "challenge_id": c.challenge_id, "decision_id": c.decision_id, "score": SCORE,
        "threshold_challenge": 20, "reasons": d["reasons"], "method": "magic_link",
        "expires_in": TTL, "description": f"Step-up required: risk score {SCORE} reached 20"}
    assert await _satisfied_events(db, p) == []


# --- satisfied by passkey ---------------------------------------------------------------------


async def test_a_passkey_assertion_satisfies_the_challenge_and_signs_in(
        risk_project: Project, risk_service: Api, db: asyncpg.Pool) -> None:
    p = risk_project
    await _ready(p)
    c = await _challenged(p)
    assert c.authenticator is not None and c.passkey is not None

    r = await _options(c)
    assert r.status == 200, r.body
    assert r.body["rpId"] == RP_ID
    assert [cred["id"] for cred in r.body["allowCredentials"]] == [c.passkey["credential_id"]]
    assert r.body["allowCredentials"][0]["type"] == "public-key"
    assert (await _challenge_row(db, c.challenge_id))["status"] == "pending"  # options use nothing

    r = await _verify(c, c.authenticator.get(r.body))
    _signed_in(r, c.user_id)
    session_id = r.body["session"]["id"]
    # The session the challenged sign-in would have started: its method is the primary one.
    assert r.body["session"]["auth_method"] == "magic_link"
    sessions = await _sessions(db, c.user_id)
    assert len(sessions) == 2 and sessions[1] == session_id

    me = await session_call(risk_service, "GET", "/v1/sessions/me", r.body["access_token"])
    assert me.status == 200, me.body
    assert me.body["session"]["id"] == session_id and me.body["user"]["id"] == c.user_id
    passkeys = await p.api.get(f"/v1/users/{c.user_id}/passkeys")
    assert passkeys.status == 200, passkeys.body
    assert [(k["id"], k["sign_count"]) for k in passkeys.body["data"]] == [(c.passkey["id"], 1)]
    assert passkeys.body["data"][0]["last_used_at"] is not None

    d = await decision(p, c.decision_id)
    assert (d["decision"], d["session_id"], d["step_up_challenge_id"]) == (
        "challenge", session_id, c.challenge_id)
    row = await _challenge_row(db, c.challenge_id)
    assert (row["status"], row["satisfied_by"], row["session_id"]) == ("satisfied", "passkey", session_id)
    assert row["used_at"] is not None

    required = await events(db, p.id, "auth.step_up_required")
    satisfied = await _satisfied_events(db, p)
    assert len(required) == 1 and len(satisfied) == 1
    assert (required[0]["created_at"], required[0]["id"]) < (satisfied[0]["created_at"], satisfied[0]["id"])
    event = satisfied[0]
    assert (event["target_type"], event["target_id"], event["user_id"]) == (
        "step_up_challenge", c.challenge_id, c.user_id)
    meta = event["metadata"]
    assert {k: meta[k] for k in ("method", "outcome", "challenge_id", "session_id",
                                 "primary_method", "passkey_id", "ip")} == {
        "method": "step_up_passkey", "outcome": "success", "challenge_id": c.challenge_id,
        "session_id": session_id, "primary_method": "magic_link",
        "passkey_id": c.passkey["id"], "ip": SYDNEY}, meta
    # (its decision_id: test_step_up_satisfied_names_the_challenged_decision)
    # The step-up's sign-in is not scored again: no second decision.
    listed = await p.api.get(f"/v1/risk/decisions?user={c.user_id}")
    assert listed.status == 200, listed.body
    assert [x["decision"] for x in listed.body["data"]] == ["challenge", "allow"]


# --- satisfied by magic link ------------------------------------------------------------------


async def test_a_step_up_link_satisfies_the_challenge_and_signs_in(
        risk_project: Project, risk_service: Api, db: asyncpg.Pool) -> None:
    """A project without passkeys: the only way is a link, sent to the user's verified address
    (masked in the answer), redeemed like any link, once."""
    p = risk_project
    await _ready(p, passkeys=False)
    c = await _challenged(p, passkey=False)
    assert c.details["methods"] == ["magic_link"]
    # The user has no passkey (and the project no relying party): no passkey step-up.
    assert_invalid_field(await _options(c), "challenge_id", "the user has no passkey; use a step-up link")
    assert (await _challenge_row(db, c.challenge_id))["status"] == "pending"

    before = len(await mailbox_messages(p.api, c.address, count=0))
    r = await _send(c)
    assert r.status == 200, r.body
    assert {k: v for k, v in r.body.items() if k not in ("request_id", "expires_in")} == {
        "sent": True, "channel": "email", "destination": f"{c.address[0]}***@example.com"}
    assert TTL - 5 <= r.body["expires_in"] <= TTL  # what the challenge has left
    assert c.address not in r.raw.decode()
    messages = await mailbox_messages(p.api, c.address, count=before + 1)
    message = messages[0]
    assert (message["kind"], message["channel"], message["destination"]) == ("step_up", "email", c.address)
    assert message["subject"] == "Confirm your sign-in to risk"
    assert "confirm" in message["text"] and "expires in 5 minutes" in message["text"]
    token = token_of(link_in(message["text"]))
    assert (await _challenge_row(db, c.challenge_id))["status"] == "pending"  # sending uses nothing

    r = await _redeem(c, token)
    _signed_in(r, c.user_id)
    session_id = r.body["session"]["id"]
    assert r.body["session"]["auth_method"] == "magic_link"
    me = await session_call(risk_service, "GET", "/v1/sessions/me", r.body["access_token"])
    assert me.status == 200 and me.body["session"]["id"] == session_id

    row = await _challenge_row(db, c.challenge_id)
    assert (row["status"], row["satisfied_by"], row["session_id"]) == ("satisfied", "magic_link", session_id)
    assert (await decision(p, c.decision_id))["session_id"] == session_id
    satisfied = await _satisfied_events(db, p)
    assert len(satisfied) == 1
    assert (satisfied[0]["target_id"], satisfied[0]["user_id"]) == (c.challenge_id, c.user_id)
    meta = satisfied[0]["metadata"]
    assert {k: meta[k] for k in ("method", "outcome", "channel", "challenge_id",
                                 "session_id", "primary_method", "ip")} == {
        "method": "step_up_magic_link", "outcome": "success", "channel": "email",
        "challenge_id": c.challenge_id, "session_id": session_id,
        "primary_method": "magic_link", "ip": SYDNEY}, meta
    # (its decision_id: test_step_up_satisfied_names_the_challenged_decision)

    again = await _redeem(c, token)
    assert_error(again, 410, "token_consumed")
    _no_cookie(again)
    assert len(await _sessions(db, c.user_id)) == 2
    assert len(await _satisfied_events(db, p)) == 1


async def _satisfy(c: Challenged, method: str) -> Response:
    """Satisfy the challenge of ``c`` by ``method`` (``passkey`` or ``magic_link``), from Sydney."""
    if method == "passkey":
        assert c.authenticator is not None
        r = await _options(c)
        assert r.status == 200, r.body
        return await _verify(c, c.authenticator.get(r.body))
    return await _redeem(c, await _step_up_token(c))


@pytest.mark.parametrize("method", ["passkey", "magic_link"])
async def test_step_up_satisfied_names_the_challenged_decision(
        risk_project: Project, db: asyncpg.Pool, method: str) -> None:
    """``auth.step_up_satisfied`` carries the ``decision_id`` of the decision that challenged the
    sign-in (issue 19: every event asserted with its metadata), and does not describe that
    decision as an unscored ``allow``.

    Product bug: ``sessions/service.py`` ``_with_risk`` merges ``Assessment.attempt_metadata()``
    of the step-up's unscored assessment (``{"score": None, "decision": "allow", "reasons": [],
    "decision_id": None}``) into every event it is given, the step-up's event too, overwriting
    the ``decision_id`` the passkey and magic-link step-ups put there."""
    p = risk_project
    await _ready(p)
    c = await _challenged(p, passkey=method == "passkey")
    _signed_in(await _satisfy(c, method), c.user_id)
    satisfied = await _satisfied_events(db, p)
    assert len(satisfied) == 1
    meta = satisfied[0]["metadata"]
    assert meta["decision_id"] == c.decision_id, meta
    assert meta.get("decision") in (None, "challenge"), meta


# --- used, expired ----------------------------------------------------------------------------


async def test_a_satisfied_challenge_is_refused_afterwards(risk_project: Project, db: asyncpg.Pool) -> None:
    """Single use: once satisfied, every step-up call with it is refused, and a link sent before
    it was satisfied (by passkey) signs nobody in."""
    p = risk_project
    await _ready(p)
    c = await _challenged(p)
    assert c.authenticator is not None
    token = await _step_up_token(c)
    r = await _options(c)
    assert r.status == 200, r.body
    assertion = c.authenticator.get(r.body)
    r = await _verify(c, assertion)
    _signed_in(r, c.user_id)
    sessions = await _sessions(db, c.user_id)
    assert len(sessions) == 2

    await _refused_everywhere(c, "used")
    r = await _verify(c, assertion)  # the very assertion that satisfied it, replayed
    assert_error(r, 400, "unknown_or_expired_challenge")
    _no_cookie(r)
    r = await _redeem(c, token)
    assert_error(r, 400, "unknown_or_expired_challenge")
    _no_cookie(r)
    assert await _sessions(db, c.user_id) == sessions
    row = await _challenge_row(db, c.challenge_id)
    assert (row["status"], row["satisfied_by"], row["session_id"]) == ("satisfied", "passkey", sessions[1])
    assert len(await _satisfied_events(db, p)) == 1


async def test_a_satisfied_challenge_by_link_is_refused_afterwards(
        risk_project: Project, db: asyncpg.Pool) -> None:
    p = risk_project
    await _ready(p)
    c = await _challenged(p)
    r = await _redeem(c, await _step_up_token(c))
    _signed_in(r, c.user_id)
    await _refused_everywhere(c, "used")
    assert len(await _sessions(db, c.user_id)) == 2


async def test_an_expired_challenge_issues_nothing(risk_project: Project, db: asyncpg.Pool) -> None:
    """Five minutes later (the clock moved in the database): options, verify and send are
    refused, and neither options nor a link obtained before the expiry sign anyone in."""
    p = risk_project
    await _ready(p)
    c = await _challenged(p)
    assert c.authenticator is not None
    token = await _step_up_token(c)
    r = await _options(c)
    assert r.status == 200, r.body
    early_assertion = c.authenticator.get(r.body)
    await _expire(db, c.challenge_id)

    await _refused_everywhere(c, "expired")
    r = await _verify(c, early_assertion)
    assert_error(r, 400, "unknown_or_expired_challenge")
    _no_cookie(r)
    r = await _redeem(c, token)  # the link itself has not expired; its challenge has
    assert_error(r, 400, "unknown_or_expired_challenge")
    _no_cookie(r)
    assert_error(await _redeem(c, token), 410, "token_consumed")

    assert len(await _sessions(db, c.user_id)) == 1
    assert (await _challenge_row(db, c.challenge_id))["status"] == "pending"
    assert (await decision(p, c.decision_id))["session_id"] is None
    assert await _satisfied_events(db, p) == []


async def test_a_step_up_link_expires_with_its_challenge(risk_project: Project, db: asyncpg.Pool) -> None:
    """The link lives as long as the challenge: moved past both, the link is expired."""
    p = risk_project
    await _ready(p, passkeys=False)
    c = await _challenged(p, passkey=False)
    token = await _step_up_token(c)
    await _expire(db, c.challenge_id)
    await db.execute("UPDATE magic_link_tokens SET expires_at = now() - interval '1 second' "
                     "WHERE step_up_id = $1", c.challenge_id)
    r = await _redeem(c, token)
    assert_error(r, 410, "token_expired")
    _no_cookie(r)
    assert len(await _sessions(db, c.user_id)) == 1
    assert await _satisfied_events(db, p) == []


# --- another user, a failed assertion, another project ---------------------------------------


async def test_another_users_passkey_is_refused_and_uses_the_challenge_up(
        risk_project: Project, db: asyncpg.Pool) -> None:
    """B answers A's challenge with B's own (valid) passkey: refused, nobody signed in, and A's
    challenge is failed: A's own correct assertion afterwards is refused too."""
    p = risk_project
    await _ready(p)
    a = await _challenged(p)
    assert a.authenticator is not None
    b, b_authenticator, _ = await _user(p, email(), passkey=True)
    assert b_authenticator is not None

    r = await _options(a)
    assert r.status == 200, r.body
    options_a = r.body
    a_assertion = a.authenticator.get(options_a)
    r = await _verify(a, b_authenticator.get(options_a, credential=b_authenticator.credentials[0]))
    assert_error(r, 400, "unknown_or_expired_challenge")
    _no_cookie(r)
    assert len(await _sessions(db, a.user_id)) == 1 and len(await _sessions(db, b.user_id)) == 1
    row = await _challenge_row(db, a.challenge_id)
    assert (row["status"], row["satisfied_by"], row["session_id"]) == ("failed", None, None)
    assert row["used_at"] is not None

    failure = (await events(db, p.id, "auth.signin_attempt"))[-1]["metadata"]
    assert (failure["outcome"], failure["method"], failure["reason"], failure["challenge_id"]) == (
        "failure", "step_up_passkey", "unknown_or_expired_challenge", a.challenge_id)

    r = await _verify(a, a_assertion)  # A's own, over the same options: too late
    assert_error(r, 400, "unknown_or_expired_challenge")
    await _refused_everywhere(a, "failed")
    assert len(await _sessions(db, a.user_id)) == 1 and len(await _sessions(db, b.user_id)) == 1
    assert (await decision(p, a.decision_id))["session_id"] is None
    assert await _satisfied_events(db, p) == []


async def test_a_failed_assertion_fails_the_challenge_for_good(risk_project: Project, db: asyncpg.Pool) -> None:
    """A tampered signature: 400 ``verification_failed``, the challenge ``failed``, and neither a
    retry nor a link sent before the failure signs in."""
    p = risk_project
    await _ready(p)
    c = await _challenged(p)
    assert c.authenticator is not None
    token = await _step_up_token(c)
    r = await _options(c)
    assert r.status == 200, r.body
    r = await _verify(c, c.authenticator.get(r.body, tamper=True))
    assert_error(r, 400, "verification_failed")
    _no_cookie(r)
    row = await _challenge_row(db, c.challenge_id)
    assert (row["status"], row["satisfied_by"]) == ("failed", None)

    await _refused_everywhere(c, "failed")
    r = await _redeem(c, token)
    assert_error(r, 400, "unknown_or_expired_challenge")
    _no_cookie(r)
    assert len(await _sessions(db, c.user_id)) == 1
    assert await _satisfied_events(db, p) == []
    failures = [e["metadata"] for e in await events(db, p.id, "auth.signin_attempt")
                if e["metadata"].get("outcome") == "failure"]
    assert [(f["method"], f["reason"]) for f in failures] == [
        ("step_up_passkey", "verification_failed"), ("magic_link", "unknown_or_expired_challenge")]


async def test_an_unknown_assertion_challenge_fails_the_step_up(risk_project: Project, db: asyncpg.Pool) -> None:
    """An assertion over a WebAuthn challenge the service never issued is refused and uses the
    step-up up (a refused assertion issues nothing, ever)."""
    p = risk_project
    await _ready(p)
    c = await _challenged(p)
    r = await _verify(c, _stray_assertion(c))
    assert_error(r, 400, "unknown_or_expired_challenge")
    _no_cookie(r)
    assert (await _challenge_row(db, c.challenge_id))["status"] == "failed"
    assert len(await _sessions(db, c.user_id)) == 1


async def test_another_projects_challenge_is_unknown_and_left_alone(
        risk_project: Project, risk_service: Api, db: asyncpg.Pool) -> None:
    """Project B naming A's challenge: unknown there; A's challenge stays pending and works."""
    p = risk_project
    await _ready(p)
    c = await _challenged(p)
    assert c.authenticator is not None
    other = await bootstrap_project(risk_service, "other")
    await configure(other)
    await _refused_everywhere(c, "unknown", project=other)
    assert (await _challenge_row(db, c.challenge_id))["status"] == "pending"

    # Nor can B's verify use options A's challenge issued.
    r = await _options(c)
    assert r.status == 200, r.body
    r = await _verify(c, c.authenticator.get(r.body), project=other)
    assert_error(r, 400, "unknown_or_expired_challenge")
    assert (await _challenge_row(db, c.challenge_id))["status"] == "pending"

    r = await _options(c)
    assert r.status == 200, r.body
    _signed_in(await _verify(c, c.authenticator.get(r.body)), c.user_id)


# --- step-up options against plain login options ----------------------------------------------


async def test_step_up_options_do_not_serve_a_plain_login(risk_project: Project, db: asyncpg.Pool) -> None:
    """An assertion over step-up options cannot skip the step-up through the plain login."""
    p = risk_project
    await _ready(p)
    c = await _challenged(p)
    assert c.authenticator is not None
    r = await _options(c)
    assert r.status == 200, r.body
    r = await login_verify(p, c.authenticator.get(r.body))
    assert_error(r, 400, "unknown_or_expired_challenge")
    _no_cookie(r)
    assert len(await _sessions(db, c.user_id)) == 1
    assert await _satisfied_events(db, p) == []
    # The plain login names no step-up, so the step-up is left as it was.
    assert (await _challenge_row(db, c.challenge_id))["status"] == "pending"


async def test_plain_login_options_do_not_serve_a_step_up(risk_project: Project, db: asyncpg.Pool) -> None:
    p = risk_project
    await _ready(p)
    c = await _challenged(p)
    assert c.authenticator is not None
    for body in ({}, {"email": c.address}):
        plain = await login_options(p, body)
        assert plain.status == 200, plain.body
        r = await _verify(c, c.authenticator.get(plain.body))
        assert_error(r, 400, "unknown_or_expired_challenge")
        _no_cookie(r)
    assert (await _challenge_row(db, c.challenge_id))["status"] == "failed"
    assert len(await _sessions(db, c.user_id)) == 1
    assert await _satisfied_events(db, p) == []


async def test_options_of_one_step_up_do_not_serve_another(risk_project: Project, db: asyncpg.Pool) -> None:
    """The same user challenged twice: options issued for the first challenge are refused for
    the second, which is used up; the first is left pending."""
    p = risk_project
    await _ready(p)
    first = await _challenged(p)
    assert first.authenticator is not None
    r = await attempt(p, first.address, ip=PLACES["new_york"].ip)
    assert_error(r, 401, "step_up_required")
    second = Challenged(p, first.address, first.user_id, r.body["error"]["details"],
                        first.authenticator, first.passkey)
    assert second.challenge_id != first.challenge_id

    r = await _options(first)
    assert r.status == 200, r.body
    r = await _verify(second, first.authenticator.get(r.body))
    assert_error(r, 400, "unknown_or_expired_challenge")
    assert (await _challenge_row(db, second.challenge_id))["status"] == "failed"
    assert (await _challenge_row(db, first.challenge_id))["status"] == "pending"
    assert len(await _sessions(db, first.user_id)) == 1


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("challenge_id", [
    "", "chal_", "chal_123", "rd_" + "0" * 26, "chal_" + "0" * 25, "chal_" + "0" * 27,
    "CHAL_" + "0" * 26, "chal_" + "A" * 26, " chal_" + "0" * 26])
async def test_a_malformed_challenge_id_is_invalid(risk_project: Project, challenge_id: str) -> None:
    p = risk_project
    await _ready(p)
    for path in ("passkey/options", "magic-link/send"):
        assert_invalid_field(await step_up_call(p, path, {"challenge_id": challenge_id}), "challenge_id")
    credential = _any_assertion()
    assert_invalid_field(await step_up_call(p, "passkey/verify", {"challenge_id": challenge_id, **credential}),
                         "challenge_id")


async def test_bodies_are_strict(risk_project: Project) -> None:
    p = risk_project
    await _ready(p)
    challenge_id = "chal_" + "0" * 26
    for path in ("passkey/options", "magic-link/send"):
        assert_invalid_field(await step_up_call(p, path, {}), "challenge_id")
        assert_invalid_field(await step_up_call(p, path, {"challenge_id": 7}), "challenge_id")
        assert_invalid_field(await step_up_call(p, path, {"challenge_id": challenge_id, "email": "a@b.c"}),
                             "email", "unknown field")
    assert_invalid_field(await step_up_call(p, "passkey/verify", {"challenge_id": challenge_id}), "id")
    credential = _any_assertion()
    assert_invalid_field(await step_up_call(p, "passkey/verify", credential), "challenge_id")
    assert_invalid_field(await step_up_call(p, "passkey/verify",
                                            {"challenge_id": challenge_id, **credential, "user_id": "x"}),
                         "user_id", "unknown field")
    # Well formed but unknown.
    for path, body in (("passkey/options", {}), ("magic-link/send", {}), ("passkey/verify", credential)):
        r = await step_up_call(p, path, {"challenge_id": challenge_id, **body})
        assert_error(r, 400, "unknown_or_expired_challenge")
        assert r.body["error"]["details"] == {"challenge_id": challenge_id, "state": "unknown"}


# --- a user without passkeys ------------------------------------------------------------------


async def test_a_user_without_passkeys_is_offered_the_link_only(risk_project: Project, db: asyncpg.Pool) -> None:
    """``methods`` is ``["magic_link"]``, and passkey options are refused: options with an empty
    ``allowCredentials`` would read as "any passkey of this site" to a browser. The challenge
    stays pending for the link."""
    p = risk_project
    await _ready(p)
    c = await _challenged(p, passkey=False)
    assert c.details["methods"] == ["magic_link"]

    assert_invalid_field(await _options(c), "challenge_id", "the user has no passkey; use a step-up link")
    assert (await _challenge_row(db, c.challenge_id))["status"] == "pending"
    _signed_in(await _satisfy(c, "magic_link"), c.user_id)
    assert len(await _sessions(db, c.user_id)) == 2


# --- what a step-up teaches -------------------------------------------------------------------


@pytest.mark.parametrize("method", ["passkey", "magic_link"])
async def test_after_a_step_up_the_same_place_and_device_are_known(
        risk_project: Project, db: asyncpg.Pool, method: str) -> None:
    """The step-up's sign-in remembers the device, network, country and location: the next
    sign-in from there, same policy, scores 0 and is allowed."""
    p = risk_project
    await _ready(p)
    c = await _challenged(p, passkey=method == "passkey")
    _signed_in(await _satisfy(c, method), c.user_id)

    r = await attempt(p, c.address, ip=SYDNEY)
    assert r.status == 200, r.body
    assert len(await _sessions(db, c.user_id)) == 3
    listed = await p.api.get(f"/v1/risk/decisions?user={c.user_id}")
    assert listed.status == 200, listed.body
    latest = listed.body["data"][0]
    assert (latest["decision"], latest["score"], latest["session_id"]) == ("allow", 0, r.body["session"]["id"])
    assert fired(latest) == set()
    assert [x["decision"] for x in listed.body["data"]] == ["allow", "challenge", "allow"]


async def test_a_challenge_not_satisfied_teaches_nothing(risk_project: Project) -> None:
    """The contrast: without the step-up, the next sign-in from Sydney is challenged again."""
    p = risk_project
    await _ready(p)
    c = await _challenged(p)
    r = await attempt(p, c.address, ip=SYDNEY)
    assert_error(r, 401, "step_up_required")
    assert r.body["error"]["details"]["challenge_id"] != c.challenge_id
    assert fired(await decision(p, r.body["error"]["details"]["decision_id"])) == FIRED


# --- other users, other channels ---------------------------------------------------------------


async def test_a_phone_user_gets_the_link_by_sms(risk_project: Project, db: asyncpg.Pool) -> None:
    """A user known by a verified phone number only: the link goes by SMS, the number masked."""
    p = risk_project
    await _ready(p, passkeys=False)
    c = await _challenged(p, passkey=False, address="+1415555" + str(secrets.randbelow(10_000)).zfill(4))
    assert c.details["methods"] == ["magic_link"]
    before = len(await mailbox_messages(p.api, c.address, count=0))
    r = await _send(c)
    assert r.status == 200, r.body
    masked = c.address[:2] + "*" * (len(c.address) - 4) + c.address[-2:]
    assert (r.body["sent"], r.body["channel"], r.body["destination"]) == (True, "sms", masked)
    assert TTL - 5 <= r.body["expires_in"] <= TTL  # what the challenge has left
    message = (await mailbox_messages(p.api, c.address, count=before + 1))[0]
    assert (message["kind"], message["channel"]) == ("step_up", "sms")
    assert message["text"].startswith("Confirm your sign-in to risk: ")
    r = await _redeem(c, token_of(link_in(message["text"])))
    _signed_in(r, c.user_id)
    assert r.body["user"]["phone_number"] == c.address
    assert (await _challenge_row(db, c.challenge_id))["satisfied_by"] == "magic_link"


async def test_a_passkey_sign_in_challenged_without_a_verified_address(
        risk_project: Project, db: asyncpg.Pool) -> None:
    """A passkey sign-in is challenged too; a user whose address is no longer verified is
    offered the passkey only, a link is refused naming ``challenge_id``, and the passkey
    step-up ends in a passkey session."""
    p = risk_project
    await _ready(p)
    address = email()
    user, authenticator, _ = await _user(p, address, passkey=True)
    assert authenticator is not None
    r = await p.api.request("PATCH", f"/v1/users/{user.user_id}", json={"email_verified": False})
    assert r.status == 200 and r.body["email_verified"] is False, r.body

    plain = await login_options(p, {})
    assert plain.status == 200, plain.body
    r = await p.api.post(f"/v1/auth/passkey/login/verify?project_id={p.id}", authenticator.get(plain.body),
                         key=None, headers=client(SYDNEY))
    assert_error(r, 401, "step_up_required")
    _no_cookie(r)
    c = Challenged(p, address, user.user_id, r.body["error"]["details"], authenticator)
    assert c.details["methods"] == ["passkey"]
    assert (await _challenge_row(db, c.challenge_id))["method"] == "passkey"

    r = await _send(c)
    assert_invalid_field(r, "challenge_id")
    assert (await _challenge_row(db, c.challenge_id))["status"] == "pending"
    r = await _options(c)
    assert r.status == 200, r.body
    r = await _verify(c, authenticator.get(r.body))
    _signed_in(r, c.user_id)
    assert r.body["session"]["auth_method"] == "passkey"
    meta = (await _satisfied_events(db, p))[0]["metadata"]
    assert (meta["method"], meta["primary_method"]) == ("step_up_passkey", "passkey")


async def test_a_step_up_link_stops_working_when_the_user_changes_address(
        risk_project: Project, db: asyncpg.Pool) -> None:
    p = risk_project
    await _ready(p, passkeys=False)
    c = await _challenged(p, passkey=False)
    token = await _step_up_token(c)
    r = await p.api.request("PATCH", f"/v1/users/{c.user_id}", json={"email": email()})
    assert r.status == 200, r.body
    r = await _redeem(c, token)
    assert_error(r, 410, "token_invalid_or_expired")
    _no_cookie(r)
    assert len(await _sessions(db, c.user_id)) == 1
    assert await _satisfied_events(db, p) == []


async def test_the_step_up_session_keeps_the_invitations_organization(
        risk_project: Project, db: asyncpg.Pool) -> None:
    """An invitation's link redeemed from Sydney is challenged; the step-up's session is in the
    invitation's organization (the user has two memberships, so none would be picked alone)."""
    p = risk_project
    await _ready(p, passkeys=False)
    address = email()
    user, _, _ = await _user(p, address, passkey=False)
    await add_member(p, (await make_org(p))["id"], user.user_id)
    org = await make_org(p)
    before = len(await mailbox_messages(p.api, address, count=0))
    r = await p.api.post(f"/v1/organizations/{org['id']}/invitations", {"email": address, "role": "admin"})
    assert r.status == 201, r.body
    invitation = (await mailbox_messages(p.api, address, count=before + 1))[0]
    assert invitation["kind"] == "invitation"
    r = await verify(p.api, p, token_of(link_in(invitation["text"])), headers=client(SYDNEY))
    assert_error(r, 401, "step_up_required")
    c = Challenged(p, address, user.user_id, r.body["error"]["details"])
    assert (await _challenge_row(db, c.challenge_id))["organization_id"] == org["id"]

    r = await _redeem(c, await _step_up_token(c))
    _signed_in(r, c.user_id)
    assert (r.body["session"]["organization_id"], r.body["session"]["role"]) == (org["id"], "admin")


async def test_a_deleted_users_challenge_is_gone(risk_project: Project) -> None:
    p = risk_project
    await _ready(p)
    c = await _challenged(p)
    r = await p.api.delete(f"/v1/users/{c.user_id}")
    assert r.status == 200, r.body
    await _refused_everywhere(c, "unknown")


async def test_the_step_up_session_refreshes_and_revokes(risk_project: Project, risk_service: Api) -> None:
    p = risk_project
    await _ready(p)
    c = await _challenged(p)
    r = await _satisfy(c, "passkey")
    _signed_in(r, c.user_id)
    refreshed = await risk_service.post("/v1/sessions/refresh", {"refresh_token": r.body["refresh_token"]},
                                        key=None)
    assert refreshed.status == 200, refreshed.body
    assert refreshed.body["session"]["id"] == r.body["session"]["id"]
    revoked = await session_call(risk_service, "POST", "/v1/sessions/revoke", refreshed.body["access_token"])
    assert revoked.status == 200, revoked.body
    me = await session_call(risk_service, "GET", "/v1/sessions/me", refreshed.body["access_token"])
    assert_error(me, 401, "no_session")


# --- suspected defects, each shown on its own ---------------------------------------------------


async def test_a_step_up_link_lives_no_longer_than_its_challenge(
        risk_project: Project, db: asyncpg.Pool) -> None:
    """A link sent one minute before its challenge expires works for one minute at most: the
    answer's ``expires_in`` (and the link's own expiry) must not promise five.

    Product bug: ``risk/step_up.py`` ``send_link`` gives the link ``settings.step_up_ttl_seconds``
    from now and answers that, whatever is left of the challenge."""
    p = risk_project
    await _ready(p, passkeys=False)
    c = await _challenged(p, passkey=False)
    await db.execute("UPDATE step_up_challenges SET expires_at = now() + interval '60 seconds' "
                     "WHERE id = $1", c.challenge_id)
    r = await _send(c)
    assert r.status == 200, r.body
    row = await db.fetchrow(
        """SELECT t.expires_at AS link, c.expires_at AS challenge FROM magic_link_tokens t
           JOIN step_up_challenges c ON c.id = t.step_up_id WHERE t.step_up_id = $1""", c.challenge_id)
    assert row is not None
    assert r.body["expires_in"] <= 60, r.body
    assert row["link"] <= row["challenge"], dict(row)


async def test_an_assertion_over_another_projects_options_uses_the_step_up_up(
        risk_project: Project, risk_service: Api, db: asyncpg.Pool) -> None:
    """The step-up verify promises "the challenge is used up whatever the outcome: a refused
    assertion issues nothing, ever". An assertion over login options of another project is
    refused (right) but leaves the step-up pending.

    Product bug: ``passkeys/service.py`` ``sign_in`` passes ``step_up=step_up if ours else None``
    to ``_refused`` when the WebAuthn challenge is another project's, so the step-up challenge,
    which is this project's, is not failed."""
    p = risk_project
    await _ready(p)
    c = await _challenged(p)
    assert c.authenticator is not None
    other = await bootstrap_project(risk_service, "other")
    await configure(other)
    foreign = await login_options(other, {})
    assert foreign.status == 200, foreign.body
    r = await _verify(c, c.authenticator.get(foreign.body))
    assert_error(r, 400, "unknown_or_expired_challenge")
    _no_cookie(r)
    assert len(await _sessions(db, c.user_id)) == 1
    assert (await _challenge_row(db, c.challenge_id))["status"] == "failed"


# --- races ------------------------------------------------------------------------------------


async def test_a_passkey_and_a_link_at_once_sign_in_once(risk_project: Project, db: asyncpg.Pool) -> None:
    """The passkey verify and the link redeemed at the same moment: exactly one signs in."""
    p = risk_project
    await _ready(p)
    c = await _challenged(p)
    assert c.authenticator is not None
    token = await _step_up_token(c)
    r = await _options(c)
    assert r.status == 200, r.body
    by_passkey, by_link = await asyncio.gather(_verify(c, c.authenticator.get(r.body)), _redeem(c, token))
    winners = [x for x in (by_passkey, by_link) if x.status == 200]
    assert len(winners) == 1, (by_passkey.body, by_link.body)
    loser = by_link if winners[0] is by_passkey else by_passkey
    assert loser.status in (400, 410), loser.body
    assert loser.body["error"]["code"] in (
        "unknown_or_expired_challenge", "verification_failed", "token_invalid_or_expired"), loser.body
    _no_cookie(loser)
    sessions = await _sessions(db, c.user_id)
    assert len(sessions) == 2 and sessions[1] == winners[0].body["session"]["id"]
    row = await _challenge_row(db, c.challenge_id)
    assert row["status"] == "satisfied" and row["session_id"] == sessions[1]
    assert row["satisfied_by"] == ("passkey" if winners[0] is by_passkey else "magic_link")
    assert len(await _satisfied_events(db, p)) == 1


async def test_two_passkey_verifies_at_once_sign_in_once(risk_project: Project, db: asyncpg.Pool) -> None:
    p = risk_project
    await _ready(p)
    c = await _challenged(p)
    assert c.authenticator is not None
    first, second = await _options(c), await _options(c)
    assert first.status == 200 and second.status == 200
    results = await asyncio.gather(_verify(c, c.authenticator.get(first.body)),
                                   _verify(c, c.authenticator.get(second.body)))
    assert sorted(x.status for x in results) == [200, 400], [x.body for x in results]
    assert len(await _sessions(db, c.user_id)) == 2
    assert (await _challenge_row(db, c.challenge_id))["status"] == "satisfied"
    assert len(await _satisfied_events(db, p)) == 1


async def test_a_step_up_link_may_land_on_the_applications_page(
        risk_project: Project, db: asyncpg.Pool) -> None:
    """``redirect_url`` as on ``POST /v1/auth/magic-link/send``: on an origin the project allows
    the link lands there and still satisfies the challenge; on another it is refused, nothing is
    sent and the challenge stays pending."""
    p = risk_project
    await _ready(p, passkeys=False)
    r = await p.api.request("PATCH", "/v1/projects/me",
                            json={"cors_origins": ["https://app.example.com"]})
    assert r.status == 200, r.body
    c = await _challenged(p, passkey=False)
    before = len(await mailbox_messages(p.api, c.address, count=0))
    refused = await step_up_call(p, "magic-link/send", {
        "challenge_id": c.challenge_id, "redirect_url": "https://evil.example.com/step-up"},
        client(SYDNEY))
    assert_invalid_field(refused, "redirect_url")
    assert len(await mailbox_messages(p.api, c.address, count=0)) == before
    assert (await _challenge_row(db, c.challenge_id))["status"] == "pending"

    page = "https://app.example.com/step-up"
    r = await step_up_call(p, "magic-link/send",
                           {"challenge_id": c.challenge_id, "redirect_url": page}, client(SYDNEY))
    assert r.status == 200, r.body
    text = (await mailbox_messages(p.api, c.address, count=before + 1))[0]["text"]
    link = re.search(re.escape(page) + r"#token=\S+", text)
    assert link, text
    _signed_in(await _redeem(c, token_of(link.group(0))), c.user_id)
    assert (await _challenge_row(db, c.challenge_id))["status"] == "satisfied"
