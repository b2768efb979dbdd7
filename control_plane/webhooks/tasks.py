"""The webhook workers: the fan-out from the audit log into deliveries, and the delivery worker.

**Fan-out** (:func:`fan_out_pass`, every :data:`FANOUT_POLL_SECONDS` and at once after a full
batch). The log is read in ``(tx, id)`` order (``audit_events.tx``: the writing transaction's
id) after the fan-out's position, and only below the log's horizon (the oldest transaction of
this database still running), so an event whose transaction commits late is never passed: it
is read once it commits. Each event gets one delivery per active endpoint of its project
subscribed to its action and created at or before it; the deliveries and the new position
commit together, in one statement under an advisory lock (one fan-out at a time across
processes, never held across round trips), so no event is fanned out twice or skipped,
whatever crashes or stalls.

**Delivery** (:class:`Deliverer`). Due deliveries are claimed (``FOR UPDATE SKIP LOCKED``, a
lease, the attempt counted) and POSTed, up to :data:`MAX_IN_FLIGHT` at once, by
``outbound.post``: the body ``{"id", "type", "timestamp", "data"}``, the Standard Webhooks
headers (``signing``; the ``evt_`` id as ``webhook-id``, the same on every attempt), and
``traceparent``. A 2xx succeeds. A 410 fails the delivery and disables the endpoint (``gone``).
Anything else is retried after the next delay of ``SERVICE_WEBHOOK_RETRY_SCHEDULE`` (±10%
jitter; a longer ``Retry-After`` wins, up to :data:`MAX_RETRY_AFTER_SECONDS`), and fails once
the schedule is spent; an endpoint whose every attempt failed for :data:`FAILING_DISABLES_AFTER`
is disabled (``failing``). Wakes on ``NOTIFY authio_webhooks`` and polls every
:data:`DELIVERY_POLL_SECONDS`. A process killed mid-delivery leaves a lease that runs out: the
delivery is sent again (at least once; receivers deduplicate on ``webhook-id``).

Each attempt is a span (``webhook.deliver``: the endpoint's URL and the HTTP status, SPEC.md 1
rule 5) whose context goes out as ``traceparent``; without tracing, a fresh unsampled trace id.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import secrets
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Final

import aiohttp
import asyncpg
import orjson
from aiohttp import web
from opentelemetry import propagate, trace

from common.appkeys import PG_POOL, SETTINGS
from common.db import ClaimLimits, Outage, claim_forever, delete_in_batches
from common.runtime import background, every
from common.settings import Settings
from control_plane.appkeys import KMS
from control_plane.kms import LocalKms
from control_plane.web import outbound
from control_plane.web import webhook_signing as signing
from control_plane.webhooks import repository, service

log = logging.getLogger("authio.webhooks")
tracer = trace.get_tracer("authio.webhooks")

FANOUT_POLL_SECONDS: Final = 0.25
FANOUT_BATCH: Final = 1000
DELIVERY_POLL_SECONDS: Final = 1.0
CLAIM_BATCH: Final = 50
MAX_IN_FLIGHT: Final = 64
JITTER: Final = 0.1
MAX_RETRY_AFTER_SECONDS: Final = 86_400.0
FAILING_DISABLES_AFTER: Final = timedelta(days=5)
LISTEN_APPLICATION_NAME: Final = "authio-webhooks-listen"
_JITTER_RNG: Final = random.Random()
"""The jitter's own generator (the module's global one belongs to whoever else runs here)."""


# --- the fan-out --------------------------------------------------------------------------------


async def fan_out_pass(pool: asyncpg.Pool, *, batch: int = FANOUT_BATCH) -> int:
    """Fan out the next events of the log (at most ``batch``) into deliveries
    (``repository.FANOUT``); how many events were passed (0: nothing new, or another process is
    fanning out)."""
    async with pool.acquire() as conn:
        row = await conn.fetchrow(repository.FANOUT, repository.FANOUT_LOCK, batch)
        assert row is not None
        if row["made"]:
            await conn.execute(repository.NOTIFY)
    return int(row["passed"]) if row["got"] else 0


async def fan_out_forever(pool: asyncpg.Pool) -> None:
    """:func:`fan_out_pass` until cancelled: again at once after a full batch, else after
    :data:`FANOUT_POLL_SECONDS`; a database outage is waited out with backoff."""
    outage = Outage("webhook fan-out", log)
    while True:
        try:
            passed = await fan_out_pass(pool)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await outage.failed(exc)
            continue
        outage.over()
        if passed < FANOUT_BATCH:
            await asyncio.sleep(FANOUT_POLL_SECONDS)


# --- delivery -----------------------------------------------------------------------------------


def retry_delay(round_: int, delays: tuple[float, ...], retry_after: float | None, *,
                rng: Callable[[], float] = _JITTER_RNG.random) -> float | None:
    """Seconds until the next attempt after the ``round_``-th failed one of this schedule, or
    None when the schedule is spent: the schedule's delay ±:data:`JITTER`, or ``retry_after``
    when longer (at most :data:`MAX_RETRY_AFTER_SECONDS`)."""
    if round_ > len(delays):
        return None
    delay = delays[round_ - 1] * (1 - JITTER + 2 * JITTER * rng())
    if retry_after is not None:
        delay = max(delay, min(retry_after, MAX_RETRY_AFTER_SECONDS))
    return delay


def _rfc3339(value: str | datetime) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return value


def body_of(event: asyncpg.Record) -> bytes:
    """The JSON a delivery sends: ``id``, ``type``, ``timestamp`` and the event as ``GET
    /v1/audit/events`` lists it (``data``)."""
    data = dict(event)
    return orjson.dumps({"id": data["id"], "type": data["action"],
                         "timestamp": _rfc3339(data["created_at"]), "data": data})


def _traceparent() -> str:
    """A W3C ``traceparent`` of a fresh, unsampled trace (no tracing configured)."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-00"


