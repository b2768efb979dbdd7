"""Users of a project: create (idempotent), list, show, update, delete (SPEC.md 2 "User", 4 rule 5;
issue 4).

* ``POST /v1/users`` (``users:write``): ``email`` (required), ``name`` (default ``""``),
  ``email_verified`` (default false), optional ``phone_number`` (E.164) and ``metadata`` (a JSON
  object of at most 16 KiB serialized). Idempotent on (project, email compared
  case-insensitively): a new user is 201 with ``"created": true`` and, in the same transaction,
  exactly one enrollment magic link queued and the ``user.created`` event; an existing user is 200
  with ``"created": false`` and nothing else happens (SPEC.md 4 rule 5).
* ``GET /v1/users`` (``users:read``): keyset pages in creation order, optional ``email`` filter
  (exact, case-insensitive); the request header ``Service-Total-Count: true`` adds the response
  header ``Service-Total-Count`` with the project's total number of users.
* ``GET/PATCH/DELETE /v1/users/{user_id}``: PATCH changes ``name``, ``email``,
  ``email_verified``, ``phone_number`` (null clears), ``metadata`` (replaced whole) and records
  ``user.updated`` with the names of the fields that changed; DELETE removes the user (its
  memberships, sessions and tokens cascade), revokes its live sessions at the edge and records
  ``user.deleted``.

Reads accept ``users:read`` or ``users:write`` (a key that may write users may read them, as for
stores). A user of another project, an unknown id and a malformed id are all ``user_not_found``.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import asyncpg
import orjson
from aiohttp import web
from pydantic import AfterValidator, StringConstraints

from common.appkeys import PG_POOL, REDIS, SETTINGS
from common.errors import EmailInUse, InvalidRequest, PhoneInUse, UserNotFound
from common.http import json_response
from common.ids import is_id, new_id
from common.schemas import PatchModel, RequestModel, parse_body, printable
from common.settings import Settings
from control_plane import audit, magic_links, sessions
from control_plane.appkeys import CURSOR_SECRET, KMS
from control_plane.destinations import is_e164, normalize_email
from control_plane.kms import LocalKms
from control_plane.pagination import project_page_by_id
from control_plane.principal import authenticate

USER_COLUMNS: Final = (
    "id, email, email_verified, phone_number, phone_verified, name, metadata, created_at, "
    "updated_at, last_sign_in_at"
)
USER_FIELDS: Final = tuple(USER_COLUMNS.split(", "))
READ_SCOPES: Final = ("users:read", "users:write")
WRITE_SCOPE: Final = "users:write"
MAX_METADATA_BYTES: Final = 16 * 1024
TOTAL_COUNT_HEADER: Final = "Service-Total-Count"

def _metadata_size(value: dict[str, Any]) -> dict[str, Any]:
    size = len(orjson.dumps(value))
    if size > MAX_METADATA_BYTES:
        raise ValueError(f"must be at most {MAX_METADATA_BYTES} bytes as JSON, got {size}")
    return value


def _e164(value: str) -> str:
    if not is_e164(value):
        raise ValueError("must be an E.164 phone number such as +14155550100")
    return value


UserName = Annotated[
    str, StringConstraints(strip_whitespace=True, max_length=200), AfterValidator(printable)
]
"""A user's display name: 0 to 200 characters after trimming, no control characters."""

Metadata = Annotated[dict[str, Any], AfterValidator(_metadata_size)]
"""A free-form JSON object of at most 16 KiB serialized (users and organizations)."""

PhoneNumber = Annotated[str, AfterValidator(_e164)]


class CreateUserBody(RequestModel):
    email: str
    name: UserName = ""
    email_verified: bool = False
    phone_number: PhoneNumber | None = None
    metadata: Metadata | None = None


class UpdateUserBody(PatchModel):
    """Only the fields present change; ``phone_number: null`` clears the number."""

    nullable_fields = frozenset({"phone_number"})

    name: UserName | None = None
    email: str | None = None
    email_verified: bool | None = None
    phone_number: PhoneNumber | None = None
    metadata: Metadata | None = None


def _unique_violation(exc: asyncpg.UniqueViolationError) -> Exception:
    """EmailInUse or PhoneInUse for a violation of the users' unique indexes, else ``exc``."""
    constraint: str | None = exc.constraint_name
    if constraint == "users_project_email":
        return EmailInUse()
    if constraint == "users_project_phone":
        return PhoneInUse()
    error: Exception = exc
    return error


async def find_by_email(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                        email: str) -> asyncpg.Record | None:
    """The project's user with ``email`` compared case-insensitively (``USER_COLUMNS``), or
    None. ``email`` is used as given (normalize it first: ``destinations.normalize_email``)."""
    row: asyncpg.Record | None = await conn.fetchrow(
        f"SELECT {USER_COLUMNS} FROM users WHERE project_id = $1 AND lower(email) = lower($2)",
        project_id, email,
    )
    return row


