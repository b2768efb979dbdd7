"""The project of a public endpoint (DESIGN.md "project of public endpoints").

In order: the ``project_id`` query parameter, else the ``Service-Project`` header, else the
request's host matched to a domain a project configured (``PATCH /v1/projects/me`` ``domains``).
"""

from __future__ import annotations

from typing import Final

import asyncpg
from aiohttp import web

from common.appkeys import PG_POOL
from common.errors import InvalidRequest, ProjectNotFound
from common.ids import is_id
from common.schemas import refuse_nul

HEADER: Final = "Service-Project"


async def resolve_project(request: web.Request) -> str:
    """The id of the project ``request`` addresses.

    Raises InvalidRequest naming ``project_id`` when nothing names a project or the name holds
    NUL, ProjectNotFound when what names one matches no project.
    """
    by_query = request.query.get("project_id")
    named = by_query or request.headers.get(HEADER)
    pool: asyncpg.Pool = request.app[PG_POOL]
    if named:
        refuse_nul("project_id" if by_query else HEADER, named)
        if not is_id(named, "proj") or await pool.fetchval(
            "SELECT 1 FROM projects WHERE id = $1", named
        ) is None:
            raise ProjectNotFound(details={"project_id": named})
        return named
    host = (request.url.host or "").lower()
    if host:
        project_id = await pool.fetchval(
            "SELECT project_id FROM project_domains WHERE domain = $1", host
        )
        if project_id is not None:
            return str(project_id)
    raise InvalidRequest.field(
        "project_id", f"name the project: the project_id query parameter, the {HEADER} header, "
                      "or a host configured as one of the project's domains",
    )
