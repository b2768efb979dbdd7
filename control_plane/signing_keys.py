"""Per-project JWT signing keys: generation, storage, lifecycle, rotation and the JWKS.

SPEC.md 2 ("Access token") and 8, DESIGN.md "signing keys":

* One ``active`` key per project (the partial unique index ``signing_keys_one_active``), EdDSA
  (Ed25519) by default, RS256 (2048-bit) when ``projects.signing_alg`` says so. ``kid`` is
  ``kid_<ulid>``.
* The private key (PKCS #8 DER) is stored only sealed by the KMS
  (``kms.seal(der, b"signing_key:" + kid)``), so a sealed key copied into another row does not
  open. ``public_jwk`` is the RFC 7517 public JWK (OKP ``crv``/``x`` or RSA ``n``/``e``) with
  ``kid``, ``alg`` and ``use: "sig"``.
* Lifecycle: ``pending`` (published in the JWKS, not yet signing, so verifiers' 10-minute JWKS
  caches learn it first) → ``active`` → ``retired`` with ``publish_until = retired_at + access
  token lifetime + 5 minutes`` (every token it signed has expired by then, SPEC.md 2 "overlap
  window") → row deleted once ``publish_until`` has passed.
* A project with no active key gets one on first use (``ensure_active_key``; concurrent first
  uses end with one key, which all of them use).
* ``run_key_rotation``: every ``signing_key_check_seconds``, a project whose active key is older
  than ``rotation_days - prepublish`` gets a pending key; once the active key is older than
  ``rotation_days`` and the pending key has been published ``prepublish`` seconds, the pending
  key becomes active and the old one retires (audit ``signing_key.rotated``). Every change to a
  project's keys holds its ``projects`` row lock, so several control-plane processes never
  rotate twice.

Endpoints: ``GET /v1/auth/.well-known/jwks.json`` (public), ``GET /v1/signing-keys`` and
``POST /v1/signing-keys/rotate`` (scope ``keys:write``); ``setup`` also registers
``PATCH /v1/projects/me`` (``control_plane.projects``).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

import asyncpg
import orjson
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from common.appkeys import PG_POOL, SETTINGS
from common.errors import ProjectNotFound
from common.http import json_response
from common.ids import new_id
from common.runtime import stop_tasks
from common.schemas import RequestModel, parse_body
from common.settings import Settings
from control_plane import audit
from control_plane.appkeys import CURSOR_SECRET, KMS, TOKENS
from control_plane.kms import LocalKms
from control_plane.pagination import project_page_by_id
from control_plane.principal import authenticate
from control_plane.public_project import HEADER as PROJECT_HEADER
from control_plane.public_project import resolve_project

log = logging.getLogger("authio.signing_keys")

Alg = Literal["EdDSA", "RS256"]
ALGS: Final[tuple[Alg, ...]] = ("EdDSA", "RS256")
DEFAULT_ALG: Final[Alg] = "EdDSA"
RSA_BITS: Final = 2048
RSA_EXPONENT: Final = 65537
# Retired keys stay published this long past the access-token lifetime: tokens signed by
# another process in the few seconds it takes to notice a rotation, and verifiers' clock skew.
RETIRED_SKEW_SECONDS: Final = 300
# SPEC.md 5.4 / 8: verifiers cache the JWKS about 10 minutes.
JWKS_MAX_AGE_SECONDS: Final = 600
SYSTEM_ACTOR: Final = audit.Actor(type="system", id="signing_key_rotation", api_key_id=None,
                                  ip=None, user_agent=None)

PrivateKey = ed25519.Ed25519PrivateKey | rsa.RSAPrivateKey
PublicKey = ed25519.Ed25519PublicKey | rsa.RSAPublicKey

_LIST_COLUMNS: Final = "kid, alg, status, created_at, activated_at, retired_at, publish_until"


# --- key material -------------------------------------------------------------------------------


def private_aad(kid: str) -> bytes:
    """The KMS ``aad`` binding a sealed private key to its ``kid``."""
    return b"signing_key:" + kid.encode()


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _uint(n: int) -> str:
    return _b64url(n.to_bytes(max(1, (n.bit_length() + 7) // 8), "big"))


def public_jwk(private_key: PrivateKey, kid: str, alg: Alg) -> dict[str, str]:
    """The RFC 7517 public JWK of ``private_key`` (RFC 8037 OKP for Ed25519, RFC 7518 6.3 RSA),
    with ``kid``, ``alg`` and ``use: "sig"``."""
    if isinstance(private_key, ed25519.Ed25519PrivateKey):
        raw = private_key.public_key().public_bytes(serialization.Encoding.Raw,
                                                    serialization.PublicFormat.Raw)
        return {"kty": "OKP", "crv": "Ed25519", "x": _b64url(raw), "kid": kid, "alg": alg,
                "use": "sig"}
    numbers = private_key.public_key().public_numbers()
    return {"kty": "RSA", "n": _uint(numbers.n), "e": _uint(numbers.e), "kid": kid, "alg": alg,
            "use": "sig"}


def public_key_from_jwk(jwk: dict[str, Any]) -> PublicKey:
    """The verification key of a JWK this module wrote. Raises ValueError for anything else."""
    if jwk.get("kty") == "OKP" and jwk.get("crv") == "Ed25519":
        return ed25519.Ed25519PublicKey.from_public_bytes(_b64url_decode(str(jwk["x"])))
    if jwk.get("kty") == "RSA":
        n = int.from_bytes(_b64url_decode(str(jwk["n"])), "big")
        e = int.from_bytes(_b64url_decode(str(jwk["e"])), "big")
        return rsa.RSAPublicNumbers(e, n).public_key()
    raise ValueError("not an Ed25519 or RSA public JWK")


def open_private_key(kms: LocalKms, kid: str, sealed: bytes) -> PrivateKey:
    """Unseal and load a stored private key. Raises control_plane.kms.KmsError when the KEK or
    ``kid`` does not match, ValueError when the plaintext is not a supported key."""
    key = serialization.load_der_private_key(kms.open(sealed, private_aad(kid)), password=None)
    if not isinstance(key, ed25519.Ed25519PrivateKey | rsa.RSAPrivateKey):
        raise ValueError("the stored signing key is neither Ed25519 nor RSA")
    return key


@dataclass(frozen=True, slots=True)
class NewKey:
    """A freshly generated key, ready to insert: its public JWK and sealed private key."""

    kid: str
    alg: Alg
    public_jwk: dict[str, str]
    private_sealed: bytes


def _generate(kms: LocalKms, alg: Alg) -> NewKey:
    private_key: PrivateKey
    if alg == "EdDSA":
        private_key = ed25519.Ed25519PrivateKey.generate()
    elif alg == "RS256":
        private_key = rsa.generate_private_key(public_exponent=RSA_EXPONENT, key_size=RSA_BITS)
    else:
        raise ValueError(f"unsupported signing algorithm {alg!r}")
    kid = new_id("kid")
    der = private_key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    return NewKey(kid, alg, public_jwk(private_key, kid, alg), kms.seal(der, private_aad(kid)))


async def generate_key(kms: LocalKms, alg: Alg) -> NewKey:
    """A new key pair for ``alg``, the private half sealed. RSA generation (tens of
    milliseconds) runs in a thread so the event loop keeps serving."""
    if alg == "RS256":
        return await asyncio.to_thread(_generate, kms, alg)
    return _generate(kms, alg)


# --- storage ------------------------------------------------------------------------------------


async def _insert(conn: asyncpg.Connection, project_id: str, key: NewKey,
                  status: Literal["pending", "active"], *, unless_active: bool = False) -> bool:
    """Store ``key`` with ``status`` (an active key is stamped ``activated_at``). With
    ``unless_active``, a project that already has an active key keeps it and nothing is stored
    (the partial unique index ``signing_keys_one_active`` decides, race-free). Returns whether
    the key was stored."""
    conflict = "ON CONFLICT (project_id) WHERE status = 'active' DO NOTHING" if unless_active else ""
    kid = await conn.fetchval(
        f"""INSERT INTO signing_keys (kid, project_id, alg, public_jwk, private_sealed, status,
                                      activated_at)
            VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $6 = 'active' THEN now() END)
            {conflict} RETURNING kid""",
        key.kid, project_id, key.alg, key.public_jwk, key.private_sealed, status,
    )
    return kid is not None


async def ensure_active_key(pool: asyncpg.Pool, kms: LocalKms, project_id: str) -> asyncpg.Record:
    """The project's active key (``kid``, ``alg``, ``private_sealed``), created in the project's
    ``signing_alg`` when it has none (a project made by bootstrap starts without one).

    Race-safe without locks: the insert yields to the partial unique index
    ``signing_keys_one_active`` (``ON CONFLICT DO NOTHING``) and the key is read back, so
    concurrent first uses all end with the one key that won. Raises ProjectNotFound.
    """
    select = "SELECT kid, alg, private_sealed FROM signing_keys WHERE project_id = $1 AND status = 'active'"
    row = await pool.fetchrow(select, project_id)
    if row is not None:
        return row
    alg = await pool.fetchval("SELECT signing_alg FROM projects WHERE id = $1", project_id)
    if alg is None:
        raise ProjectNotFound(details={"project_id": project_id})
    key = await generate_key(kms, alg)
    async with pool.acquire() as conn, conn.transaction():
        if await _insert(conn, project_id, key, "active", unless_active=True):
            await audit.record(
                conn, SYSTEM_ACTOR, action="signing_key.created", project_id=project_id,
                target_type="signing_key", target_id=key.kid,
                description=f"Created the project's first {alg} signing key",
                metadata={"kid": key.kid, "alg": alg},
            )
    row = await pool.fetchrow(select, project_id)
    assert row is not None  # ours or the concurrent winner's (an active key is never removed)
    return row


async def published_jwks(pool: asyncpg.Pool, kms: LocalKms, project_id: str) -> list[dict[str, Any]]:
    """The project's JWK Set members: active, pending and still-published retired keys (active
    first, then newest first). Creates the active key when the project has none yet, so a
    verifier that fetches the JWKS at boot already knows the key its first token will carry."""
    query = """
        SELECT public_jwk, status FROM signing_keys
        WHERE project_id = $1
          AND (status IN ('active', 'pending') OR publish_until > now())
        ORDER BY status = 'active' DESC, created_at DESC, kid DESC"""
    rows = await pool.fetch(query, project_id)
    if not any(r["status"] == "active" for r in rows):
        await ensure_active_key(pool, kms, project_id)
        rows = await pool.fetch(query, project_id)
    return [r["public_jwk"] for r in rows]


def overlap(settings: Settings) -> timedelta:
    """How long a retired key stays published: the access-token lifetime plus the skew."""
    return timedelta(seconds=settings.access_token_ttl_seconds + RETIRED_SKEW_SECONDS)


async def _lock_project(conn: asyncpg.Connection, project_id: str) -> Alg:
    """Lock the project row (serializing every key change of the project across processes) and
    return its ``signing_alg``. Raises ProjectNotFound."""
    alg = await conn.fetchval("SELECT signing_alg FROM projects WHERE id = $1 FOR UPDATE", project_id)
    if alg is None:
        raise ProjectNotFound(details={"project_id": project_id})
    return alg  # type: ignore[no-any-return]


async def _swap_active(
    conn: asyncpg.Connection, settings: Settings, project_id: str, new_kid: str, *, from_pending: bool,
) -> asyncpg.Record | None:
    """Retire the active key (if any) with its overlap window, then make ``new_kid`` active.
    Returns the retired key's ``kid`` and ``alg``."""
    old = await conn.fetchrow(
        """UPDATE signing_keys SET status = 'retired', retired_at = now(), publish_until = now() + $2
           WHERE project_id = $1 AND status = 'active' RETURNING kid, alg""",
        project_id, overlap(settings),
    )
    if from_pending:
        await conn.execute(
            "UPDATE signing_keys SET status = 'active', activated_at = now() WHERE kid = $1", new_kid
        )
    return old


