"""What the edge peer tests share: a control plane and a separately running engine (as in
production), a project with a store where one user may view ``doc:handbook`` and another may
not, and the small application the proxies guard."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import ClientSession

from common.settings import Settings
from control_plane.app import create_control_plane_app
from engine.app import create_engine_app
from tests.fixtures.identity import SignedIn, email, sign_in
from tests.fixtures.proxies import Upstream, upstream
from tests.fixtures.service import Api, Project, bootstrap_project, eventually, serving

IDENTITY_HEADERS = ("Service-User-Id", "Service-Session-Id", "Service-Org-Id",
                    "Service-Org-Role", "Service-Project-Id")
DOC, RELATION = "doc:handbook", "viewer"


@dataclass
class Edge:
    control: Api
    engine: Api
    project: Project
    store_id: str
    viewer: SignedIn  # may view doc:handbook
    other: SignedIn  # signed in, but may not
    app: Upstream
    service: Api  # the suite's service shares the database: its outbox may deliver the links

    async def sign_in(self) -> SignedIn:
        return await sign_in(self.project, email(), api=self.control, also=[self.service])


@contextlib.asynccontextmanager
async def edge(http: ClientSession, settings: Settings, service: Api) -> AsyncIterator[Edge]:
    """:class:`Edge`, its apps stopped on exit."""
    async with (serving(http, create_control_plane_app(settings)) as control,
                serving(http, create_engine_app(settings)) as engine, upstream() as app):
        project = await bootstrap_project(control, "edge")
        store = await project.api.post("/v1/stores", {"name": "edge"})
        assert store.status == 201, store.body
        viewer = await sign_in(project, email(), api=control, also=[service])
        other = await sign_in(project, email(), api=control, also=[service])
        r = await project.api.post(f"/v1/stores/{store.body['id']}/write", {"writes": [
            {"object": DOC, "relation": RELATION, "user": f"user:{viewer.user_id}"}]})
        assert r.status == 200, r.body
        found = Edge(control, engine, project, store.body["id"], viewer, other, app, service)

        async def seen() -> bool:
            r = await engine.get(f"/v1/edge/validate?store_id={found.store_id}&object={DOC}"
                                 f"&relation={RELATION}", key=None,
                                 headers={"Authorization": f"Bearer {viewer.access_token}"})
            return r.status == 200

        await eventually(seen, within=10, what="the engine to see the tuple")
        yield found
