"""Webhook rules (DESIGN.md "webhooks"; SPEC.md 6 rule 1): a project's endpoints, and what is
done with their deliveries on request.

* :func:`create_endpoint`, :func:`update_endpoint`, :func:`rotate_secret`,
  :func:`remove_endpoint`: each change with its audit event in its transaction
  (``webhook.endpoint.created``, ``.updated``, ``.secret_rotated``, ``.revoked``). The signing
  secret is sealed by the KMS, bound to the endpoint's id, and answered only by create and
  rotate-secret; after a rotation the previous secret signs beside the new one for
  :data:`ROTATION_OVERLAP`.
* The URL rule (``outbound.resolved_problem``) is applied at create and update, after DNS, and
  again on every attempt by the delivery worker (``tasks``).
* :func:`list_deliveries`, :func:`replay`, :func:`recover`: the deliveries of an endpoint, newest
  first with every attempt; one sent again now (``webhook.delivery.replayed``); every failed one
  since a time queued again. Either starts the retry schedule afresh.

Deliveries are made by the fan-out from the audit log and sent by the delivery worker
(``tasks``): one per (event, endpoint subscribed when the event was written).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

import asyncpg

from common.errors import InvalidRequest, NotFound
from common.ids import is_id, new_id
from common.settings import Settings
from control_plane.audit import service as audit
from control_plane.kms import LocalKms
from control_plane.web import outbound
from control_plane.web import webhook_signing as signing
from control_plane.web.actor import Actor
from control_plane.web.pagination import Listing, Page, PageQuery, page_by_id, page_of, position
from control_plane.webhooks import repository
from control_plane.webhooks.schemas import (
    DeletedEndpoint,
    Delivery,
    DeliveryStatus,
    Endpoint,
    EndpointBody,
    EndpointPatch,
    Requeued,
    attempts_of,
)

ROTATION_OVERLAP: Final = timedelta(hours=24)
"""How long the previous secret still signs after a rotation."""
ENDPOINTS_LISTING: Final = "webhook_endpoints"


def aad(endpoint_id: str) -> bytes:
    """What binds a sealed secret to its endpoint's row."""
    return b"webhook_endpoint:" + endpoint_id.encode()


def _endpoint(row: asyncpg.Record, secret: str | None = None) -> Endpoint:
    return Endpoint(row["id"], row["url"], list(row["events"]), row["description"],
                    row["status"], row["disabled_reason"], row["created_at"], secret)


def _delivery(row: asyncpg.Record) -> Delivery:
    return Delivery(row["id"], row["event_id"], row["event_type"], row["status"],
                    attempts_of(row["attempts"]), row["next_attempt_at"], row["created_at"])


def _events(events: list[str]) -> list[str]:
    """The subscription, duplicates dropped; ``*`` alone stands for everything."""
    unique = list(dict.fromkeys(events))
    return ["*"] if "*" in unique else unique


async def _check_url(url: str, settings: Settings) -> None:
    problem = await outbound.resolved_problem(url, allow_private=settings.webhook_allow_private_urls)
    if problem:
        raise InvalidRequest.field("url", problem)


async def create_endpoint(conn: asyncpg.Connection, actor: Actor, *, body: EndpointBody,
                          kms: LocalKms, settings: Settings) -> Endpoint:
    """A new endpoint with a fresh secret (answered this once), receiving the events written
    from now on that ``body.events`` names. Raises InvalidRequest naming ``url``."""
    assert actor.project_id is not None
    await _check_url(body.url, settings)
    endpoint_id, secret = new_id("whep"), signing.new_secret()
    events = _events(body.events)
    async with conn.transaction():
        row = await repository.insert_endpoint(
            conn, endpoint_id=endpoint_id, project_id=actor.project_id, url=body.url,
            events=events, description=body.description,
            secret_sealed=kms.seal(secret.encode(), aad(endpoint_id)))
        await audit.record(
            conn, actor, action="webhook.endpoint.created", target_type="webhook_endpoint",
            target_id=endpoint_id, description=f"Created webhook endpoint {endpoint_id}",
            metadata={"url": body.url, "events": events})
    return _endpoint(row, secret)