async def rotate_now(
    conn: asyncpg.Connection, kms: LocalKms, settings: Settings, actor: audit.Actor, *,
    project_id: str, alg: Alg | None = None, reason: str = "manual",
) -> dict[str, Any]:
    """Make a new key active at once and retire the current one with the overlap window
    (SPEC.md 2): ``POST /v1/signing-keys/rotate`` and a change of ``signing_alg``.

    ``alg`` (default: the project's ``signing_alg``) becomes the project's ``signing_alg`` so the
    next scheduled rotation keeps it. A pending key of that algorithm becomes the new active key
    (verifiers may already have it cached); a pending key of another algorithm never signed
    anything and is dropped. Writes ``signing_key.rotated`` (metadata ``old_kid``, ``old_alg``,
    ``new_kid``, ``alg``, ``reason``) in the same transaction. Returns the new key as
    ``GET /v1/signing-keys`` lists it. Raises ProjectNotFound.
    """
    async with conn.transaction():
        current = await _lock_project(conn, project_id)
        target: Alg = alg or current
        if target != current:
            await conn.execute("UPDATE projects SET signing_alg = $2 WHERE id = $1", project_id, target)
        pending = await conn.fetchrow(
            "SELECT kid, alg FROM signing_keys WHERE project_id = $1 AND status = 'pending'", project_id
        )
        if pending is not None and pending["alg"] == target:
            new_kid = pending["kid"]
            old = await _swap_active(conn, settings, project_id, new_kid, from_pending=True)
        else:
            if pending is not None:
                await conn.execute("DELETE FROM signing_keys WHERE kid = $1", pending["kid"])
            key = await generate_key(kms, target)
            new_kid = key.kid
            old = await _swap_active(conn, settings, project_id, new_kid, from_pending=False)
            await _insert(conn, project_id, key, "active")
        await audit.record(
            conn, actor, action="signing_key.rotated", project_id=project_id,
            target_type="signing_key", target_id=new_kid,
            description=f"Rotated the signing key ({reason})",
            metadata={"old_kid": old["kid"] if old else None, "old_alg": old["alg"] if old else None,
                      "new_kid": new_kid, "alg": target, "reason": reason},
        )
        row = await conn.fetchrow(f"SELECT {_LIST_COLUMNS} FROM signing_keys WHERE kid = $1", new_kid)
    assert row is not None
    return dict(row)


