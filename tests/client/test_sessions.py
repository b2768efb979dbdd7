"""``verify_session``: access tokens verified locally against the project's JWKS (fetched once,
cached, fetched again for a new ``kid`` after a rotation, at most once per interval), and a
signed-out session refused at once when the engine is asked too."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import pytest
from authio_client import AsyncAuthioClient, RetryPolicy
from authio_client.errors import ConnectionFailed, InvalidSession, NoSession

from tests.client.helpers import Sent, async_client, signed_in, sync_client
from tests.fixtures.service import Api, Project, bootstrap_project, eventually

JWKS = "/v1/auth/.well-known/jwks.json"


def header(token: str) -> dict[str, str]:
    part = token.split(".")[0]
    value: dict[str, str] = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    return value


def with_header(token: str, **changes: str) -> str:
    """``token`` with its header changed (so its signature no longer holds)."""
    h = {**header(token), **changes}
    encoded = base64.urlsafe_b64encode(json.dumps(h).encode()).rstrip(b"=").decode()
    return ".".join([encoded, *token.split(".")[1:]])


def reason(exc: pytest.ExceptionInfo[InvalidSession]) -> str | None:
    return exc.value.reason


async def test_sessions_verify_locally_across_a_key_rotation(project: Project, client_service: Api) -> None:
    sent = Sent()
    client = async_client(project.api.base_url, project.key, sent)
    anne = await signed_in(project)
    session = await client.verify_session(anne.access_token)
    assert (session.user_id, session.session_id, session.project_id) == (
        anne.user_id, anne.session_id, project.id)
    assert session.subject == f"user:{anne.user_id}" and session.kid == header(anne.access_token)["kid"]
    assert session.expires_at - session.issued_at == 900
    # The project came from the key (once), the JWKS was fetched once, and is then cached.
    assert (sent.count("GET", "/v1/projects/me"), sent.count("GET", JWKS)) == (1, 1)
    await asyncio.gather(*(client.verify_session(anne.access_token) for _ in range(20)))
    assert sent.count("GET", JWKS) == 1

    # An emergency rotation signs with a key the cached JWKS lacks: fetched again, once.
    old_kid = session.kid
    rotated = await client.rotate_signing_key()
    assert rotated.kid != old_kid and rotated.status == "active"
    bob = await signed_in(project)
    assert header(bob.access_token)["kid"] == rotated.kid
    assert (await client.verify_session(bob.access_token)).user_id == bob.user_id
    assert sent.count("GET", JWKS) == 2
    # The old key stays published until its tokens expire: anne's token still holds.
    assert (await client.verify_session(anne.access_token)).kid == old_kid

    # Made-up kids within the refetch interval cost no fetch at all.
    for n in range(5):
        with pytest.raises(InvalidSession) as forged:
            await client.verify_session(with_header(bob.access_token, kid=f"kid_{n:026d}"))
        assert reason(forged) == "signature"
    assert sent.count("GET", JWKS) == 2

    # A changed signature, another project's token, another issuer, no token at all.
    with pytest.raises(InvalidSession) as tampered:
        await client.verify_session(with_header(bob.access_token, typ="JOSE"))
    assert (reason(tampered), tampered.value.status, tampered.value.code) == ("signature", 401, "invalid_session")
    other = await bootstrap_project(client_service, "client-other")
    stranger = await signed_in(other)
    with pytest.raises(InvalidSession) as elsewhere:
        await client.verify_session(stranger.access_token)
    assert reason(elsewhere) == "project"
    issuer = async_client(project.api.base_url, None, sent, project_id=project.id,
                          issuer="https://auth.example.com")
    with pytest.raises(InvalidSession) as wrong_iss:
        await issuer.verify_session(bob.access_token)
    assert reason(wrong_iss) == "signature"
    with pytest.raises(NoSession):
        await client.verify_session(None)
    with pytest.raises(InvalidSession) as garbage:
        await client.verify_session("not-a-jwt")
    assert reason(garbage) == "signature"

    # The sync client, without an API key: the project is given.
    def verify() -> str:
        with sync_client(project.api.base_url, None, Sent(), project_id=project.id) as c:
            return c.verify_session(bob.access_token).session_id
    assert await asyncio.to_thread(verify) == bob.session_id
    for c in (client, issuer):
        await c.aclose()


async def test_a_revoked_session_is_refused_at_once_only_when_the_engine_is_asked(project: Project) -> None:
    sent = Sent()
    client = async_client(project.api.base_url, project.key, sent)
    anne = await signed_in(project)
    assert (await client.verify_session(anne.access_token, check_revocation=True)).user_id == anne.user_id
    assert sent.count("GET", "/v1/edge/validate") == 1

    assert (await client.revoke_session(anne.access_token))["revoked"] is True
    # The token itself still verifies until it expires: local verification cannot know.
    assert (await client.verify_session(anne.access_token)).session_id == anne.session_id

    async def refused() -> InvalidSession | None:
        try:
            await client.verify_session(anne.access_token, check_revocation=True)
        except InvalidSession as err:
            return err
        return None
    # The engine hears of the revocation through Redis within milliseconds.
    err = await eventually(refused, within=5, what="the revoked session refused by the engine")
    assert (err.code, err.reason, err.status) == ("invalid_session", "revoked", 401)

    def sync_check() -> str | None:
        with sync_client(project.api.base_url, project.key, Sent(), check_revocation=True) as c:
            try:
                c.verify_session(anne.access_token)
            except InvalidSession as e:
                return e.reason
            return None
    assert await asyncio.to_thread(sync_check) == "revoked"
    await client.aclose()


class FailJwks(httpx.AsyncBaseTransport):
    """Passes everything to the service, except JWKS fetches while ``failing`` (a connection
    refused: the service unreachable)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.failing = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.failing and request.url.path == JWKS:
            raise httpx.ConnectError("refused", request=request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_the_jwks_is_fetched_again_after_its_ttl_and_kept_when_that_fails(project: Project) -> None:
    transport, sent = FailJwks(), Sent()
    async with httpx.AsyncClient(transport=transport,
                                 event_hooks={"request": [sent.a_request]}) as http:
        client = AsyncAuthioClient(project.api.base_url, project.key, http=http, jwks_ttl=0.5,
                                   retry=RetryPolicy(attempts=2, backoff=0.01))
        anne = await signed_in(project)
        await client.verify_session(anne.access_token)
        await client.verify_session(anne.access_token)
        assert sent.count("GET", JWKS) == 1
        await asyncio.sleep(0.6)
        await client.verify_session(anne.access_token)
        assert sent.count("GET", JWKS) == 2  # expired: fetched again

        transport.failing = True
        await asyncio.sleep(0.6)
        # Expired and unreachable: the cached keys go on verifying, and the next try waits.
        assert (await client.verify_session(anne.access_token)).user_id == anne.user_id
        tried = sent.count("GET", JWKS)
        assert tried == 4  # one try and one retry
        assert (await client.verify_session(anne.access_token)).user_id == anne.user_id
        assert sent.count("GET", JWKS) == tried

        # Without any cached keys, the failure is the caller's.
        fresh = AsyncAuthioClient(project.api.base_url, project.key, http=http,
                                  retry=RetryPolicy(attempts=1))
        with pytest.raises(ConnectionFailed):
            await fresh.verify_session(anne.access_token)
