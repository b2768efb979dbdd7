"""Answers that sign an access token give their connection back to the pool first.

Signing may load the project's key through the pool (the keyring's cache is seconds long, and a
rotation empties it): a request that held its connection while signing, with as many such
requests as the pool has connections, would wait for a connection none of them gives back.
Found by bench_identity at 64 concurrent refreshes against a pool of 10: every refresh chain
stopped for good.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import ClientSession

from common.settings import Settings
from control_plane.appkeys import KEYRING
from tests.fixtures.identity import add_member, email, make_org, session_call, sign_in
from tests.fixtures.service import Api, bootstrap_project, combined_app, serving

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
