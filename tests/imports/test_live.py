"""The multi-tenant importer's live mode (SPEC.md 4 rule 6): the origin project's management
token handed to the service (sealed, deleted within 24 hours), the service reading the origin's
management API, the CLI importing what it read.

The origin is a local HTTP server serving the Descope fixture in Descope's management API shape
(``GET /v1/mgmt/tenant/all``, ``POST /v2/mgmt/user/search`` with ``limit`` and ``page``,
``Authorization: Bearer <ProjectId>:<ManagementKey>``, as ``descope/go-sdk`` calls them): it
stands in for api.descope.com, which no test can reach. It answers at most 20 users a page,
so the service's paging is exercised."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from aiohttp import ClientSession, web

from common.settings import Settings
from control_plane.imports.tasks import purge_pass
from tests.fixtures.database import events
from tests.fixtures.service import (
    Api,
    Project,
    assert_error,
    assert_invalid_field,
    bootstrap_project,
    combined_app,
    serving,
    start_app,
)
from tests.imports.helpers import DATA, authio, cli_env

SOURCE, TOKEN = "P2live0project", "K2" + "m" * 40
EXPORT: dict[str, Any] = json.loads((DATA / "descope/project-export.json").read_text())
EXPECTED: dict[str, Any] = json.loads((DATA / "expected.json").read_text())["fixtures"][
    "descope/project-export.json"]
ORIGIN_PAGE = 20


def origin_app(calls: list[str]) -> web.Application:
    def refused(request: web.Request) -> web.Response | None:
        calls.append(f"{request.method} {request.path}")
        if request.headers.get("Authorization") != f"Bearer {SOURCE}:{TOKEN}":
            return web.json_response({"errorCode": "E011003", "errorDescription":
                                      "Unauthorized"}, status=401)
        return None

    async def tenants(request: web.Request) -> web.Response:
        return refused(request) or web.json_response({"tenants": EXPORT["tenants"]})

    async def search(request: web.Request) -> web.Response:
        if (no := refused(request)) is not None:
            return no
        body = await request.json()
        limit = min(int(body.get("limit", 100)), ORIGIN_PAGE)
        page = int(body.get("page", 0))
        users = EXPORT["users"][page * limit:(page + 1) * limit]
        return web.json_response({"users": users, "total": len(EXPORT["users"])})

    app = web.Application()
    app.router.add_get("/v1/mgmt/tenant/all", tenants)
    app.router.add_post("/v2/mgmt/user/search", search)
    return app


@pytest_asyncio.fixture
async def origin() -> AsyncIterator[tuple[str, list[str]]]:
    calls: list[str] = []
    running = await start_app(origin_app(calls))
    yield running.base_url, calls
    await running.stop()


@pytest_asyncio.fixture
async def live_service(settings_factory: Callable[..., Settings], http: ClientSession,
                       origin: tuple[str, list[str]]) -> AsyncIterator[Api]:
    async with serving(http, combined_app(settings_factory(descope_api_url=origin[0]))) as api:
        yield api


async def test_a_live_import(live_service: Api, origin: tuple[str, list[str]], tmp_path: Path,
                             db: asyncpg.Pool) -> None:
    project = await bootstrap_project(live_service, "live")
    env = cli_env(tmp_path / "home", AUTHIO_BASE_URL=project.api.base_url,
                  AUTHIO_API_KEY=project.key, XDG_CACHE_HOME=str(tmp_path / "cache"))
    ran = await authio("import", "descope", "--live-token", TOKEN, "--source-project-id", SOURCE,
                       "--rate-limit-rps", "1000", env=env)
    assert ran.code == 0, ran.err
    first = EXPECTED["first_run"]
    assert ran.last_line == (f"created {first['created']}, existed 0, skipped {first['skipped']}, "
                             "errored 0")
    assert "organizations: created 5, existed 0" in ran.out
    pages = -(-len(EXPORT["users"]) // ORIGIN_PAGE)
    assert origin[1] == ["GET /v1/mgmt/tenant/all"] + ["POST /v2/mgmt/user/search"] * pages

    # The token is gone: the credential was deleted when the export was read, and no event
    # or row ever held it in the clear.
    assert await db.fetchval("SELECT count(*) FROM import_credentials WHERE project_id = $1",
                             project.id) == 0
    [created] = await events(db, project.id, "import.credential.created")
    [deleted] = await events(db, project.id, "import.credential.deleted")
    assert created["target_id"] == deleted["target_id"]
    assert created["metadata"]["source_project_id"] == SOURCE
    everything = json.dumps(await events(db, project.id), default=str)
    assert TOKEN not in everything
    cached = tmp_path / "cache" / "authio" / f"descope-{SOURCE}.json"
    assert json.loads(cached.read_text())["total"] == len(EXPORT["users"])

    again = await authio("import", "descope", "--live-token", TOKEN, "--source-project-id",
                         SOURCE, "--rate-limit-rps", "1000", env=env)
    assert again.code == 0, again.err
    assert again.last_line.startswith(f"created 0, existed {first['created']},")


async def test_a_refused_token(live_service: Api, tmp_path: Path, db: asyncpg.Pool) -> None:
    project = await bootstrap_project(live_service, "live")
    env = cli_env(tmp_path / "home", AUTHIO_BASE_URL=project.api.base_url,
                  AUTHIO_API_KEY=project.key, XDG_CACHE_HOME=str(tmp_path / "cache"))
    ran = await authio("import", "descope", "--live-token", "K2wrong", "--source-project-id",
                       SOURCE, env=env)
    assert ran.code == 1 and "refused" in ran.err, ran.err
    assert await db.fetchval("SELECT count(*) FROM import_credentials WHERE project_id = $1",
                             project.id) == 0  # deleted even so


async def test_credentials_are_sealed_and_gone_within_a_day(live_service: Api,
                                                            db: asyncpg.Pool) -> None:
    project = await bootstrap_project(live_service, "live")
    r = await project.api.post("/v1/imports/credentials", {
        "provider": "descope", "source_project_id": SOURCE, "token": TOKEN})
    assert r.status == 201, r.body
    assert "token" not in r.body
    assert (r.body["expires_at"] > r.body["created_at"])
    sealed = await db.fetchval("SELECT token_sealed FROM import_credentials WHERE id = $1",
                               r.body["id"])
    assert TOKEN.encode() not in sealed
    export = await project.api.get(f"/v1/imports/credentials/{r.body['id']}/export")
    assert export.status == 200 and export.body["total"] == len(EXPORT["users"])

    # The clock moves 24 hours and a second: the worker's pass deletes it.
    await db.execute("UPDATE import_credentials SET created_at = created_at - interval '24 hours"
                     " 1 second', expires_at = expires_at - interval '24 hours 1 second' WHERE"
                     " id = $1", r.body["id"])
    _, credentials = await purge_pass(db)
    assert credentials >= 1
    assert await db.fetchval("SELECT count(*) FROM import_credentials WHERE id = $1",
                             r.body["id"]) == 0
    assert_error(await project.api.get(f"/v1/imports/credentials/{r.body['id']}/export"),
                 404, "not_found")


@pytest.mark.parametrize("body", [
    {"provider": "auth0", "source_project_id": SOURCE, "token": TOKEN},
    {"provider": "descope", "source_project_id": "", "token": TOKEN},
    {"provider": "descope", "source_project_id": SOURCE},
])
async def test_bad_credentials_are_refused(project: Project, body: dict[str, Any]) -> None:
    r = await project.api.post("/v1/imports/credentials", body)
    assert r.status == 400 and r.body["error"]["code"] == "invalid_request"


async def test_the_origin_refusing_the_token_is_named(live_service: Api) -> None:
    project = await bootstrap_project(live_service, "live")
    r = await project.api.post("/v1/imports/credentials", {
        "provider": "descope", "source_project_id": SOURCE, "token": "K2other"})
    assert_invalid_field(await project.api.get(
        f"/v1/imports/credentials/{r.body['id']}/export"), "token")
    gone = await project.api.delete(f"/v1/imports/credentials/{r.body['id']}")
    assert gone.status == 200
    assert_error(await project.api.delete(f"/v1/imports/credentials/{r.body['id']}"), 404,
                 "not_found")
