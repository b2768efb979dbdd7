"""The outbox's delivery worker, and the purge of old messages.

:func:`run_outbox` claims due messages under a lease, hands them to the configured senders
(``senders``), and records the outcome with retries and backoff. Nothing queued is lost across
restarts or crashes: a message is ``sent`` only after its sender returned, and a worker killed
mid-delivery leaves a lease that simply runs out, after which any process claims the message
again. Delivery is therefore at least once; receivers deduplicate on the ``msg_`` id. A transient
failure never loses a message that is still useful: a message with an ``expires_at`` (its link's
expiry) is retried until then, however long the outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import timedelta
from typing import Any, Final

import aiohttp
import asyncpg
from aiohttp import web

from common.appkeys import PG_POOL, SETTINGS
from common.db import ClaimLimits, claim_forever, delete_in_batches
from common.runtime import background, every
from common.settings import Settings
from control_plane.appkeys import KMS, MAILBOX, OUTBOX_WAKE
from control_plane.kms import LocalKms
from control_plane.messages import repository, service
from control_plane.messages.senders import (
    DeliveryError,
    OutgoingMessage,
    Sender,
    build_senders,
    short_reason,
)
from control_plane.web.schemas import Channel

log = logging.getLogger("authio.outbox")

LISTEN_APPLICATION_NAME: Final = "authio-outbox-listen"

CLAIM_BATCH: Final = 10
MAX_IN_FLIGHT: Final = 16
BACKOFF_CAP_SECONDS: Final = 3600.0


def backoff_seconds(attempts: int, base_seconds: float, *, cap_seconds: float = BACKOFF_CAP_SECONDS,
                    rng: Callable[[], float] = random.random) -> float:
    """The wait before retrying a message that failed its ``attempts``-th attempt: exponential
    (``base * 2**(attempts-1)``, capped at ``cap_seconds``) with equal jitter (a uniform draw in
    the upper half), so retries spread out but never come sooner than half the step."""
    step = min(cap_seconds, base_seconds * 2.0 ** min(max(attempts - 1, 0), 64))
    return step / 2 + rng() * step / 2


async def run_outbox(pool: asyncpg.Pool, kms: LocalKms, settings: Settings,
                     senders: Mapping[Channel, Sender], wake: asyncio.Event | None = None) -> None:
    """Deliver queued messages until cancelled (never returns otherwise).

    Claims due messages (``status = 'pending'``, ``next_attempt_at <= now()``, no live lease)
    with ``FOR UPDATE SKIP LOCKED`` in batches of at most ``CLAIM_BATCH``, setting
    ``locked_until = now() + SERVICE_OUTBOX_LEASE_SECONDS`` and ``attempts + 1`` in the same
    statement, and delivers up to ``MAX_IN_FLIGHT`` at once through ``senders[channel]``, each
    bounded by 90% of the lease. Outcomes:

    * delivered: ``status = 'sent'``, ``sent_at``, ``body_sealed = NULL`` (the live link does
      not stay at rest);
    * failed, transient: ``last_error`` (short, no secret), ``next_attempt_at = now() +
      backoff_seconds(attempts, SERVICE_OUTBOX_BACKOFF_BASE_SECONDS)`` (at least the
      provider's ``Retry-After``; at most one hour, and never past ``expires_at``), lease
      cleared. A message with an ``expires_at`` is retried so until it expires, however many
      attempts that takes ("nothing queued is lost" while it is still useful);
    * claimed at or after its ``expires_at`` (its link is dead): not sent; ``status =
      'failed'``, ``last_error`` "expired undelivered ...", body wiped, logged at ERROR;
    * failed permanently, or, for a message without ``expires_at``, the
      ``SERVICE_OUTBOX_MAX_ATTEMPTS``-th failure: ``status = 'failed'``, body wiped, logged at
      ERROR.

    Wakes on ``NOTIFY authio_outbox`` (``enqueue``) through a dedicated ``LISTEN`` connection,
    when this process sets ``wake`` (``OUTBOX_WAKE``: a statement that queued messages without
    a ``NOTIFY`` committed) and every ``SERVICE_OUTBOX_POLL_SECONDS``; a lost connection or
    database is retried with backoff and logged, never fatal. Cancelling abandons in-flight deliveries: their leases run
    out and some process delivers them again (at least once; receivers deduplicate on the
    ``msg_`` id, see ``control_plane.messages.senders``).
    """
    worker = _Worker(pool, kms, settings, senders)
    await claim_forever(
        worker.claim, worker.deliver, wake=wake or asyncio.Event(),
        limits=ClaimLimits(CLAIM_BATCH, MAX_IN_FLIGHT, settings.outbox_poll_seconds),
        what="claiming outbox messages", logger=log, name=lambda row: f"outbox-{row['id']}",
        listen=(settings.database_url, repository.NOTIFY_CHANNEL, LISTEN_APPLICATION_NAME))


class _Worker:
    def __init__(self, pool: asyncpg.Pool, kms: LocalKms, settings: Settings,
                 senders: Mapping[Channel, Sender]) -> None:
        self._pool, self._kms, self._settings, self._senders = pool, kms, settings, senders
        self._lease = timedelta(seconds=settings.outbox_lease_seconds)
        self._send_timeout = settings.outbox_lease_seconds * 0.9

    async def claim(self, want: int) -> list[asyncpg.Record]:
        """Up to ``want`` due messages, leased (``repository.CLAIM``)."""
        rows: list[asyncpg.Record] = await self._pool.fetch(repository.CLAIM, want, self._lease)
        return rows

    # -- delivering --------------------------------------------------------------------------

    async def deliver(self, row: asyncpg.Record) -> None:
        message_id, attempts = row["id"], row["attempts"]
        if row["expired"]:  # its link is dead: sending it helps nobody
            await self._expired(row)
            return
        try:
            body = service.open_body(self._kms, message_id, row["body_sealed"])
            message = OutgoingMessage(
                id=message_id, project_id=row["project_id"], channel=row["channel"],
                kind=row["kind"], destination=row["destination"],
                subject=str(body.get("subject") or ""), text=body["text"],
                html=body.get("html") if isinstance(body.get("html"), str) else None,
            )
            sender = self._senders.get(row["channel"])
            if sender is None:
                raise DeliveryError(f"no sender for channel {row['channel']!r}")
            async with asyncio.timeout(self._send_timeout):
                await sender.send(message)
        except DeliveryError as exc:
            await self._failed(row, exc)
        except TimeoutError:
            await self._failed(row, DeliveryError(
                f"delivery took longer than {self._send_timeout:.1f} s (90% of the lease)"))
        except Exception as exc:  # a sender bug: keep the message, retry later
            log.exception("outbox message %s: unexpected error while delivering", message_id)
            await self._failed(row, DeliveryError(f"internal error: {type(exc).__name__}"))
        else:
            log.info("outbox message %s (%s, %s) delivered on attempt %d", message_id,
                     row["channel"], row["kind"], attempts)
            await self._record(message_id, repository.SENT, message_id)

    async def _failed(self, row: asyncpg.Record, exc: DeliveryError) -> None:
        message_id, attempts = row["id"], row["attempts"]
        max_attempts = self._settings.outbox_max_attempts
        expires_at = row["expires_at"]
        if exc.permanent or (expires_at is None and attempts >= max_attempts):
            why = "permanently" if exc.permanent else f"after {attempts} attempts"
            log.error("outbox message %s failed %s: %s", message_id, why, exc.reason)
            await self._record(message_id, repository.FAILED, message_id, attempts, exc.reason)
            return
        delay = backoff_seconds(attempts, self._settings.outbox_backoff_base_seconds)
        if exc.retry_after is not None:
            delay = max(delay, min(exc.retry_after, BACKOFF_CAP_SECONDS))
        until = (f"until it expires at {expires_at.isoformat()}" if expires_at is not None
                 else f"of {max_attempts}")
        log.warning("outbox message %s attempt %d (%s) failed: %s; retrying in %.1f s",
                    message_id, attempts, until, exc.reason, delay)
        await self._record(message_id, repository.RETRY, message_id, attempts,
                           timedelta(seconds=delay), exc.reason)

    async def _expired(self, row: asyncpg.Record) -> None:
        message_id, tried = row["id"], row["attempts"]  # this claim is no attempt
        reason = f"expired undelivered after {tried} attempt{'s' if tried != 1 else ''}"
        if row["last_error"]:
            reason += f"; last error: {row['last_error']}"
        reason = short_reason(reason)
        log.error("outbox message %s (%s, %s) failed: %s", message_id, row["channel"],
                  row["kind"], reason)
        await self._record(message_id, repository.FAILED, message_id, row["attempts"], reason)

    async def _record(self, message_id: str, sql: str, *args: Any) -> None:
        """Store an outcome, retrying through a database hiccup for up to a lease; past that the
        lease runs out and the message is delivered again (at least once)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.outbox_lease_seconds
        delay = 0.2
        while True:
            try:
                await self._pool.execute(sql, *args)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if loop.time() + delay > deadline:
                    log.warning("outbox message %s: could not store the outcome (%s: %s); it "
                                "will be retried when its lease runs out", message_id,
                                type(exc).__name__, exc)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

# --- wiring -------------------------------------------------------------------------------------


async def purge(pool: asyncpg.Pool) -> dict[str, int]:
    """Delete messages delivered or failed more than 7 days ago (their bodies were wiped on
    delivery; the rows are kept a week for operators). Returns the rows deleted by table."""
    return {"messages": await delete_in_batches(pool, repository.PURGE)}


@contextlib.asynccontextmanager
async def workers(app: web.Application) -> AsyncIterator[None]:
    """The delivery worker (one per control-plane process) and the purge of old messages, while
    the app runs. With a console sink configured on a base URL that is not local, warns that
    messages are printed, not sent."""
    settings, pool = app[SETTINGS], app[PG_POOL]
    console = app.get(MAILBOX)
    if console is not None and not settings.base_url_is_local:
        served = ("and served by GET /v1/dev/mailbox to full-access keys (SERVICE_DEV_MAILBOX=true)"
                  if settings.serves_dev_mailbox else
                  "(GET /v1/dev/mailbox is not served; SERVICE_DEV_MAILBOX=true would serve it)")
        log.warning("the console message sink is configured (SERVICE_EMAIL_SINK=%s, "
                    "SERVICE_SMS_SINK=%s) while the base URL is %s: messages, sign-in links "
                    "included, are printed on standard output %s, not sent",
                    settings.email_sink, settings.sms_sink, settings.public_base_url, served)
    async with contextlib.AsyncExitStack() as stack:
        http = None
        if settings.sms_sink == "twilio":
            http = await stack.enter_async_context(aiohttp.ClientSession())
        senders = build_senders(settings, console=console, http=http)
        async with background(
            outbox=run_outbox(pool, app[KMS], settings, senders, app[OUTBOX_WAKE]),
            messages_purge=every(settings.housekeeping_interval_seconds,
                                 functools.partial(purge, pool), what="message purge", logger=log),
        ):
            yield
