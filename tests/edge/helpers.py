"""What the edge tests share: a control plane and a separately running engine, as in production
(:func:`two_apps`), and for the peer tests a project with a store where one user may view
``doc:handbook`` and another may not, and the small application the proxies guard
(:func:`edge`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import ClientSession, web

from common.jwks import PublishedKeys
from common.settings import Settings
from control_plane.app import create_control_plane_app
from control_plane.appkeys import TOKENS
from engine.app import create_engine_app
from engine.appkeys import KEYS
from tests.fixtures.identity import SignedIn, email, sign_in
from tests.fixtures.proxies import Upstream, upstream
from tests.fixtures.service import Api, Project, bootstrap_project, eventually, serving

IDENTITY_HEADERS = ("Service-User-Id", "Service-Session-Id", "Service-Org-Id",
                    "Service-Org-Role", "Service-Project-Id")
DOC, RELATION = "doc:handbook", "viewer"


@dataclass
class Pair:
    """A control plane and an engine run as two apps on one database and Redis, and a project."""

    control: Api
    engine: Api
    control_app: web.Application
    engine_app: web.Application
    project: Project
    service: Api  # the suite's service shares the database: its outbox may deliver the links

    @property
    def keys(self) -> PublishedKeys:
        return self.engine_app[KEYS]

    async def sign_in(self, project: Project | None = None) -> SignedIn:
        return await sign_in(project or self.project, email(), api=self.control,
                             also=[self.service])

    async def token(self, signed: SignedIn, project: Project | None = None) -> str:
        """A fresh access token of ``signed``'s session, signed with the current active key."""
        return await self.control_app[TOKENS].issue(
            project_id=(project or self.project).id, user_id=signed.user_id,
            session_id=signed.session_id, org_id=None, role=None, iat=int(time.time()))


@contextlib.asynccontextmanager
async def two_apps(http: ClientSession, settings: Settings, service: Api,
                   project_name: str = "test") -> AsyncIterator[Pair]:
    """:class:`Pair`, its apps stopped on exit."""
    control_app, engine_app = create_control_plane_app(settings), create_engine_app(settings)
    async with serving(http, control_app) as control, serving(http, engine_app) as engine:
        yield Pair(control, engine, control_app, engine_app,
                   await bootstrap_project(control, project_name), service)


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
    async with two_apps(http, settings, service, "edge") as pair, upstream() as app:
        control, engine, project = pair.control, pair.engine, pair.project
        store = await project.api.post("/v1/stores", {"name": "edge"})
        assert store.status == 201, store.body
        viewer, other = await pair.sign_in(), await pair.sign_in()
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
