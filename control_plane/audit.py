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

COLUMNS: Final = (
    "id, action, actor_type, actor_id, user_id, project_id, target_type, target_id, ip, "
    "user_agent, description, api_key_id, metadata"
)
_INSERT: Final = f"INSERT INTO audit_events ({COLUMNS}) VALUES ({', '.join(f'${i}' for i in range(1, 14))})"


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
    values = event_values(actor, action=action, project_id=project_id, target_type=target_type,
                          target_id=target_id, user_id=user_id, description=description,
                          metadata=metadata)
    await conn.execute(_INSERT, *values)
    return str(values[0])


def event_values(
    actor: Actor, *, action: str, project_id: str | None, target_type: str | None = None,
    target_id: str | None = None, user_id: str | None = None, description: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> list[Any]:
    """One event's values in ``COLUMNS`` order (a new ``evt_`` id first), as ``record`` stores
    them; with ``insert_from`` a statement can write its event itself."""
    meta = dict(metadata or {})
    if description is not None:
        meta.setdefault("description", description)
    return [new_id("evt"), action, actor.type, actor.id, user_id, project_id, target_type,
            target_id, actor.ip, actor.user_agent, description, actor.api_key_id, meta]


def insert_from(source: str, first: int, *, more_metadata: str = "") -> str:
    """SQL inserting one event per row of ``source`` (a CTE of the same statement) from the
    parameters ``$first`` .. ``$first+12`` holding ``event_values``; ``more_metadata`` is a
    jsonb expression over ``source`` merged into the metadata (values known only in the
    statement, such as the organization it picked). The event commits with the statement's
    change, as with ``record``: one round trip instead of two on hot paths."""
    params = [f"${first + i}" for i in range(13)]
    params[12] = f"${first + 12}::jsonb" + (f" || {more_metadata}" if more_metadata else "")
    return f"INSERT INTO audit_events ({COLUMNS}) SELECT {', '.join(params)} FROM {source}"