async def delete_expired_keys(conn: asyncpg.Connection | asyncpg.Pool, *, now: datetime | None = None,
                              project_id: str | None = None) -> list[str]:
    """Delete retired keys whose ``publish_until`` has passed (at ``now``, default the database
    clock), of one project or all. Returns the deleted ``kid``s."""
    rows = await conn.fetch(
        """DELETE FROM signing_keys
           WHERE status = 'retired' AND publish_until < coalesce($1::timestamptz, now())
             AND ($2::text IS NULL OR project_id = $2)
           RETURNING kid""",
        now, project_id,
    )
    return [r["kid"] for r in rows]


# --- scheduled rotation -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RotationPass:
    """What one pass of the rotation worker did (``kid``s)."""

    published: list[str]
    rotated: list[str]
    deleted: list[str]


async def _advance(conn: asyncpg.Connection, kms: LocalKms, settings: Settings,
                   project_id: str) -> tuple[str | None, str | None]:
    """One project's scheduled step, under its row lock. Returns (the kid newly published as
    pending, the kid newly activated)."""
    rotate_after = timedelta(days=settings.signing_key_rotation_days)
    prepublish = timedelta(seconds=settings.signing_key_prepublish_seconds)
    async with conn.transaction():
        try:
            project_alg = await _lock_project(conn, project_id)
        except ProjectNotFound:
            return None, None
        keys = {r["status"]: r for r in await conn.fetch(
            """SELECT kid, alg, status, now() - activated_at AS active_for,
                      now() - created_at AS published_for
               FROM signing_keys WHERE project_id = $1 AND status IN ('active', 'pending')""",
            project_id,
        )}
        active, pending = keys.get("active"), keys.get("pending")
        if active is None or active["active_for"] < rotate_after - prepublish:
            return None, None  # re-checked under the lock: another process may have rotated
        if pending is not None and pending["alg"] != project_alg:
            await conn.execute("DELETE FROM signing_keys WHERE kid = $1", pending["kid"])
            pending = None
        if pending is None:
            key = await generate_key(kms, project_alg)
            await _insert(conn, project_id, key, "pending")
            return key.kid, None
        if active["active_for"] < rotate_after or pending["published_for"] < prepublish:
            return None, None
        await _swap_active(conn, settings, project_id, pending["kid"], from_pending=True)
        await audit.record(
            conn, SYSTEM_ACTOR, action="signing_key.rotated", project_id=project_id,
            target_type="signing_key", target_id=pending["kid"],
            description="Rotated the signing key (scheduled)",
            metadata={"old_kid": active["kid"], "old_alg": active["alg"], "new_kid": pending["kid"],
                      "alg": pending["alg"], "reason": "scheduled"},
        )
        return None, pending["kid"]


