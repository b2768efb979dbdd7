"""Dashboard operators through the API (issue 23): ``POST/GET/DELETE /v1/operators`` with
``keys:write``, their events in the caller's project, the operator project they live in, and
the first operator made by ``POST /v1/bootstrap`` with ``operator_email``."""

from __future__ import annotations

import re
import secrets
from typing import Any

import asyncpg

from tests.fixtures.database import events
from tests.fixtures.identity import email
from tests.fixtures.service import (
    BOOTSTRAP_TOKEN,
    ULID,
    Api,
    Project,
    assert_error,
    bootstrap_project,
    scoped,
)

FIELDS = {"id", "tenant_id", "email", "name", "user_id", "created_at", "request_id"}


async def add(api: Api, address: str, **fields: Any) -> dict[str, Any]:
    r = await api.post("/v1/operators", {"email": address, **fields})
    assert r.status == 201, r.body
    return dict(r.body)


async def operator_project(db: asyncpg.Pool, tenant_id: str) -> str:
    project_id = await db.fetchval(
        "SELECT id FROM projects WHERE tenant_id = $1 AND kind = 'operators'", tenant_id)
    assert project_id is not None
    return str(project_id)


async def test_add_list_and_remove_with_their_events(project: Project, db: asyncpg.Pool) -> None:
    address = email()
    added = await add(project.api, address, name="Olga Operator")
    assert set(added) == FIELDS
    assert re.fullmatch(rf"opr_{ULID}", added["id"])
    assert (added["tenant_id"], added["email"], added["name"]) == \
        (project.tenant_id, address, "Olga Operator")
    # The operator is a user, with a verified address, of the tenant's operator project, which
    # is not the caller's project and holds no API key.
    console_project = await operator_project(db, project.tenant_id)
    assert console_project != project.id
    user = await db.fetchrow("SELECT * FROM users WHERE id = $1", added["user_id"])
    assert (user["project_id"], user["email"], user["email_verified"], user["name"]) == \
        (console_project, address, True, "Olga Operator")
    assert await db.fetchval("SELECT count(*) FROM api_keys WHERE project_id = $1",
                             console_project) == 0
    # An invitation: the enrollment message of the new user, in the operator project.
    assert await db.fetchval(
        "SELECT count(*) FROM messages WHERE project_id = $1 AND destination = $2 "
        "AND kind = 'enrollment'", console_project, address) == 1

    r = await project.api.get("/v1/operators")
    assert r.status == 200, r.body
    assert [o["id"] for o in r.body["data"]] == [added["id"]]
    assert r.body["data"][0] == {k: v for k, v in added.items() if k != "request_id"}

    [evt] = await events(db, project.id, "dashboard_operator.added")
    assert (evt["actor_type"], evt["actor_id"], evt["target_type"], evt["target_id"]) == \
        ("api_key", project.key_id, "dashboard_operator", added["id"])
    assert evt["metadata"]["operator_email"] == address

    r = await project.api.delete(f"/v1/operators/{added['id']}")
    assert r.status == 204, r.body
    assert r.raw == b""
    assert r.headers["X-Request-Id"].startswith("req_")
    assert (await project.api.get("/v1/operators")).body["data"] == []
    [evt] = await events(db, project.id, "dashboard_operator.removed")
    assert (evt["actor_type"], evt["actor_id"], evt["target_id"]) == \
        ("api_key", project.key_id, added["id"])
    # The operator's user goes with it.
    assert await db.fetchval("SELECT count(*) FROM users WHERE id = $1", added["user_id"]) == 0
    assert_error(await project.api.delete(f"/v1/operators/{added['id']}"), 404,
                 "operator_not_found")


async def test_an_address_is_an_operator_of_a_tenant_once(project: Project,
                                                         db: asyncpg.Pool) -> None:
    address = email()
    first = await add(project.api, address)
    r = await project.api.post("/v1/operators", {"email": address.upper()})
    assert_error(r, 409, "operator_exists")
    assert r.body["error"]["details"]["operator_id"] == first["id"]
    assert len(await events(db, project.id, "dashboard_operator.added")) == 1
    # Another tenant may make the same address its operator too.
    other = await bootstrap_project(project.api, "other")
    second = await add(other.api, address)
    assert second["tenant_id"] == other.tenant_id and second["id"] != first["id"]
    # Removed, the address can be added again.
    assert (await project.api.delete(f"/v1/operators/{first['id']}")).status == 204
    again = await add(project.api, address)
    assert again["id"] != first["id"]


async def test_the_routes_need_keys_write(project: Project) -> None:
    operator = await add(project.api, email())
    narrow = await scoped(project, "users:write", "audit:read")
    assert_error(await narrow.post("/v1/operators", {"email": email()}), 403, "insufficient_scope")
    assert_error(await narrow.get("/v1/operators"), 403, "insufficient_scope")
    assert_error(await narrow.delete(f"/v1/operators/{operator['id']}"), 403,
                 "insufficient_scope")
    assert_error(await project.api.with_key(None).get("/v1/operators"), 401, "missing_api_key")
    keys = await scoped(project, "keys:write")
    assert (await keys.get("/v1/operators")).body["data"][0]["id"] == operator["id"]
    assert (await keys.post("/v1/operators", {"email": email()})).status == 201


