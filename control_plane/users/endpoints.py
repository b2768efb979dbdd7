"""User routes. Reads accept ``users:read`` or ``users:write`` (a key that may write users may
read them); writes need ``users:write``."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from common.errors import EmailInUse, InvalidEmail, PhoneInUse, UserNotFound
from common.routing import Reply, RouteTable
from control_plane.appkeys import CURSOR_SECRET, KMS, OUTBOX_WAKE
from control_plane.users import service
from control_plane.users.schemas import (
    TOTAL_COUNT_HEADER,
    CreatedUser,
    CreateUser,
    UpdateUser,
    User,
    UsersQuery,
)
from control_plane.web import auth
from control_plane.web.actor import Call
from control_plane.web.endpoint import endpoint
from control_plane.web.pagination import Listing, Page
from control_plane.web.schemas import Deleted

routes = RouteTable("users", "The people who sign in to a project.")
READ: Final = auth.ApiKey("users:read", "users:write")
WRITE: Final = auth.ApiKey("users:write")


@endpoint(routes, "POST", "/v1/users", auth=WRITE, errors=[InvalidEmail, PhoneInUse],
          replies=[Reply(201, "Created: an enrollment link is on its way.", CreatedUser),
                   Reply(200, "A user with that email existed; nothing changed.", CreatedUser)])
async def post_users(call: Call, body: CreateUser) -> web.Response:
    """Create a user, idempotently on the email (SPEC.md 4 rule 5).

    The email is compared case-insensitively; a new user is sent one enrollment link."""
    async with call.connection() as conn:
        user = await service.create_user(conn, call.actor, body=body, kms=call.app[KMS],
                                         settings=call.settings, outbox=call.app[OUTBOX_WAKE])
    return call.reply(user, status=201 if user.created else 200)


@endpoint(routes, "GET", "/v1/users", auth=READ, errors=[InvalidEmail],
          headers={TOTAL_COUNT_HEADER: "true: add the project's number of users as the "
                                       "response header of the same name."},
          replies=[Reply(200, "A page of users in creation order.", Page[User],
                         headers={TOTAL_COUNT_HEADER: "The project's number of users, when asked."})])
async def get_users(call: Call, query: UsersQuery) -> web.Response:
    """List the project's users (``email`` filters exactly, case-insensitively)."""
    page = await service.list_users(
        call.pool, Listing("users", call.project_id, call.app[CURSOR_SECRET]), query)
    headers = None
    if call.request.headers.get(TOTAL_COUNT_HEADER, "").strip().lower() == "true":
        total = await service.count_users(call.pool, call.project_id)
        headers = {TOTAL_COUNT_HEADER: str(total)}
    return call.reply(page, headers=headers)


@endpoint(routes, "GET", "/v1/users/{user_id}", auth=READ, errors=[UserNotFound],
          replies=[Reply(200, "The user.", User)])
async def get_user(call: Call) -> web.Response:
    """Show a user."""
    return call.reply(await service.find_user(call.pool, call.project_id, call.path("user_id")))


@endpoint(routes, "PATCH", "/v1/users/{user_id}", auth=WRITE,
          errors=[UserNotFound, InvalidEmail, EmailInUse, PhoneInUse],
          replies=[Reply(200, "The user as changed.", User)])
async def patch_user(call: Call, body: UpdateUser) -> web.Response:
    """Change a user's fields.

    A changed email or phone number is unverified unless ``email_verified`` comes with it;
    ``phone_number: null`` clears the number; ``metadata`` is replaced whole."""
    async with call.connection() as conn:
        user = await service.update_user(conn, call.actor, user_id=call.path("user_id"), body=body)
    return call.reply(user)


@endpoint(routes, "DELETE", "/v1/users/{user_id}", auth=WRITE, errors=[UserNotFound],
          replies=[Reply(200, "Deleted.", Deleted)])
async def delete_user(call: Call) -> web.Response:
    """Delete a user: memberships, sessions and tokens go with it, and its live sessions are
    refused at the edge at once."""
    user_id = call.path("user_id")
    async with call.connection() as conn:
        await service.remove_user(conn, call.actor, user_id=user_id)
    return call.reply(Deleted(user_id))
