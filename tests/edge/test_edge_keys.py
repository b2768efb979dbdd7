"""Signing keys as the engine sees them (issue 12): every project's keys in memory, kept current
by the control plane's key-change notification (``common.jwks``), through HTTP against a
separately running control plane and engine on one database.

* a key published by a rotation a moment ago is known to the engine within 1 s, with no request
  asking for it (the notification), and its tokens validate;
* a token verified and cached before is refused with ``signature`` once its key's
  ``publish_until`` has passed, though no notification said so;
* project A's tokens never validate as project B's (``pid`` must be the key's project, and a
  pin names the project);
* a flood of tokens with unknown ``kid``s costs at most one key reload a second per bucket;
* a key change made while the engine's listener was away is read after it reconnects.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import jwt
import pytest
from aiohttp import ClientSession

from common.access_tokens import AUDIENCE
from common.appkeys import PG_POOL, SETTINGS
from common.ids import new_id
from common.jwks import PublishedKeys
from common.settings import Settings
from control_plane.appkeys import KEYRING, KMS, TOKENS
from control_plane.signing_keys import repository as key_rows
from control_plane.signing_keys import service as key_service
from engine.appkeys import JUDGE, STORES
from engine.sessions import SessionJudge
from tests.edge.helpers import Pair, two_apps
from tests.fixtures.service import (
    Api,
    Project,
    Response,
    assert_error,
    bootstrap_project,
    eventually,
)


@pytest.fixture
async def pair(settings_factory: Callable[..., Settings], http: ClientSession,
               service: Api) -> AsyncIterator[Pair]:
    async with two_apps(http, settings_factory(), service) as p:
        yield p


async def validate(engine: Api, token: str, query: str = "",
                   headers: dict[str, str] | None = None) -> Response:
    return await engine.get(f"/v1/edge/validate{query}", key=None,
                            headers={"Authorization": f"Bearer {token}", **(headers or {})})


def reason(r: Response) -> str | None:
    if r.status != 401:
        return None
    return str(r.body["error"]["details"].get("reason"))


def kid_of(token: str) -> str:
    return str(jwt.get_unverified_header(token)["kid"])


async def rotate(project: Project) -> str:
    r = await project.api.post("/v1/signing-keys/rotate", {})
    assert r.status == 201, r.body
    return str(r.body["kid"])


async def known_within(keys: PublishedKeys, kid: str, within: float) -> float:
    """Seconds until ``kid`` is in the engine's memory (no request asks for it meanwhile)."""
    start = time.monotonic()
    while keys.peek(kid) is None:
        assert time.monotonic() - start < within, f"{kid} not known within {within} s"
        await asyncio.sleep(0.005)
    return time.monotonic() - start


async def test_a_rotated_key_is_usable_within_a_second(pair: Pair) -> None:
    signed = await pair.sign_in()
    assert (await validate(pair.engine, signed.access_token)).status == 200
    loads = pair.keys.loads
    new_kid = await rotate(pair.project)
    # The notification, not a request: the engine knows the key before anyone presents it.
    await known_within(pair.keys, new_kid, 1.0)
    token = await pair.token(signed)
    assert kid_of(token) == new_kid
    r = await validate(pair.engine, token)
    assert r.status == 200, r.body
    assert pair.keys.loads == loads + 1, "one project reload, no miss reload"
    # The previous key is retired but within its overlap: its token still validates.
    assert (await validate(pair.engine, signed.access_token)).status == 200


async def test_a_key_published_ahead_of_rotation_is_known_at_once(
    pair: Pair, settings_factory: Callable[..., Settings],
) -> None:
    """The scheduled step that publishes the next key (pending) for a project whose active key
    is due: the engine knows it within 1 s; a rotation then activates that very key."""
    signed = await pair.sign_in()
    due = settings_factory(signing_key_rotation_days=1, signing_key_prepublish_seconds=86_400)
    async with pair.control_app[PG_POOL].acquire() as conn:
        pending, activated = await key_service._advance(conn, pair.control_app[KMS], due,
                                                        pair.project.id)
    assert pending is not None and activated is None
    await known_within(pair.keys, pending, 1.0)
    assert await rotate(pair.project) == pending
    token = await pair.token(signed)
    assert kid_of(token) == pending
    assert (await validate(pair.engine, token)).status == 200


async def test_a_retired_key_past_its_overlap_fails_even_when_cached(pair: Pair) -> None:
    signed = await pair.sign_in()
    old_kid = kid_of(signed.access_token)
    assert (await validate(pair.engine, signed.access_token)).status == 200  # verified, cached
    await rotate(pair.project)
    # Time passing beyond publish_until, shortened: the overlap now ends in 1.5 s. The change is
    # announced as every key change is; its end then comes with no announcement at all.
    pool = pair.control_app[PG_POOL]
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("UPDATE signing_keys SET publish_until = now() + interval '1.5 s' "
                           "WHERE kid = $1", old_kid)
        await key_rows.notify_changed(conn, pair.project.id)

    async def overlap_known() -> bool:
        key = pair.keys.peek(old_kid)
        return key is not None and key.publish_until is not None \
            and key.publish_until.timestamp() < time.time() + 10
    await eventually(overlap_known, within=2, what="the shortened overlap at the engine")
    assert (await validate(pair.engine, signed.access_token)).status == 200
    await eventually(lambda: _refused(pair.engine, signed.access_token, "signature"), within=5,
                     what="the retired key's token refused")
    assert reason(await validate(pair.engine, signed.access_token)) == "signature"
    # The key's project is otherwise fine: a token of its active key passes.
    assert (await validate(pair.engine, await pair.token(signed))).status == 200


