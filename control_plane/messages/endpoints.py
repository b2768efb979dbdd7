"""The development mailbox: what the console sink of this process delivered.

Mounted only where ``Settings.serves_dev_mailbox`` (a console sink, and ``SERVICE_DEV_MAILBOX=true``
or, unset, a local base URL); elsewhere the path is ``not_found``.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from common.errors import InsufficientScope
from common.routing import Reply, RouteTable
from control_plane.appkeys import MAILBOX
from control_plane.messages import service
from control_plane.messages.schemas import Mailbox, MailboxQuery
from control_plane.web import auth
from control_plane.web.actor import Call
from control_plane.web.endpoint import endpoint

dev_routes = RouteTable("development", "Served to local development runs only.")


# Reading live sign-in links is the power to sign in as anyone, more than any one scope grants.
FULL_ACCESS: Final = auth.ApiKey(full_access=(
    "The development mailbox shows live sign-in links: it needs a full-access API key "
    "(one created without scopes)."))


@endpoint(dev_routes, "GET", "/v1/dev/mailbox", auth=FULL_ACCESS, errors=[InsufficientScope],
          replies=[Reply(200, "The project's delivered messages, newest first.", Mailbox)])
async def get_dev_mailbox(call: Call, query: MailboxQuery) -> web.Response:
    """The messages this process's console sink delivered for the project (links included).

    Needs a full-access key (one created without scopes)."""
    return call.reply(service.mailbox(call.app[MAILBOX], call.project_id, query))