async def find_by_phone(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                        phone_number: str) -> asyncpg.Record | None:
    """The project's user with the E.164 ``phone_number`` (exact match, ``USER_COLUMNS``), or
    None."""
    row: asyncpg.Record | None = await conn.fetchrow(
        f"SELECT {USER_COLUMNS} FROM users WHERE project_id = $1 AND phone_number = $2",
        project_id, phone_number,
    )
    return row


async def get_user(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                   user_id: str, *, for_update: bool = False) -> dict[str, Any]:
    """The user's fields (``USER_COLUMNS``), its row locked for the caller's transaction with
    ``for_update``. Raises UserNotFound when the id is malformed, unknown or another project's."""
    if not is_id(user_id, "user"):
        raise UserNotFound()
    row = await conn.fetchrow(
        f"SELECT {USER_COLUMNS} FROM users WHERE id = $1 AND project_id = $2"
        + (" FOR UPDATE" if for_update else ""),
        user_id, project_id,
    )
    if row is None:
        raise UserNotFound()
    return dict(row)


async def create_user(
    conn: asyncpg.Connection, actor: audit.Actor, kms: LocalKms, settings: Settings, *,
    project_id: str, body: CreateUserBody,
) -> tuple[dict[str, Any], bool]:
    """Create the user unless one with that email (case-insensitively) exists in the project.

    Returns (the user's fields, True when this call created it). A new user gets, in the same
    transaction, one enrollment magic link queued (lifetime ``invitation_ttl_seconds``) and the
    ``user.created`` event; an existing user is returned as is, with no other effect (SPEC.md 4
    rule 5). Concurrent calls for one email create one user (the unique index decides).
    Raises InvalidEmail (422), PhoneInUse (409).
    """
    email = normalize_email(body.email)
    for _ in range(3):  # an existing row deleted between our insert and read: try again
        async with conn.transaction():
            try:
                row = await conn.fetchrow(
                    f"""INSERT INTO users (id, project_id, email, email_verified, phone_number,
                                           name, metadata)
                        VALUES ($1, $2, $3, $4, $5, $6, $7)
                        ON CONFLICT (project_id, lower(email)) WHERE email IS NOT NULL DO NOTHING
                        RETURNING {USER_COLUMNS}""",
                    new_id("user"), project_id, email, body.email_verified, body.phone_number,
                    body.name, body.metadata or {},
                )
            except asyncpg.UniqueViolationError as exc:
                raise _unique_violation(exc) from None
            if row is None:
                # Another transaction holds the email; ON CONFLICT waited for it to commit, and
                # this new statement's snapshot sees its row.
                existing = await find_by_email(conn, project_id, email)
                if existing is None:
                    continue
                return dict(existing), False
            user = dict(row)
            await magic_links.issue_link(
                conn, kms, settings, project_id=project_id, purpose="enrollment",
                channel="email", destination=email, ttl_seconds=settings.invitation_ttl_seconds,
                user_id=user["id"],
            )
            await audit.record(
                conn, actor, action="user.created", project_id=project_id, target_type="user",
                target_id=user["id"], user_id=user["id"], description=f"Created user {email}",
                metadata={"user_email": email, "email_verified": body.email_verified},
            )
            return user, True
    raise InvalidRequest("The user was deleted while being created; retry the request.")


async def update_user(
    conn: asyncpg.Connection, actor: audit.Actor, *, project_id: str, user_id: str,
    body: UpdateUserBody,
) -> dict[str, Any]:
    """Apply the fields present in ``body`` and return the user.

    A changed email or phone number is unverified unless ``email_verified`` is given alongside
    (a new number is always unverified). ``user.updated`` lists the names of the fields that
    actually changed (never their values); a call that changes nothing records nothing.
    Raises UserNotFound, InvalidEmail, EmailInUse, PhoneInUse, InvalidRequest (the last
    contact, email or phone, cannot be removed).
    """
    fields = body.model_fields_set
    new_email = normalize_email(body.email) if body.email is not None else None
    async with conn.transaction():
        user = await get_user(conn, project_id, user_id, for_update=True)
        wanted: dict[str, Any] = {}
        if "name" in fields:
            wanted["name"] = body.name
        if new_email is not None and new_email != user["email"]:
            wanted["email"] = new_email
            if (user["email"] or "").lower() != new_email.lower():
                wanted["email_verified"] = False
        if "email_verified" in fields:
            wanted["email_verified"] = body.email_verified
        if "phone_number" in fields and body.phone_number != user["phone_number"]:
            wanted["phone_number"] = body.phone_number
            wanted["phone_verified"] = False
        if "metadata" in fields:
            wanted["metadata"] = body.metadata
        changes = {k: v for k, v in wanted.items() if user[k] != v}
        if not changes:
            return user
        names = list(changes)
        assignments = ", ".join(f"{name} = ${i}" for i, name in enumerate(names, start=3))
        try:
            updated = await conn.fetchrow(
                f"""UPDATE users SET {assignments}, updated_at = now()
                    WHERE id = $1 AND project_id = $2 RETURNING {USER_COLUMNS}""",
                user_id, project_id, *changes.values(),
            )
        except asyncpg.UniqueViolationError as exc:
            raise _unique_violation(exc) from None
        except asyncpg.CheckViolationError:
            raise InvalidRequest.field(
                "phone_number", "cannot be cleared: the user has no email address") from None
        assert updated is not None
        await audit.record(
            conn, actor, action="user.updated", project_id=project_id, target_type="user",
            target_id=user_id, user_id=user_id,
            description=f"Updated user {user_id} ({', '.join(sorted(names))})",
            metadata={"changed": sorted(names)},
        )
    return dict(updated)


