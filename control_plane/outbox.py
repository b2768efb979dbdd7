"""The transactional outbox of messages (enrollment, sign-in, invitation).

``enqueue`` inserts a message in the caller's transaction, so a message exists if and only if
the change that needs it commits, and wakes the delivery worker with ``NOTIFY`` (delivered at
commit). The body is sealed with the KMS (it carries a live sign-in link).

``run_outbox`` is the delivery worker (``setup(app)`` starts one per control-plane process):
it claims due messages under a lease, hands them to the configured senders
(``control_plane.delivery``), and records the outcome with retries and backoff. Nothing queued is
lost across restarts or crashes: a message is ``sent`` only after its sender returned, and a
worker killed mid-delivery leaves a lease that simply runs out, after which any process claims the
message again. Delivery is therefore at least once; receivers deduplicate on the ``msg_`` id.
A transient failure never loses a message that is still useful: a message with an ``expires_at``
(its link's expiry) is retried until then, however long the outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final

import aiohttp
import asyncpg
import orjson
from aiohttp import web

from common.appkeys import PG_POOL, SETTINGS
from common.ids import new_id
from common.runtime import stop_tasks
from common.settings import Settings
from control_plane import delivery
from control_plane.appkeys import KMS
from control_plane.delivery import DeliveryError, OutgoingMessage, Sender
from control_plane.destinations import Channel
from control_plane.kms import KmsError, LocalKms

CHANNEL: Final = "authio_outbox"
LISTEN_APPLICATION_NAME: Final = "authio-outbox-listen"


def body_aad(message_id: str) -> bytes:
    """The KMS associated data of a message body: it opens only in its own row."""
    return b"message:" + message_id.encode()


async def enqueue(
    conn: asyncpg.Connection, kms: LocalKms, *, project_id: str, channel: Channel,
    destination: str, kind: str, subject: str, text: str, html: str | None = None,
    expires_at: datetime | timedelta | None = None,
) -> str:
    """Queue one message in ``conn``'s transaction and return its ``msg_`` id.

    ``kind`` names the message (``enrollment``, ``signin``, ``invitation``); ``subject`` is used
    by email only; ``text`` is the plain-text body (the whole SMS), ``html`` an optional HTML
    alternative for email. ``expires_at`` is when the message stops being useful (the expiry of
    the link it carries): an aware datetime, or a timedelta counted from the transaction's
    ``now()`` (as ``now() + interval`` expiries of the same transaction are). Until then
    transient delivery failures are retried without limit; None keeps the
    ``SERVICE_OUTBOX_MAX_ATTEMPTS`` limit (see ``run_outbox``).
    """
    message_id = new_id("msg")
    sealed = kms.seal(orjson.dumps({"subject": subject, "text": text, "html": html}),
                      body_aad(message_id))
    at, after = (None, expires_at) if isinstance(expires_at, timedelta) else (expires_at, None)
    await conn.execute(
        """INSERT INTO messages (id, project_id, channel, kind, destination, body_sealed,
                                 expires_at)
           VALUES ($1, $2, $3, $4, $5, $6, coalesce($7::timestamptz, now() + $8::interval))""",
        message_id, project_id, channel, kind, destination, sealed, at, after,
    )
    await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, message_id)
    return message_id


# --- the delivery worker ------------------------------------------------------------------------

log = logging.getLogger("authio.outbox")

CLAIM_BATCH: Final = 10
MAX_IN_FLIGHT: Final = 16
BACKOFF_CAP_SECONDS: Final = 3600.0
_LISTEN_CHECK_SECONDS: Final = 10.0
_RECONNECT_MAX_SECONDS: Final = 30.0

# Due, unleased messages, oldest due first; the lease and the attempt count commit with the claim.
# An expired message is claimed only to be failed, unsent: that claim is not a delivery attempt.
_CLAIM_SQL: Final = """
WITH due AS (
    SELECT id FROM messages
     WHERE status = 'pending' AND next_attempt_at <= now()
       AND (locked_until IS NULL OR locked_until < now())
     ORDER BY next_attempt_at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
)
UPDATE messages AS m
   SET locked_until = now() + $2::interval,
       attempts = m.attempts + CASE WHEN m.expires_at <= now() THEN 0 ELSE 1 END
  FROM due
 WHERE m.id = due.id
RETURNING m.id, m.project_id, m.channel, m.kind, m.destination, m.body_sealed, m.attempts,
          m.expires_at, m.expires_at <= now() AS expired, m.last_error
"""
# Delivered: whoever delivered it, it is sent (a slower duplicate of ours changes nothing).
_SENT_SQL: Final = """
UPDATE messages SET status = 'sent', sent_at = now(), body_sealed = NULL, locked_until = NULL
 WHERE id = $1 AND status = 'pending'