class Deliverer:
    """The delivery worker of one process (see the module docstring)."""

    def __init__(self, pool: asyncpg.Pool, kms: LocalKms, settings: Settings,
                 session: aiohttp.ClientSession) -> None:
        self._pool, self._kms, self._settings, self._session = pool, kms, settings, session
        self._delays = settings.webhook_retry_delays
        self._lease = timedelta(seconds=3 * settings.webhook_timeout_seconds + 10)

    async def run(self) -> None:
        """Deliver until cancelled (``common.db.claim_forever``: woken by ``NOTIFY``, polling
        every :data:`DELIVERY_POLL_SECONDS`)."""
        await claim_forever(
            self._claim, self._deliver, wake=asyncio.Event(),
            limits=ClaimLimits(CLAIM_BATCH, MAX_IN_FLIGHT, DELIVERY_POLL_SECONDS),
            what="claiming webhook deliveries", logger=log,
            name=lambda job: f"webhook-{job[0]['id']}",
            listen=(self._settings.database_url, repository.NOTIFY_CHANNEL,
                    LISTEN_APPLICATION_NAME))

    async def _claim(self, want: int) -> list[tuple[asyncpg.Record, asyncpg.Record | None,
                                                     asyncpg.Record | None]]:
        """Claimed deliveries, each with its endpoint and its event (None: gone since)."""
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(repository.CLAIM, want, self._lease)
            if not rows:
                return []
            endpoints = {r["id"]: r for r in await conn.fetch(
                repository.CLAIMED_ENDPOINTS, list({r["endpoint_id"] for r in rows}))}
            events = {r["id"]: r for r in await conn.fetch(
                repository.CLAIMED_EVENTS, [r["event_created_at"] for r in rows],
                [r["event_id"] for r in rows])}
        return [(r, endpoints.get(r["endpoint_id"]), events.get(r["event_id"])) for r in rows]

    async def _deliver(self, job: tuple[asyncpg.Record, asyncpg.Record | None,
                                        asyncpg.Record | None]) -> None:
        """Attempt one claimed delivery (``_claim``'s triple) and record its outcome."""
        row, endpoint, event = job
        at = datetime.now(UTC)
        if endpoint is None:
            return  # deleted meanwhile, with its deliveries
        if endpoint["status"] != "active":
            await self._record(row, at, None, "the endpoint is disabled", 0, final=True,
                               sent=False)
            return
        if event is None:
            await self._record(row, at, None, "the event no longer exists (retention or a "
                               "data-subject deletion)", 0, final=True, sent=False)
            return
        body = body_of(event)
        headers = signing.headers(service.open_secrets(self._kms, endpoint).all(), row["event_id"],
                                  int(time.time()), body)
        url = endpoint["url"]
        with tracer.start_as_current_span(
                "webhook.deliver", kind=trace.SpanKind.CLIENT,
                attributes={"url.full": url, "http.request.method": "POST",
                            "webhook.endpoint_id": endpoint["id"],
                            "webhook.delivery_id": row["id"], "webhook.event_id": row["event_id"],
                            "webhook.attempt": row["round"]}) as span:
            if span.get_span_context().is_valid:
                propagate.inject(headers)
            else:
                headers["traceparent"] = _traceparent()
            answer = await outbound.post(
                self._session, url, body, headers,
                allow_private=self._settings.webhook_allow_private_urls,
                timeout_seconds=self._settings.webhook_timeout_seconds)
            if answer.status is not None:
                span.set_attribute("http.response.status_code", answer.status)
            if answer.error is not None:
                span.set_status(trace.StatusCode.ERROR, answer.error)
        if answer.error is None:
            await self._record(row, at, answer.status, None, answer.duration_ms, succeeded=True)
            return
        gone = answer.status == 410
        delay = None if gone else retry_delay(row["round"], self._delays, answer.retry_after)
        log.warning("webhook delivery %s to endpoint %s (attempt %d) failed: %s%s", row["id"],
                    endpoint["id"], row["round"], answer.error,
                    f"; retrying in {delay:.0f} s" if delay is not None else "; giving up")
        await self._record(row, at, answer.status, answer.error, answer.duration_ms,
                           final=delay is None, retry_in=delay, gone=gone)

    async def _record(self, row: asyncpg.Record, at: datetime, status_code: int | None,
                      error: str | None, duration_ms: int, *, succeeded: bool = False,
                      final: bool = False, retry_in: float | None = None, gone: bool = False,
                      sent: bool = True) -> None:
        """Store the attempt and its outcome (``sent``: a request went out, so the endpoint's
        health counts it), retrying through a database hiccup for up to a lease; past that the
        lease runs out and the delivery is attempted again."""
        status = "succeeded" if succeeded else "failed" if final else "pending"
        next_at = at + timedelta(seconds=retry_in) if status == "pending" and retry_in is not None else None
        attempt = {"at": _rfc3339(at), "status_code": status_code, "duration_ms": duration_ms,
                   "error": error}
        args = (row["id"], status, next_at, attempt, succeeded, "gone" if gone else None,
                FAILING_DISABLES_AFTER, sent)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._lease.total_seconds()
        delay = 0.2
        while True:
            try:
                await self._pool.execute(repository.OUTCOME, *args)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if loop.time() + delay > deadline:
                    log.warning("webhook delivery %s: could not store the outcome (%s: %s); it "
                                "is attempted again when its lease runs out", row["id"],
                                type(exc).__name__, exc)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)


async def purge(pool: asyncpg.Pool) -> dict[str, int]:
    """Delete deliveries done (succeeded or failed) more than ``repository.KEEP_DAYS`` ago."""
    return {"webhook_deliveries": await delete_in_batches(pool, repository.PURGE)}


@contextlib.asynccontextmanager
async def workers(app: web.Application) -> AsyncIterator[None]:
    """The fan-out and the delivery worker (one each per control-plane process), and the purge
    of old deliveries, while the app runs."""
    settings, pool = app[SETTINGS], app[PG_POOL]
    async with outbound.client(timeout_seconds=settings.webhook_timeout_seconds,
                               allow_private=settings.webhook_allow_private_urls) as session:
        deliverer = Deliverer(pool, app[KMS], settings, session)
        async with background(
                webhook_fanout=fan_out_forever(pool), webhook_deliveries=deliverer.run(),
                webhook_purge=every(settings.housekeeping_interval_seconds,
                                    functools.partial(purge, pool), what="webhook delivery purge",
                                    logger=log)):
            yield