async def delete_user(
    conn: asyncpg.Connection, actor: audit.Actor, *, project_id: str, user_id: str,
) -> list[Any]:
    """Hard-delete the user; memberships, sessions, refresh and magic-link tokens cascade.

    The user's live sessions are revoked first, in the same transaction, and the revocations are
    returned for the caller to publish after commit (``sessions.publish_revocations``).
    Records ``user.deleted``. Raises UserNotFound.
    """
    async with conn.transaction():
        row = await get_user(conn, project_id, user_id, for_update=True)
        revoked = await sessions.revoke_sessions_of_user(conn, user_id=user_id,
                                                         reason="user_deleted")
        await conn.execute("DELETE FROM users WHERE id = $1", user_id)
        await audit.record(
            conn, actor, action="user.deleted", project_id=project_id, target_type="user",
            target_id=user_id, user_id=user_id, description=f"Deleted user {user_id}",
            metadata={"user_email": row["email"], "sessions_revoked": len(revoked)},
        )
    return list(revoked)


async def list_users(
    pool: asyncpg.Pool, project_id: str, query: Any, *, secret: bytes
) -> dict[str, Any]:
    """A page of the project's users in creation order; ``email`` filters exactly and
    case-insensitively. Raises InvalidRequest (limit, cursor), InvalidEmail (the filter)."""
    email = query.get("email")
    return await project_page_by_id(
        pool, query, table="users", columns=USER_COLUMNS, project_id=project_id, secret=secret,
        where="lower(email) = lower($2)" if email is not None else None,
        args=(normalize_email(email),) if email is not None else (),
    )


def wants_total_count(request: web.Request) -> bool:
    """True when the request carries ``Service-Total-Count: true`` (SPEC.md 4)."""
    return request.headers.get(TOTAL_COUNT_HEADER, "").strip().lower() == "true"


# --- handlers ---------------------------------------------------------------------------------


async def post_user(request: web.Request) -> web.Response:
    principal = await authenticate(request, WRITE_SCOPE)
    body = await parse_body(request, CreateUserBody)
    async with request.app[PG_POOL].acquire() as conn:
        user, created = await create_user(
            conn, audit.actor_from_request(request, principal), request.app[KMS],
            request.app[SETTINGS], project_id=principal.project_id, body=body,
        )
    return json_response(request, {**user, "created": created}, status=201 if created else 200)


async def get_users(request: web.Request) -> web.Response:
    principal = await authenticate(request, *READ_SCOPES)
    pool = request.app[PG_POOL]
    body = await list_users(pool, principal.project_id, request.query,
                            secret=request.app[CURSOR_SECRET])
    headers = None
    if wants_total_count(request):
        total = await pool.fetchval("SELECT count(*) FROM users WHERE project_id = $1",
                                    principal.project_id)
        headers = {TOTAL_COUNT_HEADER: str(total)}
    return json_response(request, body, headers=headers)


async def show_user(request: web.Request) -> web.Response:
    principal = await authenticate(request, *READ_SCOPES)
    user = await get_user(request.app[PG_POOL], principal.project_id, request.match_info["user_id"])
    return json_response(request, user)


async def patch_user(request: web.Request) -> web.Response:
    principal = await authenticate(request, WRITE_SCOPE)
    body = await parse_body(request, UpdateUserBody)
    async with request.app[PG_POOL].acquire() as conn:
        user = await update_user(conn, audit.actor_from_request(request, principal),
                                 project_id=principal.project_id,
                                 user_id=request.match_info["user_id"], body=body)
    return json_response(request, user)


async def remove_user(request: web.Request) -> web.Response:
    principal = await authenticate(request, WRITE_SCOPE)
    user_id = request.match_info["user_id"]
    async with request.app[PG_POOL].acquire() as conn:
        revoked = await delete_user(conn, audit.actor_from_request(request, principal),
                                    project_id=principal.project_id, user_id=user_id)
    await sessions.publish_revocations(request.app[REDIS], request.app[SETTINGS], revoked)
    return json_response(request, {"id": user_id, "deleted": True})


def setup(app: web.Application) -> None:
    """Register the user routes (the memberships-of-a-user listing lives in ``memberships``)."""
    r = app.router
    r.add_post("/v1/users", post_user)
    r.add_get("/v1/users", get_users)
    r.add_get("/v1/users/{user_id}", show_user)
    r.add_patch("/v1/users/{user_id}", patch_user)
    r.add_delete("/v1/users/{user_id}", remove_user)
