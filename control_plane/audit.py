"""The audit log's write path: one function, called inside the caller's transaction.

SPEC.md 2 "Audit event" and DESIGN.md "audit writes": an action that rolls back leaves no event;
one that commits always has one. The actor, API key id, IP and user agent come from the request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import asyncpg
from aiohttp import web

from common.appkeys import SETTINGS
from common.auth import Principal
from common.http import client_ip
from common.ids import new_id

_INSERT: Final = """
INSERT INTO audit_events (id, action, actor_type, actor_id, user_id, project_id, target_type,
                          target_id, ip, user_agent, description, api_key_id, metadata)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
"""


@dataclass(frozen=True, slots=True)
class Actor:
    """Who did it, and from where (``actor_type`` e.g. ``api_key``, ``operator``, ``user``)."""

    type: str
    id: str | None
    api_key_id: str | None
    ip: str | None
    user_agent: str | None


def actor_from_request(
    request: web.Request, principal: Principal | None = None, *,
    actor_type: str | None = None, actor_id: str | None = None,
) -> Actor:
    """The acting party of ``request``: the API key when there is one, else the given type/id."""
    key_id = principal.key_id if principal else None
    return Actor(
        type=actor_type or ("api_key" if principal else "anonymous"),
        id=actor_id or key_id,
        api_key_id=key_id,
        ip=client_ip(request, request.app[SETTINGS].trusted_proxy_networks),
        user_agent=request.headers.get("User-Agent"),
    )


async def record(
    conn: asyncpg.Connection,
    actor: Actor,
    *,
    action: str,
    project_id: str | None,
    target_type: str | None = None,
    target_id: str | None = None,
    user_id: str | None = None,
    description: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> str:
    """Insert one event in ``conn``'s current transaction and return its ``evt_`` id.

    ``description`` is stored in its column and in ``metadata.description`` (SPEC.md 2).
    """
    meta = dict(metadata or {})
    if description is not None:
        meta.setdefault("description", description)
    event_id = new_id("evt")
    await conn.execute(
        _INSERT, event_id, action, actor.type, actor.id, user_id, project_id, target_type,
        target_id, actor.ip, actor.user_agent, description, actor.api_key_id, meta,
    )
    return event_id