"""
# Failures apply only while our claim is the current one (``attempts`` unchanged): a worker
# whose lease ran out must not reschedule a message another worker now holds. A retry is never
# later than the message's expiry (LEAST ignores a null one), when it fails as expired.
_RETRY_SQL: Final = """
UPDATE messages SET next_attempt_at = LEAST(now() + $3::interval, expires_at),
                    locked_until = NULL, last_error = $4
 WHERE id = $1 AND status = 'pending' AND attempts = $2
"""
_FAILED_SQL: Final = """
UPDATE messages SET status = 'failed', locked_until = NULL, last_error = $3, body_sealed = NULL
 WHERE id = $1 AND status = 'pending' AND attempts = $2
"""


def reconnect_delay(failures: int) -> float:
    """The wait after the ``failures``-th consecutive failure to reach the database (claiming,
    or the ``LISTEN`` connection): 0.5 s doubling per failure, at most 30 s."""
    return min(_RECONNECT_MAX_SECONDS, 0.5 * 2.0 ** min(max(failures - 1, 0), 10))


def backoff_seconds(attempts: int, base_seconds: float, *, cap_seconds: float = BACKOFF_CAP_SECONDS,
                    rng: Callable[[], float] = random.random) -> float:
    """The wait before retrying a message that failed its ``attempts``-th attempt: exponential
    (``base * 2**(attempts-1)``, capped at ``cap_seconds``) with equal jitter (a uniform draw in
    the upper half), so retries spread out but never come sooner than half the step."""
    step = min(cap_seconds, base_seconds * 2.0 ** min(max(attempts - 1, 0), 64))
    return step / 2 + rng() * step / 2


def open_body(kms: LocalKms, message_id: str, sealed: bytes | None) -> dict[str, Any]:
    """The sealed body of a message: ``{"subject", "text", "html"}``. Raises DeliveryError
    (transient: a process holding another key-encryption key must not fail the message for
    all) when it cannot be opened."""
    if sealed is None:
        raise DeliveryError("the message body is gone", permanent=True)
    try:
        body = orjson.loads(kms.open(sealed, body_aad(message_id)))
    except KmsError as exc:
        raise DeliveryError(f"the message body cannot be opened: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get("text"), str):
        raise DeliveryError("the message body is malformed", permanent=True)
    return body


async def run_outbox(pool: asyncpg.Pool, kms: LocalKms, settings: Settings,
                     senders: Mapping[Channel, Sender]) -> None:
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

    Wakes on ``NOTIFY authio_outbox`` (``enqueue``) through a dedicated ``LISTEN`` connection
    and every ``SERVICE_OUTBOX_POLL_SECONDS``; a lost connection or database is retried with
    backoff and logged, never fatal. Cancelling abandons in-flight deliveries: their leases run
    out and some process delivers them again (at least once; receivers deduplicate on the
    ``msg_`` id, see ``control_plane.delivery``).
    """
    await _Worker(pool, kms, settings, senders).run()