async def find_endpoint(conn: asyncpg.Connection | asyncpg.Pool, project_id: str,
                        endpoint_id: str, *, lock: bool = False) -> asyncpg.Record:
    """The project's endpoint ``endpoint_id``. Raises NotFound (another project's too)."""
    row = None
    if is_id(endpoint_id, "whep"):
        row = await repository.find_endpoint(conn, project_id, endpoint_id, lock=lock)
    if row is None:
        raise NotFound("No webhook endpoint with that id in this project.")
    return row


async def describe_endpoint(pool: asyncpg.Pool, project_id: str, endpoint_id: str) -> Endpoint:
    """The endpoint, without its secret. Raises NotFound."""
    return _endpoint(await find_endpoint(pool, project_id, endpoint_id))


async def list_endpoints(pool: asyncpg.Pool, listing: Listing, query: PageQuery) -> Page[Endpoint]:
    """A page of the project's endpoints, oldest first. Raises InvalidRequest (cursor)."""
    return await page_by_id(pool, listing, query, table="webhook_endpoints",
                            columns=repository.ENDPOINT_COLUMNS, row=_endpoint)


async def update_endpoint(conn: asyncpg.Connection, actor: Actor, *, endpoint_id: str,
                          body: EndpointPatch, settings: Settings) -> Endpoint:
    """Change what ``body`` names (``webhook.endpoint.updated``); ``status`` ``active``
    enables a disabled endpoint again. Raises NotFound, InvalidRequest naming ``url``."""
    assert actor.project_id is not None
    fields = body.model_fields_set
    if "url" in fields and body.url is not None:
        await _check_url(body.url, settings)
    changes: dict[str, object] = {name: getattr(body, name) for name in sorted(fields)}
    if body.events is not None:
        changes["events"] = _events(body.events)
    async with conn.transaction():
        before = await find_endpoint(conn, actor.project_id, endpoint_id, lock=True)
        row = await repository.update_endpoint(conn, endpoint_id, changes)
        await audit.record(
            conn, actor, action="webhook.endpoint.updated", target_type="webhook_endpoint",
            target_id=endpoint_id, description=f"Updated webhook endpoint {endpoint_id}",
            metadata={"changed": sorted(changes), "url": row["url"], "events": list(row["events"]),
                      "status": row["status"], "previous_status": before["status"]})
    return _endpoint(row)


async def rotate_secret(conn: asyncpg.Connection, actor: Actor, *, endpoint_id: str,
                        kms: LocalKms) -> Endpoint:
    """A new secret (answered this once); the previous one keeps signing beside it for
    :data:`ROTATION_OVERLAP` (``webhook.endpoint.secret_rotated``). Raises NotFound."""
    assert actor.project_id is not None
    secret = signing.new_secret()
    async with conn.transaction():
        await find_endpoint(conn, actor.project_id, endpoint_id, lock=True)
        row = await repository.rotate_secret(conn, endpoint_id,
                                             kms.seal(secret.encode(), aad(endpoint_id)),
                                             ROTATION_OVERLAP)
        await audit.record(
            conn, actor, action="webhook.endpoint.secret_rotated",
            target_type="webhook_endpoint", target_id=endpoint_id,
            description=f"Rotated the secret of webhook endpoint {endpoint_id}",
            metadata={"previous_valid_for_seconds": int(ROTATION_OVERLAP.total_seconds())})
    return _endpoint(row, secret)


async def remove_endpoint(conn: asyncpg.Connection, actor: Actor, *,
                          endpoint_id: str) -> DeletedEndpoint:
    """Delete the endpoint and its deliveries (``webhook.endpoint.revoked``): nothing more is
    sent to it, a delivery under way included. Raises NotFound."""
    assert actor.project_id is not None
    async with conn.transaction():
        # Deliveries first, then the endpoint: the delivery worker's order, so no deadlock.
        row = await find_endpoint(conn, actor.project_id, endpoint_id)
        await repository.delete_endpoint(conn, actor.project_id, endpoint_id)
        await audit.record(
            conn, actor, action="webhook.endpoint.revoked", target_type="webhook_endpoint",
            target_id=endpoint_id, description=f"Deleted webhook endpoint {endpoint_id}",
            metadata={"url": row["url"]})
    return DeletedEndpoint(endpoint_id, True)