async def rotation_pass(pool: asyncpg.Pool, kms: LocalKms, settings: Settings) -> RotationPass:
    """One pass over every project whose active key is due for a pending key or rotation, then
    the deletion of retired keys past ``publish_until``."""
    due_after = max(settings.signing_key_rotation_days * 86_400 - settings.signing_key_prepublish_seconds, 0.0)
    project_ids = await pool.fetch(
        """SELECT project_id FROM signing_keys
           WHERE status = 'active' AND activated_at <= now() - make_interval(secs => $1)""",
        due_after,
    )
    published: list[str] = []
    rotated: list[str] = []
    for row in project_ids:
        async with pool.acquire() as conn:
            new_pending, activated = await _advance(conn, kms, settings, row["project_id"])
        if new_pending:
            published.append(new_pending)
        if activated:
            rotated.append(activated)
    deleted = await delete_expired_keys(pool)
    return RotationPass(published, rotated, deleted)


async def run_key_rotation(pool: asyncpg.Pool, kms: LocalKms, settings: Settings) -> None:
    """The rotation worker: a pass every ``signing_key_check_seconds`` until cancelled. A failed
    pass (database down) is logged and retried at the next tick."""
    while True:
        try:
            done = await rotation_pass(pool, kms, settings)
            if done.published or done.rotated or done.deleted:
                log.info("signing keys: published %d, rotated %d, deleted %d",
                         len(done.published), len(done.rotated), len(done.deleted))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("signing key rotation pass failed; retrying at the next check")
        await asyncio.sleep(settings.signing_key_check_seconds)