async def test_another_tenants_operator_is_not_found(project: Project, new_project: Any) -> None:
    other = await new_project("other")
    theirs = await add(other.api, email())
    assert_error(await project.api.delete(f"/v1/operators/{theirs['id']}"), 404,
                 "operator_not_found")
    assert_error(await project.api.delete(f"/v1/operators/opr_{'0' * 26}"), 404,
                 "operator_not_found")
    assert (await project.api.get("/v1/operators")).body["data"] == []
    # A second project of a tenant shares its operators: they are the tenant's.
    assert (await other.api.get("/v1/operators")).body["data"][0]["id"] == theirs["id"]


async def test_bad_addresses_are_refused(project: Project) -> None:
    assert_error(await project.api.post("/v1/operators", {"email": "not an address"}), 422,
                 "invalid_email")
    assert_error(await project.api.post("/v1/operators", {}), 400, "invalid_request")
    assert_error(await project.api.post("/v1/operators", {"email": email(), "role": "admin"}),
                 400, "invalid_request")


async def test_the_listing_pages(project: Project) -> None:
    made = [(await add(project.api, email()))["id"] for _ in range(3)]
    r = await project.api.get("/v1/operators?limit=2")
    assert [o["id"] for o in r.body["data"]] == made[:2] and r.body["has_more"] is True
    r = await project.api.get(f"/v1/operators?limit=2&cursor={r.body['next_cursor']}")
    assert [o["id"] for o in r.body["data"]] == made[2:] and r.body["has_more"] is False
    # A cursor of another tenant's listing is refused.
    other = await bootstrap_project(project.api, "other")
    await add(other.api, email())
    await add(other.api, email())
    theirs = (await other.api.get("/v1/operators?limit=1")).body["next_cursor"]
    assert_error(await project.api.get(f"/v1/operators?cursor={theirs}"), 400, "invalid_request")


async def test_bootstrap_makes_the_first_operator(service: Api, db: asyncpg.Pool) -> None:
    address = f"founder-{secrets.token_hex(4)}@example.com"
    r = await service.post(
        "/v1/bootstrap", {"tenant_name": "Acme", "project_name": "docs", "environment": "test",
                          "operator_email": address},
        headers={"x-service-bootstrap-token": BOOTSTRAP_TOKEN}, key=None)
    assert r.status == 201, r.body
    # The spec's fields as they always were, and the operator beside them.
    assert set(r.body) == {"tenant", "project", "api_key", "operator", "request_id"}
    assert set(r.body["api_key"]) >= {"id", "secret", "warning"}
    operator = r.body["operator"]
    assert set(operator) == {"id", "email"} and operator["email"] == address
    project_id, key = r.body["project"]["id"], r.body["api_key"]["secret"]

    listed = (await service.with_key(key).get("/v1/operators")).body["data"]
    assert [(o["id"], o["email"], o["tenant_id"]) for o in listed] == \
        [(operator["id"], address, r.body["tenant"]["id"])]
    [boot] = await events(db, project_id, "dashboard_operator.bootstrapped")
    assert boot["actor_type"] == "operator" and boot["actor_id"] == "bootstrap_token"
    assert boot["metadata"]["operator_id"] == operator["id"]
    assert boot["metadata"]["operator_email"] == address
    assert await events(db, project_id, "dashboard_operator.added") == []

    # Without it, the answer is what it always was.
    r = await service.post(
        "/v1/bootstrap", {"tenant_name": "Beta", "project_name": "docs", "environment": "test"},
        headers={"x-service-bootstrap-token": BOOTSTRAP_TOKEN}, key=None)
    assert set(r.body) == {"tenant", "project", "api_key", "request_id"}
    assert await db.fetchval("SELECT count(*) FROM projects WHERE tenant_id = $1",
                             r.body["tenant"]["id"]) == 1


async def test_a_failed_bootstrap_leaves_no_operator(service: Api, db: asyncpg.Pool) -> None:
    tenants = await db.fetchval("SELECT count(*) FROM tenants")
    r = await service.post(
        "/v1/bootstrap", {"tenant_name": "Acme", "project_name": "docs", "environment": "test",
                          "operator_email": "nope"},
        headers={"x-service-bootstrap-token": BOOTSTRAP_TOKEN}, key=None)
    assert_error(r, 422, "invalid_email")
    assert await db.fetchval("SELECT count(*) FROM tenants") == tenants


async def test_an_operator_link_lands_on_the_console(project: Project, db: asyncpg.Pool) -> None:
    """Every link of the operator project (the invitation too) lands on the console's page; an
    ordinary project's link on the magic-link landing page."""
    await add(project.api, email())
    console_project = await operator_project(db, project.tenant_id)
    async with project.api.session.get(
            f"{project.api.base_url}/v1/auth/magic-link/verify?project_id={console_project}",
            allow_redirects=False) as r:
        assert r.status == 303
        assert r.headers["Location"] == f"/console/verify?project_id={console_project}"
    async with project.api.session.get(
            f"{project.api.base_url}/v1/auth/magic-link/verify?project_id={project.id}",
            allow_redirects=False) as r:
        assert r.status == 200 and r.content_type == "text/html"
