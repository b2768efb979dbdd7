"""POST /v1/bootstrap: the first tenant, project and ``sk_live_`` key (SPEC.md 4 rule 1, 5.3)."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, Final

import asyncpg
from aiohttp import web

from common.appkeys import PG_POOL, SETTINGS
from common.errors import BootstrapDisabled, MissingBootstrapToken
from common.http import json_response
from common.ids import new_id
from common.schemas import DisplayName, RequestModel, parse_body
from control_plane import audit
from control_plane.api_keys import ONE_TIME_WARNING, insert_key

HEADER: Final = "x-service-bootstrap-token"


class BootstrapBody(RequestModel):
    tenant_name: DisplayName
    project_name: DisplayName
    environment: DisplayName


def check_token(configured: str | None, presented: str | None) -> None:
    """Raises BootstrapDisabled when unconfigured, MissingBootstrapToken when wrong (constant
    time compare)."""
    if configured is None:
        raise BootstrapDisabled()
    # Digests of both sides: equal length whatever was sent, and header bytes that are not
    # UTF-8 (aiohttp keeps them as surrogate escapes) cannot make the comparison fail loudly.
    if presented is None or not hmac.compare_digest(
        hashlib.sha256(presented.encode("utf-8", "surrogateescape")).digest(),
        hashlib.sha256(configured.encode()).digest(),
    ):
        raise MissingBootstrapToken()


async def bootstrap(
    conn: asyncpg.Connection, actor: audit.Actor, body: BootstrapBody
) -> dict[str, Any]:
    """Create tenant, project and a full-access ``sk_live_`` key with their audit events."""
    tenant_id, project_id = new_id("ten"), new_id("proj")
    async with conn.transaction():
        await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, $2)", tenant_id,
                           body.tenant_name)
        await conn.execute(
            "INSERT INTO projects (id, tenant_id, name, environment) VALUES ($1, $2, $3, $4)",
            project_id, tenant_id, body.project_name, body.environment,
        )
        key, secret = await insert_key(
            conn, project_id=project_id, prefix="sk_live_", name="bootstrap", scopes=[],
            created_by_key_id=None,
        )
        await audit.record(
            conn, actor, action="dashboard_operator.bootstrapped", project_id=project_id,
            target_type="project", target_id=project_id,
            description=f"Bootstrapped tenant {body.tenant_name!r}, project {body.project_name!r}",
            metadata={"tenant_id": tenant_id, "environment": body.environment},
        )
        await audit.record(
            conn, actor, action="api_key.created", project_id=project_id,
            target_type="api_key", target_id=key["id"],
            description="Created the bootstrap API key",
            metadata={"prefix": "sk_live_", "scopes": [], "name": "bootstrap"},
        )
    return {
        "tenant": {"id": tenant_id, "name": body.tenant_name},
        "project": {"id": project_id, "name": body.project_name,
                    "environment": body.environment},
        "api_key": {**key, "secret": secret, "warning": ONE_TIME_WARNING},
    }


async def post_bootstrap(request: web.Request) -> web.Response:
    """Handler: header check first, so a stranger learns nothing from body validation."""
    token = request.app[SETTINGS].bootstrap_token
    check_token(token.get_secret_value() if token else None, request.headers.get(HEADER))
    body = await parse_body(request, BootstrapBody)
    actor = audit.actor_from_request(request, actor_type="operator", actor_id="bootstrap_token")
    async with request.app[PG_POOL].acquire() as conn:
        result = await bootstrap(conn, actor, body)
    return json_response(request, result, status=201)