# --- HTTP ---------------------------------------------------------------------------------------


class RotateBody(RequestModel):
    alg: Alg | None = None


def jwks_etag(keys: list[dict[str, Any]]) -> str:
    """A strong ETag value (without quotes) of the JWK Set."""
    return hashlib.sha256(orjson.dumps(keys, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


async def get_jwks(request: web.Request) -> web.StreamResponse:
    """``GET /v1/auth/.well-known/jwks.json`` (public; project per DESIGN.md): ``{"keys": [...]}``
    with ``Cache-Control: public, max-age=600`` and an ETag (``If-None-Match`` → 304).

    Raises InvalidRequest (no project named), ProjectNotFound.
    """
    project_id = await resolve_project(request)
    keys = await published_jwks(request.app[PG_POOL], request.app[KMS], project_id)
    etag = jwks_etag(keys)
    headers = {
        "Cache-Control": f"public, max-age={JWKS_MAX_AGE_SECONDS}",
        "ETag": f'"{etag}"',
        "Vary": PROJECT_HEADER,
    }
    wanted = request.if_none_match
    if wanted and any(t.value in (etag, "*") for t in wanted):
        return web.Response(status=304, headers=headers)
    return json_response(request, {"keys": keys}, headers=headers)


async def list_keys(request: web.Request) -> web.Response:
    """``GET /v1/signing-keys`` (``keys:write``): ``kid``, ``alg``, ``status``, ``created_at``,
    ``activated_at``, ``retired_at``, ``publish_until`` of the project's stored keys in creation
    order, keyset-paginated (DESIGN.md "lists"). Never private material."""
    principal = await authenticate(request, "keys:write")
    body = await project_page_by_id(
        request.app[PG_POOL], request.query, table="signing_keys", columns=_LIST_COLUMNS,
        project_id=principal.project_id, secret=request.app[CURSOR_SECRET], id_column="kid",
    )
    return json_response(request, body)


async def post_rotate(request: web.Request) -> web.Response:
    """``POST /v1/signing-keys/rotate`` (``keys:write``; body ``{}`` or ``{"alg": "EdDSA" |
    "RS256"}``): a new active key at once, the old one retired with its overlap window. 201 with
    the new key."""
    principal = await authenticate(request, "keys:write")
    body = await parse_body(request, RotateBody)
    async with request.app[PG_POOL].acquire() as conn:
        key = await rotate_now(conn, request.app[KMS], request.app[SETTINGS],
                               audit.actor_from_request(request, principal),
                               project_id=principal.project_id, alg=body.alg)
    request.app[TOKENS].forget(principal.project_id)
    return json_response(request, key, status=201)


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    # tokens builds on this module (key loading, lazy creation), hence the import here.
    from control_plane.tokens import TokenService

    app[TOKENS] = TokenService(app[PG_POOL], app[KMS], app[SETTINGS])
    worker = asyncio.create_task(run_key_rotation(app[PG_POOL], app[KMS], app[SETTINGS]),
                                 name="signing-key-rotation")
    try:
        yield
    finally:
        await stop_tasks(worker)


def setup(app: web.Application) -> None:
    """Register the JWKS, signing-key and ``PATCH /v1/projects/me`` routes, the token service
    (``TOKENS``) and the rotation worker. Call after the shared resources are installed."""
    from control_plane import projects  # projects rotates keys through this module

    app.cleanup_ctx.append(_lifecycle)
    r = app.router
    r.add_get("/v1/auth/.well-known/jwks.json", get_jwks)
    r.add_get("/v1/signing-keys", list_keys)
    r.add_post("/v1/signing-keys/rotate", post_rotate)
    r.add_patch("/v1/projects/me", projects.patch_me)