async def list_deliveries(pool: asyncpg.Pool, listing: Listing, *, endpoint_id: str,
                          query: PageQuery, status: DeliveryStatus | None) -> Page[Delivery]:
    """A page of the endpoint's deliveries, newest first, each with every attempt. Raises
    NotFound, InvalidRequest (cursor)."""
    await find_endpoint(pool, listing.project_id, endpoint_id)
    at = position(query, listing, key_len=1)
    rows = await repository.list_deliveries(pool, endpoint_id, status=status,
                                            before=at.after[0] if at.after else None,
                                            limit=at.limit + 1)
    return page_of([_delivery(r) for r in rows], at, listing, key=lambda d: [d.id])


async def replay(conn: asyncpg.Connection, actor: Actor, *, delivery_id: str) -> Delivery:
    """Send the delivery again now, whatever its status, with a fresh retry schedule
    (``webhook.delivery.replayed``). Raises NotFound, InvalidRequest when its endpoint is
    disabled (enable it first)."""
    assert actor.project_id is not None
    async with conn.transaction():
        row = None
        if is_id(delivery_id, "dlv"):
            row = await repository.find_delivery(conn, actor.project_id, delivery_id)
        if row is None:
            raise NotFound("No webhook delivery with that id in this project.")
        # Read, not locked: the delivery worker locks a delivery, then its endpoint; taking
        # them the other way round here could deadlock with it.
        endpoint = await find_endpoint(conn, actor.project_id, row["endpoint_id"])
        if endpoint["status"] != "active":
            raise InvalidRequest("The endpoint is disabled; enable it (PATCH status active) "
                                 "before replaying its deliveries.",
                                 details={"endpoint_id": endpoint["id"]})
        again = await repository.requeue(conn, delivery_id)
        await audit.record(
            conn, actor, action="webhook.delivery.replayed", target_type="webhook_delivery",
            target_id=delivery_id, description=f"Replayed webhook delivery {delivery_id}",
            metadata={"endpoint_id": endpoint["id"], "event_id": row["event_id"],
                      "event_type": row["event_type"], "previous_status": row["status"]})
    return _delivery(again)


async def recover(conn: asyncpg.Connection, actor: Actor, *, endpoint_id: str,
                  since: datetime) -> Requeued:
    """Queue again every failed delivery of the endpoint made at or after ``since``, each with
    a fresh retry schedule. Raises NotFound, InvalidRequest when the endpoint is disabled."""
    assert actor.project_id is not None
    async with conn.transaction():
        endpoint = await find_endpoint(conn, actor.project_id, endpoint_id)  # as in replay
        if endpoint["status"] != "active":
            raise InvalidRequest("The endpoint is disabled; enable it (PATCH status active) "
                                 "before recovering its deliveries.",
                                 details={"endpoint_id": endpoint_id})
        count = await repository.requeue_failed(conn, endpoint_id, since)
    return Requeued(count)


@dataclass(frozen=True, slots=True)
class Secrets:
    """The secrets an endpoint signs with now: its own, and the previous one while it overlaps."""

    current: str
    previous: str | None

    def all(self) -> list[str]:
        return [self.current] + ([self.previous] if self.previous else [])


def open_secrets(kms: LocalKms, row: asyncpg.Record) -> Secrets:
    """The secrets of a row of ``repository.CLAIMED_ENDPOINTS``."""
    previous = row["previous_secret_sealed"]
    return Secrets(kms.open(row["secret_sealed"], aad(row["id"])).decode(),
                   kms.open(previous, aad(row["id"])).decode() if previous else None)
