"""The import tool's HTTP client against a server that fails in each way it handles: what
counts as an attempt, what is waited for, what stops the run."""

from __future__ import annotations

import time

import pytest
from aiohttp import ClientTimeout, web

from control_plane.imports.client import HTTP_ATTEMPTS, ImportAborted, ServiceClient
from tests.fixtures.service import start_app


def flaky(script: list[str]) -> tuple[web.Application, list[str]]:
    """Answers each request with the next step of ``script`` (``drop``: close the connection
    unanswered; a number: that status, ``Retry-After: 0``), then 201."""
    seen: list[str] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        step = script[len(seen)] if len(seen) < len(script) else "201"
        seen.append(step)
        if step == "drop":
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        return web.json_response({"error": {"code": "x", "message": step}} if step != "201"
                                 else {"id": "user_1"}, status=int(step),
                                 headers={"Retry-After": "0"})
    app = web.Application()
    app.router.add_post("/v1/users", handle)
    return app, seen


async def test_network_failures_do_not_use_up_the_attempts_of_answers() -> None:
    """Three dropped connections, then nine 503s: the tenth answer is the success (the drops
    are paused through, not counted against the 10 attempts an answer gets)."""
    app, seen = flaky(["drop"] * 3 + ["503"] * (HTTP_ATTEMPTS - 1))
    running = await start_app(app)
    notes: list[str] = []
    client = ServiceClient(running.base_url, "sk_test_x", rate=1000, concurrency=4,
                           note=notes.append)
    try:
        status, body = await client.request("POST", "/v1/users", {"email": "a@example.com"})
    finally:
        await client.close()
        await running.stop()
    assert (status, body) == (201, {"id": "user_1"})
    assert seen == ["drop"] * 3 + ["503"] * (HTTP_ATTEMPTS - 1) + ["201"]
    assert [n.split(" (")[0] for n in notes] == ["cannot reach the service",
                                                 "the service answers again: resumed"]


async def test_an_answer_that_never_succeeds_stands_after_its_attempts() -> None:
    app, seen = flaky(["500"] * 50)
    running = await start_app(app)
    client = ServiceClient(running.base_url, "sk_test_x", rate=1000, concurrency=4,
                           note=lambda _: None)
    started = time.monotonic()
    try:
        status, body = await client.request("POST", "/v1/users", {"email": "a@example.com"})
    finally:
        await client.close()
        await running.stop()
    assert status == 500 and body["error"]["message"] == "500"
    assert len(seen) == HTTP_ATTEMPTS
    assert time.monotonic() - started < 5  # Retry-After: 0 was honoured, not backoff


@pytest.mark.parametrize("status", [401, 403])
async def test_a_refused_key_stops_everything(status: int) -> None:
    app, seen = flaky([str(status)])
    running = await start_app(app)
    client = ServiceClient(running.base_url, "sk_test_x", rate=1000, concurrency=4,
                           note=lambda _: None)
    try:
        with pytest.raises(ImportAborted, match="authio login"):
            await client.request("POST", "/v1/users", {"email": "a@example.com"})
    finally:
        await client.close()
        await running.stop()
    assert len(seen) == 1


async def test_login_polls_again_after_a_poll_that_timed_out_or_was_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`authio login`'s token poll that gets no answer in time, or a dropped connection, is a
    network failure like any other: the device polls again at its interval and the approval
    that follows is received (a poll that timed out once ended the login with a traceback)."""
    import asyncio
    import io

    from control_plane.cli import login

    polls: list[str] = []

    async def code(_: web.Request) -> web.Response:
        return web.json_response({
            "device_code": "dc", "user_code": "ABCD-EFGH", "interval": 1, "expires_in": 60,
            "verification_uri": "http://x/device", "verification_uri_complete": "http://x/device"})

    async def token(request: web.Request) -> web.Response:
        polls.append(["slow", "drop", "ok"][min(len(polls), 2)])
        if polls[-1] == "slow":
            await asyncio.sleep(3)  # past the client's timeout
        if polls[-1] == "drop":
            assert request.transport is not None
            request.transport.close()
        return web.json_response({"access_token": "sk_live_x", "token_type": "Bearer",
                                  "project_id": "proj_1", "key_id": "key_1"})
    app = web.Application()
    app.router.add_post("/v1/cli/device/code", code)
    app.router.add_post("/v1/cli/device/token", token)
    running = await start_app(app)
    monkeypatch.setattr(login, "TIMEOUT", ClientTimeout(total=1))
    try:
        got = await login.device_login(running.base_url, open_browser=False, out=io.StringIO())
    finally:
        await running.stop()
    assert polls == ["slow", "drop", "ok"]
    assert (got.api_key, got.project_id, got.key_id) == ("sk_live_x", "proj_1", "key_1")
