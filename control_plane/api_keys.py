"""API keys: create, list, revoke (SPEC.md 2 and 5, DESIGN.md "API keys").

A key holds a prefix, a name and scopes; an empty scope list means full access. No escalation:
a key may only create keys whose access is within its own. Secrets are shown once, stored as
SHA-256. Revocation is published on Redis so every process drops the key at once.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import asyncpg
from aiohttp import web
from pydantic import field_validator

from common.appkeys import AUTHENTICATOR, PG_POOL, REDIS, SETTINGS
from common.auth import SCOPES, Principal, generate_secret, hash_secret, publish_revocation
from common.errors import InsufficientScope, NotFound
from common.http import json_response
from common.ids import new_id
from common.schemas import DisplayName, RequestModel, parse_body
from control_plane import audit
from control_plane.appkeys import CURSOR_SECRET
from control_plane.pagination import project_page_by_id
from control_plane.principal import authenticate

ONE_TIME_WARNING: Final = (
    "Store this secret now: it is shown only once and cannot be retrieved again."
)
_COLUMNS: Final = "id, name, prefix, last_four, scopes, created_at, revoked_at, created_by_key_id"


class CreateKeyBody(RequestModel):
    prefix: Literal["sk_live_", "sk_test_"]
    name: DisplayName
    scopes: list[str]

    @field_validator("scopes")
    @classmethod
    def _known_scopes(cls, v: list[str]) -> list[str]:
        unknown = sorted(set(v) - SCOPES)
        if unknown:
            raise ValueError(f"unknown scopes {unknown}; allowed: {sorted(SCOPES)}")
        return sorted(set(v))


def check_no_escalation(actor: Principal, scopes: list[str], prefix: str, *, verb: str) -> None:
    """Raises InsufficientScope when a key with ``scopes`` and ``prefix`` holds more access than
    ``actor``: DESIGN.md's rule that a key can never create a key with more access than itself,
    applied to revocation too (a narrow key must not lock out a broader one). A ``sk_test_`` key
    acts on ``sk_test_`` keys only."""
    if actor.prefix == "sk_test_" and prefix != "sk_test_":
        raise InsufficientScope(
            f"A sk_test_ key cannot {verb} a {prefix} key.", details={"prefix": prefix}
        )
    if not actor.scopes:
        return
    excess = sorted(set(scopes) - actor.scopes) if scopes else ["(full access)"]
    if excess:
        raise InsufficientScope(
            f"A key cannot {verb} a key with more access than itself.",
            details={"exceeding_scopes": excess},
        )


async def insert_key(
    conn: asyncpg.Connection, *, project_id: str, prefix: str, name: str, scopes: list[str],
    created_by_key_id: str | None,
) -> tuple[dict[str, Any], str]:
    """Insert a key and return (its public fields, the plaintext secret)."""
    secret = generate_secret(prefix)
    row = await conn.fetchrow(
        f"""INSERT INTO api_keys (id, project_id, name, prefix, secret_hash, last_four, scopes,
                                  created_by_key_id)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING {_COLUMNS}""",
        new_id("key"), project_id, name, prefix, hash_secret(secret), secret[-4:], scopes,
        created_by_key_id,
    )
    assert row is not None
    return dict(row), secret


async def create_key(
    conn: asyncpg.Connection, actor: audit.Actor, creator: Principal, body: CreateKeyBody
) -> dict[str, Any]:
    """Create a key in the creator's project, with its ``api_key.created`` event."""
    check_no_escalation(creator, body.scopes, body.prefix, verb="create")
    async with conn.transaction():
        key, secret = await insert_key(
            conn, project_id=creator.project_id, prefix=body.prefix, name=body.name,
            scopes=body.scopes, created_by_key_id=creator.key_id,
        )
        await audit.record(
            conn, actor, action="api_key.created", project_id=creator.project_id,
            target_type="api_key", target_id=key["id"],
            description=f"Created API key {body.name!r}",
            metadata={"prefix": body.prefix, "scopes": body.scopes, "name": body.name},
        )
    return {**key, "secret": secret, "warning": ONE_TIME_WARNING}


async def revoke_key(
    conn: asyncpg.Connection, actor: audit.Actor, revoker: Principal, key_id: str
) -> tuple[dict[str, Any], str | None]:
    """Revoke ``key_id`` and return (the key, its hash if this call revoked it, else None).

    Idempotent: revoking a revoked key returns it unchanged with no new event.
    Raises NotFound when the project has no such key, InsufficientScope when the key holds more
    access than ``revoker``.
    """
    project_id = revoker.project_id
    async with conn.transaction():
        row = await conn.fetchrow(
            f"SELECT {_COLUMNS}, secret_hash FROM api_keys WHERE id = $1 AND project_id = $2 FOR UPDATE",
            key_id, project_id,
        )
        if row is None:
            raise NotFound("No API key with that id in this project.")
        key = dict(row)
        digest = key.pop("secret_hash")
        check_no_escalation(revoker, key["scopes"], key["prefix"], verb="revoke")
        if key["revoked_at"] is not None:
            return key, None
        key["revoked_at"] = await conn.fetchval(
            "UPDATE api_keys SET revoked_at = now() WHERE id = $1 RETURNING revoked_at", key_id
        )
        await audit.record(
            conn, actor, action="api_key.revoked", project_id=project_id,
            target_type="api_key", target_id=key_id,
            description=f"Revoked API key {key['name']!r}",
        )
    return key, digest


async def post_key(request: web.Request) -> web.Response:
    principal = await authenticate(request, "keys:write")
    body = await parse_body(request, CreateKeyBody)
    async with request.app[PG_POOL].acquire() as conn:
        key = await create_key(conn, audit.actor_from_request(request, principal), principal, body)
    return json_response(request, key, status=201)


async def list_keys(request: web.Request) -> web.Response:
    principal = await authenticate(request, "keys:write")
    body = await project_page_by_id(request.app[PG_POOL], request.query, table="api_keys",
                                    columns=_COLUMNS, project_id=principal.project_id,
                                    secret=request.app[CURSOR_SECRET])
    return json_response(request, body)


async def delete_key(request: web.Request) -> web.Response:
    principal = await authenticate(request, "keys:write")
    actor = audit.actor_from_request(request, principal)
    async with request.app[PG_POOL].acquire() as conn:
        key, digest = await revoke_key(conn, actor, principal, request.match_info["key_id"])
    if digest is not None:
        request.app[AUTHENTICATOR].invalidate(digest)
        await publish_revocation(request.app[REDIS], request.app[SETTINGS].redis_prefix, digest)
    return json_response(request, key)