class _Worker:
    def __init__(self, pool: asyncpg.Pool, kms: LocalKms, settings: Settings,
                 senders: Mapping[Channel, Sender]) -> None:
        self._pool, self._kms, self._settings, self._senders = pool, kms, settings, senders
        self._lease = timedelta(seconds=settings.outbox_lease_seconds)
        self._send_timeout = settings.outbox_lease_seconds * 0.9
        self._wake = asyncio.Event()
        self._in_flight: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        listener = asyncio.create_task(self._listen(), name="outbox-listen")
        try:
            await self._claim_loop()
        finally:
            tasks = [listener, *self._in_flight]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- claiming ----------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        failures = 0
        while True:
            self._wake.clear()  # before claiming: a NOTIFY during the claim wakes the next wait
            free = MAX_IN_FLIGHT - len(self._in_flight)
            more = False
            if free > 0:
                want = min(free, CLAIM_BATCH)
                try:
                    rows = await self._pool.fetch(_CLAIM_SQL, want, self._lease)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    failures += 1
                    delay = reconnect_delay(failures)
                    log.warning("outbox could not claim messages (%s: %s); retrying in %.1f s",
                                type(exc).__name__, exc, delay)
                    await asyncio.sleep(delay)
                    continue
                if failures:
                    log.info("outbox claims messages again")
                    failures = 0
                for row in rows:
                    task = asyncio.create_task(self._deliver(row), name=f"outbox-{row['id']}")
                    self._in_flight.add(task)
                    task.add_done_callback(self._done)
                more = len(rows) == want
            if more and len(self._in_flight) < MAX_IN_FLIGHT:
                continue  # a full batch: more may be due right now
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.outbox_poll_seconds):
                    await self._wake.wait()

    def _done(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._wake.set()  # a delivery slot is free (and a failed one may be due again soon)

    # -- delivering --------------------------------------------------------------------------

    async def _deliver(self, row: asyncpg.Record) -> None:
        message_id, attempts = row["id"], row["attempts"]
        if row["expired"]:  # its link is dead: sending it helps nobody
            await self._expired(row)
            return
        try:
            body = open_body(self._kms, message_id, row["body_sealed"])
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
            await self._record(message_id, _SENT_SQL, message_id)

    async def _failed(self, row: asyncpg.Record, exc: DeliveryError) -> None:
        message_id, attempts = row["id"], row["attempts"]
        max_attempts = self._settings.outbox_max_attempts
        expires_at = row["expires_at"]
        if exc.permanent or (expires_at is None and attempts >= max_attempts):
            why = "permanently" if exc.permanent else f"after {attempts} attempts"
            log.error("outbox message %s failed %s: %s", message_id, why, exc.reason)
            await self._record(message_id, _FAILED_SQL, message_id, attempts, exc.reason)
            return
        delay = backoff_seconds(attempts, self._settings.outbox_backoff_base_seconds)
        if exc.retry_after is not None:
            delay = max(delay, min(exc.retry_after, BACKOFF_CAP_SECONDS))
        until = (f"until it expires at {expires_at.isoformat()}" if expires_at is not None
                 else f"of {max_attempts}")
        log.warning("outbox message %s attempt %d (%s) failed: %s; retrying in %.1f s",
                    message_id, attempts, until, exc.reason, delay)
        await self._record(message_id, _RETRY_SQL, message_id, attempts,
                           timedelta(seconds=delay), exc.reason)

    async def _expired(self, row: asyncpg.Record) -> None:
        message_id, tried = row["id"], row["attempts"]  # this claim is no attempt
        reason = f"expired undelivered after {tried} attempt{'s' if tried != 1 else ''}"
        if row["last_error"]:
            reason += f"; last error: {row['last_error']}"
        reason = delivery.short_reason(reason)
        log.error("outbox message %s (%s, %s) failed: %s", message_id, row["channel"],
                  row["kind"], reason)
        await self._record(message_id, _FAILED_SQL, message_id, row["attempts"], reason)

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

    # -- listening ---------------------------------------------------------------------------

    async def _listen(self) -> None:
        """Keep a ``LISTEN authio_outbox`` connection open; each notification wakes the claim
        loop. Reconnects with backoff (the claim loop keeps polling meanwhile)."""
        failures = 0
        while True:
            try:
                await self._listen_once(reconnected=failures > 0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                delay = reconnect_delay(failures)
                log.warning("outbox lost its %s listener (%s: %s); reconnecting in %.1f s "
                            "(polling meanwhile)", CHANNEL, type(exc).__name__, exc, delay)
                await asyncio.sleep(delay)
            else:
                failures = 1

    async def _listen_once(self, *, reconnected: bool) -> None:
        """One listening connection, until it is lost (returns) or cannot be opened (raises).
        Wakes the claim loop once connected: notifications sent while nobody listened are gone."""
        conn = await asyncpg.connect(
            self._settings.database_url, timeout=10,
            server_settings={"application_name": LISTEN_APPLICATION_NAME},
        )
        try:
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _conn: lost.set())
            await conn.add_listener(CHANNEL, self._on_notify)
            if reconnected:
                log.info("outbox listening on %s again", CHANNEL)
            self._wake.set()
            while not lost.is_set() and not conn.is_closed():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_LISTEN_CHECK_SECONDS):
                        await lost.wait()
                if not lost.is_set() and not conn.is_closed():
                    # A silent network partition never closes the socket: ask.
                    await conn.fetchval("SELECT 1", timeout=_LISTEN_CHECK_SECONDS)
            log.warning("outbox lost its %s listener; reconnecting", CHANNEL)
        finally:
            if not conn.is_closed():
                conn.terminate()

    def _on_notify(self, conn: object, pid: int, channel: str, payload: object) -> None:
        self._wake.set()


# --- wiring -------------------------------------------------------------------------------------


def setup(app: web.Application) -> None:
    """Add the outbox worker to ``app`` (a cleanup context started after the shared resources)
    and, when a console sink is configured, the console sink's ring buffer; ``GET
    /v1/dev/mailbox`` is registered only when ``settings.serves_dev_mailbox`` (a console sink,
    and ``SERVICE_DEV_MAILBOX=true`` or, unset, a local base URL): elsewhere the path is
    ``not_found``."""
    settings = app[SETTINGS]
    if delivery.uses_console(settings):
        app[delivery.MAILBOX] = delivery.ConsoleSink()
        if settings.serves_dev_mailbox:
            app.router.add_get("/v1/dev/mailbox", delivery.get_mailbox)
    app.cleanup_ctx.append(_outbox_worker)


async def _outbox_worker(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    console = app.get(delivery.MAILBOX)
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
        senders = delivery.build_senders(settings, console=console, http=http)
        task = asyncio.create_task(run_outbox(app[PG_POOL], app[KMS], settings, senders),
                                   name="outbox")
        try:
            yield
        finally:
            await stop_tasks(task)