async def _refused(engine: Api, token: str, why: str) -> bool:
    return reason(await validate(engine, token)) == why


async def test_project_a_never_validates_as_project_b(pair: Pair) -> None:
    a, b = pair.project, await bootstrap_project(pair.control, "b")
    signed_a = await pair.sign_in(a)
    signed_b = await pair.sign_in(b)
    token_a, token_b = signed_a.access_token, signed_b.access_token
    assert (await validate(pair.engine, token_a)).status == 200
    assert (await validate(pair.engine, token_b)).status == 200
    for query, headers in ((f"?project_id={b.id}", None), ("", {"Service-Project": b.id})):
        assert reason(await validate(pair.engine, token_a, query, headers)) == "project"
    assert (await validate(pair.engine, token_a, f"?project_id={a.id}")).status == 200
    # A's key signing B's pid (A's own private key: what a leaked key of A could forge).
    signer = await pair.control_app[KEYRING].signer(a.id)
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": pair.control_app[SETTINGS].public_base_url, "aud": AUDIENCE, "sub": signed_b.user_id,
        "sid": signed_b.session_id, "iat": now, "nbf": now, "exp": now + 300, "pid": b.id}
    forged = jwt.encode(claims, signer.key, algorithm=signer.alg,
                        headers={"kid": signer.kid, "typ": "JWT"})
    assert reason(await validate(pair.engine, forged)) == "signature"
    assert reason(await validate(pair.engine, forged, f"?project_id={b.id}")) == "signature"
    assert reason(await validate(pair.engine, forged, f"?project_id={a.id}")) == "signature"


async def test_a_flood_of_unknown_kids_is_bounded(pair: Pair) -> None:
    signed = await pair.sign_in()
    real = jwt.decode(signed.access_token, options={"verify_signature": False})
    signer = await pair.control_app[KEYRING].signer(pair.project.id)
    other = await bootstrap_project(pair.control, "flood-other")

    def forged(i: int) -> str:
        claims = dict(real)
        if i % 3 == 1:
            del claims["pid"]  # the global bucket
        elif i % 3 == 2:
            claims["pid"] = other.id if i % 2 else new_id("proj")  # known-less, random
        return jwt.encode(claims, signer.key, algorithm=signer.alg,
                          headers={"kid": new_id("kid"), "typ": "JWT"})

    tokens = [forged(i) for i in range(1000)]
    loads = pair.keys.loads
    start = time.monotonic()
    for batch in range(0, len(tokens), 50):
        answers = await asyncio.gather(*(validate(pair.engine, t)
                                         for t in tokens[batch:batch + 50]))
        assert {reason(r) for r in answers} == {"signature"}
    elapsed = time.monotonic() - start
    reloads = pair.keys.loads - loads
    # Two buckets (the project's, the global one), each at most once a second.
    assert reloads <= 2 * (math.ceil(elapsed) + 1), (reloads, elapsed)
    assert (await validate(pair.engine, signed.access_token)).status == 200


async def test_a_key_change_missed_while_the_listener_was_down_is_caught_up(
    pair: Pair, monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate = asyncio.Event()
    real_connect = asyncpg.connect

    async def gated_connect(*args: Any, **kwargs: Any) -> Any:
        if (kwargs.get("server_settings") or {}).get("application_name") == \
                "authio-engine-listen":
            await gate.wait()
        return await real_connect(*args, **kwargs)

    registry = pair.engine_app[STORES]
    listener = registry._listener
    assert listener is not None
    monkeypatch.setattr(asyncpg, "connect", gated_connect)
    await pair.control_app[PG_POOL].execute("SELECT pg_terminate_backend($1)",
                                            listener.get_server_pid())
    await eventually(lambda: _async(registry._listener is not listener), within=5,
                     what="the engine to notice its listener is gone")
    new_kid = await rotate(pair.project)  # announced while nobody of this engine listens
    await asyncio.sleep(0.3)
    assert pair.keys.peek(new_kid) is None, "heard without a listener?"
    gate.set()
    await known_within(pair.keys, new_kid, 5.0)  # the full reload after reconnecting
    signed = await pair.sign_in()
    assert kid_of(signed.access_token) == new_kid
    assert (await validate(pair.engine, signed.access_token)).status == 200
    # And it listens again: the next rotation is heard.
    assert_error(await validate(pair.engine, "garbage"), 401, "invalid_session")
    await known_within(pair.keys, await rotate(pair.project), 1.0)


async def _async(value: bool) -> bool:
    return value


async def test_a_full_verified_token_cache_drops_its_oldest_tenth(pair: Pair) -> None:
    """At the cap the oldest tokens go, a tenth at a time, in the order they were verified: the
    tokens in use stay verified, and a full cache never empties at once (every live token
    verified again in one burst)."""
    signed = await pair.sign_in()
    cache: dict[str, Any] = {}
    judge = SessionJudge(cache, pair.keys, pair.engine_app[SETTINGS].public_base_url,
                         pair.engine_app[JUDGE].revocations, max_verified=20)
    tokens = []
    for i in range(25):
        token = await pair.control_app[TOKENS].issue(
            project_id=pair.project.id, user_id=signed.user_id, session_id=signed.session_id,
            org_id=None, role=None, iat=int(time.time()) - i)
        tokens.append(token)
        assert (await judge.session(token)).sid == signed.session_id
    # 20 fit; the 21st dropped the two oldest (a tenth), and so on: 25 verified, 19 kept.
    assert len(cache) <= 20
    assert tokens[0] not in cache and tokens[-1] in cache
    assert list(cache) == [t for t in tokens if t in cache]  # oldest first
    assert len(cache) >= 18  # never emptied
