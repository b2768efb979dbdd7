"""Webhook routes (DESIGN.md "webhooks"): a project's endpoints and their deliveries (API key,
``webhooks:write``)."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from common.errors import InvalidRequest, NotFound
from common.routing import Reply, RouteTable
from control_plane.appkeys import CURSOR_SECRET, KMS
from control_plane.web import auth
from control_plane.web.actor import Call
from control_plane.web.endpoint import endpoint
from control_plane.web.pagination import Listing, Page, PageQuery
from control_plane.webhooks import service
from control_plane.webhooks.schemas import (
    DeletedEndpoint,
    DeliveriesQuery,
    Delivery,
    Endpoint,
    EndpointBody,
    EndpointPatch,
    RecoverBody,
    Requeued,
)

routes = RouteTable("webhooks", "Endpoints that receive the project's audit events, signed the "
                                "Standard Webhooks way and retried until they succeed.")
WRITE: Final = auth.ApiKey("webhooks:write")
_ENDPOINT: Final = "/v1/webhook-endpoints/{endpoint_id}"


@endpoint(routes, "POST", "/v1/webhook-endpoints", auth=WRITE, errors=[InvalidRequest],
          replies=[Reply(201, "The endpoint, with its secret (shown this once).", Endpoint)])
async def post_webhook_endpoint(call: Call, body: EndpointBody) -> web.Response:
    """Subscribe a URL to the project's events (``events``: action names, or ``["*"]``).

    Every event written from now on that the subscription names is POSTed to ``url``, signed
    with the answered ``secret`` (``webhook-id``, ``webhook-timestamp``, ``webhook-signature``)."""
    async with call.connection() as conn:
        created = await service.create_endpoint(conn, call.actor, body=body, kms=call.app[KMS],
                                                settings=call.settings)
    return call.reply(created, status=201)


@endpoint(routes, "GET", "/v1/webhook-endpoints", auth=WRITE, errors=[InvalidRequest],
          replies=[Reply(200, "A page of endpoints, oldest first.", Page[Endpoint])])
async def get_webhook_endpoints(call: Call, query: PageQuery) -> web.Response:
    """List the project's webhook endpoints (without their secrets)."""
    listing = Listing(service.ENDPOINTS_LISTING, call.project_id, call.app[CURSOR_SECRET])
    return call.reply(await service.list_endpoints(call.pool, listing, query))


@endpoint(routes, "GET", _ENDPOINT, auth=WRITE, errors=[NotFound],
          replies=[Reply(200, "The endpoint (without its secret).", Endpoint)])
async def get_webhook_endpoint(call: Call) -> web.Response:
    """Show one webhook endpoint: its subscription and whether it is active."""
    return call.reply(await service.describe_endpoint(call.pool, call.project_id,
                                                      call.path("endpoint_id")))


@endpoint(routes, "PATCH", _ENDPOINT, auth=WRITE, errors=[NotFound, InvalidRequest],
          replies=[Reply(200, "The endpoint as changed.", Endpoint)])
async def patch_webhook_endpoint(call: Call, body: EndpointPatch) -> web.Response:
    """Change an endpoint's ``url``, ``events``, ``description`` or ``status``; ``status``
    ``active`` enables a disabled endpoint again (then ``recover`` queues what failed)."""
    async with call.connection() as conn:
        changed = await service.update_endpoint(conn, call.actor,
                                                endpoint_id=call.path("endpoint_id"), body=body,
                                                settings=call.settings)
    return call.reply(changed)


@endpoint(routes, "DELETE", _ENDPOINT, auth=WRITE, errors=[NotFound],
          replies=[Reply(200, "Deleted: nothing more is sent to it.", DeletedEndpoint)])
async def delete_webhook_endpoint(call: Call) -> web.Response:
    """Delete an endpoint and its deliveries."""
    async with call.connection() as conn:
        deleted = await service.remove_endpoint(conn, call.actor,
                                                endpoint_id=call.path("endpoint_id"))
    return call.reply(deleted)


@endpoint(routes, "POST", f"{_ENDPOINT}/rotate-secret", auth=WRITE, errors=[NotFound],
          replies=[Reply(200, "The endpoint, with its new secret (shown this once).", Endpoint)])
async def post_webhook_endpoint_rotate_secret(call: Call) -> web.Response:
    """Replace the endpoint's signing secret. For 24 hours deliveries carry a signature under
    the previous secret too, so receivers can switch without losing any."""
    async with call.connection() as conn:
        rotated = await service.rotate_secret(conn, call.actor,
                                              endpoint_id=call.path("endpoint_id"),
                                              kms=call.app[KMS])
    return call.reply(rotated)


@endpoint(routes, "GET", f"{_ENDPOINT}/deliveries", auth=WRITE, errors=[NotFound, InvalidRequest],
          replies=[Reply(200, "A page of deliveries, newest first.", Page[Delivery])])
async def get_webhook_deliveries(call: Call, query: DeliveriesQuery) -> web.Response:
    """List an endpoint's deliveries, newest first, each with every attempt."""
    endpoint_id = call.path("endpoint_id")
    listing = Listing(f"webhook_deliveries:{endpoint_id}", call.project_id,
                      call.app[CURSOR_SECRET])
    return call.reply(await service.list_deliveries(call.pool, listing, endpoint_id=endpoint_id,
                                                    query=query, status=query.status))


@endpoint(routes, "POST", f"{_ENDPOINT}/recover", auth=WRITE, errors=[NotFound, InvalidRequest],
          replies=[Reply(200, "How many failed deliveries were queued again.", Requeued)])
async def post_webhook_endpoint_recover(call: Call, body: RecoverBody) -> web.Response:
    """Queue again every failed delivery of the endpoint made at or after ``since``."""
    async with call.connection() as conn:
        requeued = await service.recover(conn, call.actor, endpoint_id=call.path("endpoint_id"),
                                         since=body.since)
    return call.reply(requeued)


@endpoint(routes, "POST", "/v1/webhook-deliveries/{delivery_id}/replay", auth=WRITE,
          errors=[NotFound, InvalidRequest],
          replies=[Reply(200, "The delivery, queued to be sent now.", Delivery)])
async def post_webhook_delivery_replay(call: Call) -> web.Response:
    """Send one delivery again now (the same ``webhook-id``), whatever its status."""
    async with call.connection() as conn:
        replayed = await service.replay(conn, call.actor, delivery_id=call.path("delivery_id"))
    return call.reply(replayed)
