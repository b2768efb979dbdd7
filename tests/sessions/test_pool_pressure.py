"""Calls that sign an access token give their connection back to the pool first, and
revocations never wait for Redis.

Signing may load the project's key through the pool (the keyring's cache is seconds long, and a
rotation empties it): a request that held its connection while signing, with as many such
requests as the pool has connections, would wait for a connection none of them gives back.
Found by bench_identity at 64 concurrent refreshes against a pool of 10: every refresh chain
stopped for good.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

from aiohttp import ClientSession
from redis.asyncio import Redis

from common import revocations
from common.settings import Settings
from control_plane.appkeys import KEYRING
from tests.fixtures.identity import add_member, email, make_org, session_call, sign_in
from tests.fixtures.peers import StallingProxy
from tests.fixtures.service import Api, bootstrap_project, combined_app, eventually, serving

POOL = 2
CALLERS = 8  # four times the pool


async def test_refreshes_and_org_switches_beyond_the_pool_while_the_key_reloads(
    settings_factory: Callable[..., Settings], http: ClientSession, service: Api,
) -> None:
    app = combined_app(settings_factory(pg_pool_max=POOL))
    async with serving(http, app) as api:
        project = await bootstrap_project(api)
        org_a, org_b = await make_org(project), await make_org(project)
        # The session's service delivers messages too (one outbox): ask both mailboxes.
        signed = [await sign_in(project, email(), api=api, also=[service]) for _ in range(CALLERS)]
        for s in signed:
            await add_member(project, org_a["id"], s.user_id)
            await add_member(project, org_b["id"], s.user_id)
        selected = [await session_call(api, "POST", "/v1/sessions/select-org", s.access_token,
                                       {"organization_id": org_a["id"]}) for s in signed]
        assert all(r.status == 200 for r in selected), [r.body for r in selected]

        app[KEYRING].forget(project.id)  # the next token loads the active key through the pool
        async with asyncio.timeout(20):
            refreshed = await asyncio.gather(*(
                api.post("/v1/sessions/refresh", {"refresh_token": s.refresh_token}, key=None)
                for s in signed))
        assert [r.status for r in refreshed] == [200] * CALLERS, [r.body for r in refreshed]

        app[KEYRING].forget(project.id)
        async with asyncio.timeout(20):
            switched = await asyncio.gather(*(
                session_call(api, "POST", "/v1/sessions/switch-org", r.body["access_token"],
                             {"organization_id": org_b["id"]}) for r in refreshed))
        assert [r.status for r in switched] == [200] * CALLERS, [r.body for r in switched]


async def test_revocations_never_wait_for_redis(
    settings_factory: Callable[..., Settings], http: ClientSession, service: Api, redis_url: str,
    redis: Redis, redis_prefix: str,
) -> None:
    """Revoking a session, deleting a user and revoking an API key commit without touching Redis:
    while Redis stalls they answer at once and the rest of the service keeps its database; once
    Redis answers again, the announcer puts the revocations there. (Before the move they
    published after the commit; the move made them publish while holding their connection, and
    a read waited 2.7 s behind two of them with a pool of 2.)"""
    url = urlsplit(redis_url)
    async with StallingProxy(url.hostname or "127.0.0.1", url.port or 6379) as proxy:
        proxied = urlunsplit(url._replace(netloc=f"127.0.0.1:{proxy.port}"))
        app = combined_app(settings_factory(pg_pool_max=POOL, redis_url=proxied))
        async with serving(http, app) as api:
            project = await bootstrap_project(api)
            sessions = [await sign_in(project, email(), api=api, also=[service]) for _ in range(3)]
            doomed = sessions[1]  # deleting its user revokes its session
            extra = await project.api.post("/v1/api-keys", {"prefix": "sk_live_", "name": "x",
                                                            "scopes": ["users:read"]})
            assert extra.status == 201, extra.body

            proxy.stall()
            async with asyncio.timeout(2):
                done = await asyncio.gather(
                    session_call(api, "POST", "/v1/sessions/revoke", sessions[0].access_token),
                    project.api.delete(f"/v1/users/{doomed.user_id}"),
                    project.api.delete(f"/v1/api-keys/{extra.body['id']}"),
                    project.api.get("/v1/users"),
                    session_call(api, "GET", "/v1/sessions/me", sessions[2].access_token),
                )
            assert [r.status for r in done] == [200] * 5, [r.body for r in done]
            proxy.resume()
            key = revocations.set_key(redis_prefix)

            async def announced() -> bool:
                scores = [await redis.zscore(key, s.session_id) for s in sessions[:2]]
                return all(score is not None for score in scores)

            await eventually(announced, within=10, what="the revocations in the set")
