"""GET /v1/projects/me: the project of the calling API key."""

from __future__ import annotations

from typing import Any, Final

import asyncpg
from aiohttp import web

from common.appkeys import PG_POOL
from common.http import json_response
from control_plane.principal import authenticate

_SELECT: Final = """
SELECT p.id, p.name, p.environment, p.tenant_id, p.created_at
FROM projects p WHERE p.id = $1
"""


async def get_project(conn: asyncpg.Connection | asyncpg.Pool, project_id: str) -> dict[str, Any]:
    """The project row as the API shows it (``id``, ``name``, ``environment``, ``tenant_id``,
    ``created_at``)."""
    row = await conn.fetchrow(_SELECT, project_id)
    assert row is not None  # an authenticated key's project exists (FK, cascade on delete)
    return dict(row)


async def get_me(request: web.Request) -> web.Response:
    principal = await authenticate(request)
    project = await get_project(request.app[PG_POOL], principal.project_id)
    return json_response(request, project)
