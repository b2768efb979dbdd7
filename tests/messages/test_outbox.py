"""The message outbox and its sinks (issue 4, "Messages and magic links"): delivery over real
SMTP (aiosmtpd started here, plain, STARTTLS and implicit TLS), a local HTTP receiver speaking
Twilio's REST shape, retries with backoff, permanent failures, a worker killed mid-delivery, a
lost database connection, and the console sink's development mailbox.

Delivery tests run their own service against a database of their own (``outbox_db``): every
running app delivers from the outbox of the database it uses, and the session ``service``
(console sink) would otherwise race them for the messages. Mailbox tests use the session
``service`` and the ``project`` fixture, as other tests do.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email
import email.policy
import os
import secrets
import shutil
import ssl
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import asyncpg
import orjson
import pytest
import pytest_asyncio
from aiohttp import ClientSession

from common.settings import Settings, decode_kek
from control_plane.kms import LocalKms
from control_plane.messages import service as messages
from control_plane.messages import tasks as outbox
from control_plane.migrate import upgrade
from control_plane.web.schemas import Channel
from devtools import ensure_services, remove_private, stop_private
from tests.fixtures.database import database_pool, migrated_database
from tests.fixtures.identity import link_in, token_of
from tests.fixtures.peers import (
    TWILIO_SID,
    SmtpSink,
    TwilioCall,
    mailbox_messages,
    self_signed_certificate,
    smtp_server,
    twilio,
)
from tests.fixtures.service import (
    BOOTSTRAP_TOKEN,
    KMS_KEY,
    ROOT,
    Project,
    assert_error,
    bootstrap_project,
    combined_app,
    eventually,
    free_ports,
    serve_process,
    serving,
)

KMS = LocalKms(decode_kek(KMS_KEY))
LINK = "https://app.example.test/v1/auth/magic-link/verify?project_id=p&token="


def unique(prefix: str = "user") -> str:
    return f"{prefix}-{secrets.token_hex(4)}@example.test"


def link() -> str:
    return LINK + secrets.token_urlsafe(24)


async def enqueue(pool: asyncpg.Pool, project_id: str, destination: str, *, channel: Channel = "email",
                  kind: str = "signin", subject: str = "Your sign-in link", text: str | None = None,
                  html: str | None = None, expires_at: datetime | timedelta | None = None) -> str:
    """One committed message, queued the way the service queues them."""
    async with pool.acquire() as conn, conn.transaction():
        return await messages.enqueue(
            conn, KMS, project_id=project_id, channel=channel,
            destination=destination, kind=kind, subject=subject,
            text=text if text is not None else f"Sign in: {link()}\n", html=html,
            expires_at=expires_at,
        )


async def row(pool: asyncpg.Pool, message_id: str) -> asyncpg.Record:
    found = await pool.fetchrow("SELECT * FROM messages WHERE id = $1", message_id)
    assert found is not None
    return found


async def row_where(pool: asyncpg.Pool, message_id: str,
                    predicate: Callable[[asyncpg.Record], bool], what: str) -> asyncpg.Record:
    async def probe() -> asyncpg.Record | None:
        r = await row(pool, message_id)
        return r if predicate(r) else None
    return await eventually(probe, what=f"{message_id}: {what}")


# --- a separate database for the delivery tests ------------------------------------------------


@pytest.fixture(scope="module")
def outbox_db(database_url: str) -> Iterator[str]:
    with migrated_database(database_url, "outbox") as url:
        yield url


@pytest_asyncio.fixture(scope="module")
async def outbox_pool(outbox_db: str) -> AsyncIterator[asyncpg.Pool]:
    async with database_pool(outbox_db) as pool:
        yield pool


@pytest.fixture
def outbox_settings(settings_factory: Callable[..., Settings], outbox_db: str) -> Callable[..., Settings]:
    """Settings on the outbox database with fast polling and tiny backoff."""
    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {"database_url": outbox_db, "outbox_poll_seconds": 0.1,
                                  "outbox_backoff_base_seconds": 0.05, "outbox_lease_seconds": 10}
        values.update(overrides)
        return settings_factory(**values)
    return make


@contextlib.asynccontextmanager
async def delivering(http: ClientSession, settings: Settings, name: str = "outbox") -> AsyncIterator[Project]:
    """The whole service with ``settings``, and a fresh project on it."""
    async with serving(http, combined_app(settings)) as api:
        yield await bootstrap_project(api, name)


# --- SMTP delivery -----------------------------------------------------------------------------


def smtp_settings(port: int, **overrides: Any) -> dict[str, Any]:
    return {"email_sink": "smtp", "smtp_host": "127.0.0.1", "smtp_port": port, "smtp_tls": "none",
            "smtp_from": "Authio Test <no-reply@authio.test>", "smtp_timeout_seconds": 5, **overrides}


async def test_smtp_delivery_headers_body_and_row(
    http: ClientSession, outbox_settings: Callable[..., Settings], outbox_pool: asyncpg.Pool,
) -> None:
    sink = SmtpSink()
    async with smtp_server(sink) as port, delivering(http, outbox_settings(**smtp_settings(port))) as project:
        to = unique("ann")
        the_link = link()
        text = f"Use this link to sign in.\n\n{the_link}\n"
        html = f'<p><a href="{the_link}">Sign in</a></p>'
        message_id = await enqueue(outbox_pool, project.id, to, subject="Your sign-in link for test",
                                   text=text, html=html)
        [got] = await sink.wait_for(to)
        stored = await row_where(outbox_pool, message_id, lambda r: r["status"] == "sent", "sent")

    assert got.mail_from == "no-reply@authio.test"
    assert got.rcpt_tos == [to]
    mail = got.message
    assert mail["To"] == to
    assert mail["From"] == "Authio Test <no-reply@authio.test>"
    assert mail["Subject"] == "Your sign-in link for test"
    assert mail["Message-ID"] == f"<{message_id}@authio>"
    assert email.utils.parsedate_to_datetime(mail["Date"]).tzinfo is not None
    assert mail["Auto-Submitted"] == "auto-generated"
    plain = mail.get_body(("plain",))
    rich = mail.get_body(("html",))
    assert plain is not None and the_link in plain.get_content()
    assert rich is not None and f'href="{the_link}"' in rich.get_content()
    # Sent, stamped, and the live link no longer at rest.
    assert stored["attempts"] == 1 and stored["sent_at"] is not None
    assert stored["body_sealed"] is None and stored["locked_until"] is None


async def test_smtp_refused_recipient_fails_fast(
    http: ClientSession, outbox_settings: Callable[..., Settings], outbox_pool: asyncpg.Pool,
) -> None:
    refused, fine = unique("gone"), unique("fine")
    sink = SmtpSink(refuse=frozenset({refused}))
    async with smtp_server(sink) as port, delivering(http, outbox_settings(**smtp_settings(port))) as project:
        bad = await enqueue(outbox_pool, project.id, refused)
        failed = await row_where(outbox_pool, bad, lambda r: r["status"] == "failed", "failed")
        # The worker keeps going: a later message is delivered, the refused one is not retried.
        await enqueue(outbox_pool, project.id, fine)
        await sink.wait_for(fine)
        again = await row(outbox_pool, bad)
    assert failed["attempts"] == 1 and again["attempts"] == 1 and again["status"] == "failed"
    assert "550" in failed["last_error"] and "refused" in failed["last_error"]
    assert failed["body_sealed"] is None
    assert sink.to(refused) == []


async def test_smtp_down_retries_then_delivers(
    http: ClientSession, outbox_settings: Callable[..., Settings], outbox_pool: asyncpg.Pool,
) -> None:
    port = free_ports(1)[0]  # nothing listens there yet
    settings = outbox_settings(**smtp_settings(port), outbox_max_attempts=50)
    async with delivering(http, settings) as project:
        to = unique("patient")
        message_id = await enqueue(outbox_pool, project.id, to)
        waiting = await row_where(outbox_pool, message_id,
                                  lambda r: r["attempts"] >= 2 and r["last_error"] is not None,
                                  "two failed attempts")
        assert waiting["status"] == "pending" and waiting["body_sealed"] is not None
        assert "smtp" in waiting["last_error"]
        sink = SmtpSink()
        async with smtp_server(sink, port):
            [got] = await sink.wait_for(to)
            stored = await row_where(outbox_pool, message_id, lambda r: r["status"] == "sent", "sent")
    assert got.message["Message-ID"] == f"<{message_id}@authio>"
    assert stored["attempts"] > waiting["attempts"] and stored["body_sealed"] is None


@pytest.mark.parametrize("mode", ["starttls", "tls"])
async def test_smtp_over_tls_verifies_the_server(
    http: ClientSession, outbox_settings: Callable[..., Settings], outbox_pool: asyncpg.Pool,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str,
) -> None:
    cert, key = self_signed_certificate(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    # STARTTLS: the server refuses mail before the upgrade; implicit TLS: the socket is TLS only.
    tls_kwargs: dict[str, Any] = (
        {"tls_context": server_tls, "require_starttls": True} if mode == "starttls"
        else {"ssl_context": server_tls})
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    sink = SmtpSink()
    async with smtp_server(sink, **tls_kwargs) as port, delivering(
        http, outbox_settings(**smtp_settings(port, smtp_tls=mode), outbox_max_attempts=50),
    ) as project:
        to = unique("tls")
        message_id = await enqueue(outbox_pool, project.id, to)
        # Not trusted yet: the certificate is refused and the message waits.
        untrusted = await row_where(outbox_pool, message_id, lambda r: r["last_error"] is not None,
                                    "a failed attempt")
        assert untrusted["status"] == "pending"
        assert "CERTIFICATE_VERIFY_FAILED" in untrusted["last_error"] or "certificate" in untrusted["last_error"]
        # Trusted through the standard OpenSSL variable: the next attempt goes through.
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        [got] = await sink.wait_for(to)
        await row_where(outbox_pool, message_id, lambda r: r["status"] == "sent", "sent")
    assert got.tls
    assert got.message["Message-ID"] == f"<{message_id}@authio>"


# --- Twilio-shaped SMS -------------------------------------------------------------------------

AUTH_TOKEN = "test-auth-token-" + secrets.token_hex(8)
FROM_NUMBER = "+15005550006"


def twilio_settings(base_url: str, **overrides: Any) -> dict[str, Any]:
    # Email goes to an SMTP port nobody listens on: neither channel uses the console here.
    return {"sms_sink": "twilio", "twilio_account_sid": TWILIO_SID, "twilio_auth_token": AUTH_TOKEN,
            "twilio_from": FROM_NUMBER, "twilio_base_url": base_url,
            **smtp_settings(free_ports(1)[0]), **overrides}


def phone() -> str:
    return "+1555" + str(secrets.randbelow(10**7)).zfill(7)


async def test_twilio_retries_server_errors_then_delivers_once(
    http: ClientSession, outbox_settings: Callable[..., Settings], outbox_pool: asyncpg.Pool,
) -> None:
    number = phone()
    async with twilio(lambda form, n: 500 if n <= 2 else 201) as (receiver, url), delivering(
        http, outbox_settings(**twilio_settings(url)),
    ) as project:
        body = f"Your sign-in link for test: {link()}"
        message_id = await enqueue(outbox_pool, project.id, number, channel="sms", text=body)
        stored = await row_where(outbox_pool, message_id, lambda r: r["status"] == "sent", "sent")
        # Neither channel is the console: no development mailbox in this process.
        assert_error(await project.api.get("/v1/dev/mailbox"), 404, "not_found")
    calls = receiver.to(number)
    assert len(calls) == 3 and stored["attempts"] == 3
    expected_auth = "Basic " + base64.b64encode(f"{TWILIO_SID}:{AUTH_TOKEN}".encode()).decode()
    for call in calls:
        assert call.path == f"/2010-04-01/Accounts/{TWILIO_SID}/Messages.json"
        assert call.authorization == expected_auth
        assert call.content_type == "application/x-www-form-urlencoded"
        assert call.form == {"To": number, "From": FROM_NUMBER, "Body": body}
        assert call.idempotency_key == message_id  # the same on every attempt: receivers dedupe
    assert "HTTP 500" in stored["last_error"] and "20500" in stored["last_error"]
    assert AUTH_TOKEN not in stored["last_error"]
    assert stored["body_sealed"] is None and stored["sent_at"] is not None


async def test_twilio_client_error_fails_without_retrying(
    http: ClientSession, outbox_settings: Callable[..., Settings], outbox_pool: asyncpg.Pool,
) -> None:
    invalid, valid = phone(), phone()
    async with twilio(lambda form, n: 400 if form["To"] == invalid else 201) as (receiver, url), delivering(
        http, outbox_settings(**twilio_settings(url)),
    ) as project:
        bad = await enqueue(outbox_pool, project.id, invalid, channel="sms")
        failed = await row_where(outbox_pool, bad, lambda r: r["status"] == "failed", "failed")
        # The worker carries on with later messages; the failed one is never tried again.
        good = await enqueue(outbox_pool, project.id, valid, channel="sms")
        await row_where(outbox_pool, good, lambda r: r["status"] == "sent", "sent")
        assert (await row(outbox_pool, bad))["attempts"] == 1
    assert len(receiver.to(invalid)) == 1 and len(receiver.to(valid)) == 1
    assert failed["attempts"] == 1 and failed["body_sealed"] is None
    assert "HTTP 400" in failed["last_error"] and "21211" in failed["last_error"]


async def test_transient_failures_stop_at_max_attempts(
    http: ClientSession, outbox_settings: Callable[..., Settings], outbox_pool: asyncpg.Pool,
) -> None:
    number = phone()
    async with twilio(lambda form, n: 503) as (receiver, url), delivering(
        http, outbox_settings(**twilio_settings(url), outbox_max_attempts=3),
    ) as project:
        message_id = await enqueue(outbox_pool, project.id, number, channel="sms")
        failed = await row_where(outbox_pool, message_id, lambda r: r["status"] == "failed", "failed")
    assert failed["attempts"] == 3 and len(receiver.to(number)) == 3
    assert "HTTP 503" in failed["last_error"] and failed["body_sealed"] is None


async def test_transient_failures_outlast_max_attempts_while_the_message_is_useful(
    http: ClientSession, outbox_settings: Callable[..., Settings], outbox_pool: asyncpg.Pool,
) -> None:
    """An outage longer than SERVICE_OUTBOX_MAX_ATTEMPTS loses no message that has not expired."""
    number = phone()
    async with twilio(lambda form, n: 500 if n <= 5 else 201) as (receiver, url), delivering(
        http, outbox_settings(**twilio_settings(url), outbox_max_attempts=2),
    ) as project:
        message_id = await enqueue(outbox_pool, project.id, number, channel="sms",
                                   expires_at=timedelta(hours=1))
        stored = await row_where(outbox_pool, message_id, lambda r: r["status"] != "pending",
                                 "delivered or failed")
    assert stored["status"] == "sent", stored["last_error"]
    assert stored["attempts"] == 6 and len(receiver.to(number)) == 6
    assert stored["body_sealed"] is None


async def test_message_still_failing_at_its_expiry_fails_as_expired(
    http: ClientSession, outbox_settings: Callable[..., Settings], outbox_pool: asyncpg.Pool,
) -> None:
    number = phone()
    async with twilio(lambda form, n: 503) as (receiver, url), delivering(
        http, outbox_settings(**twilio_settings(url), outbox_max_attempts=2),
    ) as project:
        message_id = await enqueue(outbox_pool, project.id, number, channel="sms",
                                   expires_at=timedelta(seconds=4))
        failed = await row_where(outbox_pool, message_id, lambda r: r["status"] == "failed", "failed")
        calls = len(receiver.to(number))
    # Retried past max_attempts until the expiry, then failed without another send.
    assert calls > 2 and failed["attempts"] == calls
    assert failed["last_error"].startswith(f"expired undelivered after {calls} attempts; last error: ")
    assert "HTTP 503" in failed["last_error"]
    assert failed["body_sealed"] is None and failed["sent_at"] is None
    assert failed["expires_at"] <= await outbox_pool.fetchval("SELECT now()")


async def test_message_claimed_after_its_expiry_is_never_sent(
    http: ClientSession, outbox_settings: Callable[..., Settings], outbox_pool: asyncpg.Pool,
) -> None:
    number, fine = phone(), phone()
    async with twilio(lambda form, n: 201) as (receiver, url), delivering(
        http, outbox_settings(**twilio_settings(url)),
    ) as project:
        stale = await enqueue(outbox_pool, project.id, number, channel="sms",
                              expires_at=datetime.now(UTC) - timedelta(minutes=1))
        failed = await row_where(outbox_pool, stale, lambda r: r["status"] == "failed", "failed")
        good = await enqueue(outbox_pool, project.id, fine, channel="sms",
                             expires_at=datetime.now(UTC) + timedelta(minutes=15))
        await row_where(outbox_pool, good, lambda r: r["status"] == "sent", "sent")
    assert receiver.to(number) == [] and len(receiver.to(fine)) == 1
    assert failed["attempts"] == 0 and failed["last_error"] == "expired undelivered after 0 attempts"
    assert failed["body_sealed"] is None


async def test_sign_in_message_expires_with_its_link(project: Project, db: asyncpg.Pool) -> None:
    to = unique("expiry").replace(".test", ".com")  # .test is a special-use domain: invalid_email
    r = await project.api.post(f"/v1/auth/magic-link/send?project_id={project.id}",
                               {"destination": to}, key=None)
    assert r.status == 200, r.body
    message = await db.fetchrow("SELECT expires_at, created_at FROM messages WHERE destination = $1", to)
    token = await db.fetchrow("SELECT expires_at FROM magic_link_tokens WHERE destination = $1", to)
    assert message is not None and token is not None
    assert message["expires_at"] == token["expires_at"]
    assert message["expires_at"] - message["created_at"] == timedelta(seconds=r.body["expires_in"])


# --- crash mid-delivery --------------------------------------------------------------------------


def process_env(database_url: str, redis_url: str, redis_prefix: str, **extra: str) -> dict[str, str]:
    """The environment of an ``authio serve`` subprocess: the test's database, Redis, bootstrap
    token and key-encryption key, no inherited service or telemetry variable."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "SERVICE_")) and k not in ("PORT", "DATABASE_URL", "REDIS_URL")}
    env.update(DATABASE_URL=database_url, REDIS_URL=redis_url, SERVICE_REDIS_PREFIX=redis_prefix,
               SERVICE_BOOTSTRAP_TOKEN=BOOTSTRAP_TOKEN, SERVICE_KMS_KEY=KMS_KEY,
               SERVICE_PG_POOL_MAX="4", OTEL_EXPORTER="none", **extra)
    return env


async def test_worker_killed_mid_delivery_is_delivered_by_another_process(
    http: ClientSession, outbox_db: str, outbox_pool: asyncpg.Pool, redis_url: str, redis_prefix: str,
) -> None:
    sink = SmtpSink(stall_first=True)
    async with smtp_server(sink) as port:
        env = process_env(
            outbox_db, redis_url, redis_prefix, SERVICE_EMAIL_SINK="smtp", SERVICE_SMTP_HOST="127.0.0.1",
            SERVICE_SMTP_PORT=str(port), SERVICE_SMTP_TLS="none", SERVICE_OUTBOX_LEASE_SECONDS="6",
            SERVICE_OUTBOX_POLL_SECONDS="0.2",
        )
        to = unique("crash")
        async with serve_process(http, env, "control-plane") as first:
            project = await bootstrap_project(first.api, "crash")
            message_id = await enqueue(outbox_pool, project.id, to)
            assert await asyncio.to_thread(sink.stalled.wait, 30), "the first delivery never started"
            first.proc.kill()  # SIGKILL while the SMTP DATA is unanswered
            await first.proc.wait()
        held = await row(outbox_pool, message_id)
        assert held["status"] == "pending" and held["attempts"] == 1
        assert held["locked_until"] is not None and held["body_sealed"] is not None
        assert sink.to(to) == []

        async with serve_process(http, env, "control-plane"):
            [got] = await sink.wait_for(to)
            stored = await row_where(outbox_pool, message_id, lambda r: r["status"] == "sent", "sent")
    assert got.message["Message-ID"] == f"<{message_id}@authio>"
    assert stored["attempts"] == 2 and stored["body_sealed"] is None


# --- LISTEN, and a lost database connection -----------------------------------------------------


async def test_notify_wakes_the_worker_and_it_survives_connection_loss(
    http: ClientSession, outbox_settings: Callable[..., Settings], outbox_pool: asyncpg.Pool,
) -> None:
    # An hour between polls: only NOTIFY (or the listener's reconnection) can wake the worker.
    async with serving(http, combined_app(outbox_settings(outbox_poll_seconds=3600))) as api:
        project = await bootstrap_project(api, "listen")
        first = unique("first")
        await enqueue(outbox_pool, project.id, first)
        await mailbox_messages(project.api, first)

        listener_sql = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                        "AND application_name = $1")
        [old_pid] = [r["pid"] for r in await outbox_pool.fetch(listener_sql, outbox.LISTEN_APPLICATION_NAME)]
        # Every server connection of the service goes away (its pool and its listener).
        await outbox_pool.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        second = unique("second")
        await enqueue(outbox_pool, project.id, second)

        async def delivered() -> bool:
            r = await project.api.get(f"/v1/dev/mailbox?destination={quote(second)}")
            return r.status == 200 and len(r.body["data"]) == 1  # 503 while its pool reconnects
        await eventually(delivered, what="delivery after the connection loss")

        async def new_listener() -> list[int]:
            pids = [r["pid"] for r in await outbox_pool.fetch(listener_sql, outbox.LISTEN_APPLICATION_NAME)]
            return [p for p in pids if p != old_pid]
        assert await eventually(new_listener, what="a new listener connection")


async def test_a_created_users_enrollment_message_wakes_its_process_worker(
    http: ClientSession, outbox_settings: Callable[..., Settings],
) -> None:
    """POST /v1/users queues the enrollment message without a NOTIFY (notifying transactions
    commit one at a time) and wakes the worker of its own process once the statement committed:
    with an hour between polls the message still goes out at once."""
    async with serving(http, combined_app(outbox_settings(outbox_poll_seconds=3600))) as api:
        project = await bootstrap_project(api, "wake")
        address = f"enrolled-{secrets.token_hex(4)}@example.com"
        r = await project.api.post("/v1/users", {"email": address, "email_verified": True})
        assert r.status == 201, r.body
        [got] = await mailbox_messages(project.api, address, within=5)
        assert got["kind"] == "enrollment"


async def test_worker_survives_a_postgresql_restart(
    settings_factory: Callable[..., Settings], http: ClientSession, redis_url: str,
) -> None:
    """A private PostgreSQL, stopped and started for real while the service runs."""
    run_dir = Path(tempfile.mkdtemp(prefix="authio-outbox-restart-"))
    pg_port, redis_port = free_ports(2)

    def start() -> str:
        urls = ensure_services(run_dir=run_dir, database_url=None, redis_url=None, force_private=True,
                               private_pg_port=pg_port, private_redis_port=redis_port, log=lambda _: None)
        return urls.database_url

    database_url = await asyncio.to_thread(start)
    try:
        await asyncio.to_thread(upgrade, database_url)
        settings = settings_factory(database_url=database_url, redis_url=redis_url, pg_pool_max=2,
                                    outbox_poll_seconds=3600)  # only LISTEN and reconnection wake it
        async with serving(http, combined_app(settings)) as api:
            project = await bootstrap_project(api, "restart")
            pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
            assert pool is not None
            before = unique("before")
            await enqueue(pool, project.id, before)
            await mailbox_messages(project.api, before)
            await pool.close()

            await asyncio.to_thread(stop_private, run_dir, log=lambda _: None)
            await asyncio.to_thread(start)

            pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
            assert pool is not None
            try:
                after = unique("after")
                message_id = await enqueue(pool, project.id, after)

                async def delivered() -> bool:
                    r = await project.api.get(f"/v1/dev/mailbox?destination={quote(after)}")
                    return r.status == 200 and len(r.body["data"]) == 1  # 503 while reconnecting
                await eventually(delivered, within=60, what="delivery after the restart")
                await row_where(pool, message_id, lambda r: r["status"] == "sent", "sent")
            finally:
                await pool.close()
    finally:
        await asyncio.to_thread(remove_private, run_dir, log=lambda _: None)
        shutil.rmtree(run_dir, ignore_errors=True)


# --- the transaction decides; the body is sealed -------------------------------------------------


async def test_rolled_back_enqueue_is_never_delivered(project: Project, db: asyncpg.Pool) -> None:
    lost, sentinel = unique("rolledback"), unique("sentinel")

    class Abort(Exception):
        pass

    with pytest.raises(Abort):
        async with db.acquire() as conn, conn.transaction():
            await messages.enqueue(conn, KMS, project_id=project.id, channel="email", destination=lost,
                                 kind="signin", subject="never", text=f"never {link()}")
            raise Abort
    # A later message is delivered; the rolled-back one, queued before it, never exists.
    await enqueue(db, project.id, sentinel)
    await mailbox_messages(project.api, sentinel)
    r = await project.api.get(f"/v1/dev/mailbox?destination={quote(lost)}")
    assert r.status == 200 and r.body["data"] == []
    assert await db.fetchval("SELECT count(*) FROM messages WHERE destination = $1", lost) == 0


async def test_stored_body_is_sealed_and_wiped_after_delivery(project: Project, db: asyncpg.Pool) -> None:
    to, the_link = unique("sealed"), link()
    token = the_link.rsplit("=", 1)[1]
    async with db.acquire() as conn, conn.transaction():
        message_id = await messages.enqueue(conn, KMS, project_id=project.id, channel="email",
                                          destination=to, kind="signin", subject="Sign in",
                                          text=f"Sign in: {the_link}\n", html=f"<a href='{the_link}'>x</a>")
        # Read before commit, so no worker has delivered (and wiped) it yet.
        sealed = await conn.fetchval("SELECT body_sealed FROM messages WHERE id = $1", message_id)
    assert sealed is not None
    assert token.encode() not in sealed and b"Sign in" not in sealed and b"https://" not in sealed
    # It opens only with its own row's associated data.
    body = orjson.loads(KMS.open(sealed, messages.body_aad(message_id)))
    assert body == {"subject": "Sign in", "text": f"Sign in: {the_link}\n", "html": f"<a href='{the_link}'>x</a>"}
    with pytest.raises(Exception, match="aad"):
        KMS.open(sealed, messages.body_aad("msg_other"))

    [shown] = await mailbox_messages(project.api, to)
    assert the_link in shown["text"]
    stored = await row_where(db, message_id, lambda r: r["status"] == "sent", "sent")
    assert stored["body_sealed"] is None


# --- the development mailbox (console sink) ------------------------------------------------------


async def test_mailbox_lists_the_projects_messages_newest_first(
    project: Project, new_project: Callable[[str], Awaitable[Project]], db: asyncpg.Pool,
) -> None:
    other = await new_project("other")
    to, elsewhere, phone_number = unique("box"), unique("elsewhere"), phone()
    first = await enqueue(db, project.id, to, subject="First", text=f"first {link()}")
    await mailbox_messages(project.api, to)
    second = await enqueue(db, project.id, to, kind="enrollment", subject="Second",
                           text="second", html="<p>second</p>")
    await enqueue(db, project.id, elsewhere)
    sms = await enqueue(db, project.id, phone_number, channel="sms", text=f"sms {link()}")

    messages = await mailbox_messages(project.api, to, count=2)
    assert [m["id"] for m in messages] == [second, first]
    newest = messages[0]
    assert set(newest) == {"id", "channel", "kind", "destination", "subject", "text", "html", "delivered_at"}
    assert newest["channel"] == "email" and newest["kind"] == "enrollment"
    assert newest["destination"] == to and newest["subject"] == "Second"
    assert newest["text"] == "second" and newest["html"] == "<p>second</p>"
    assert newest["delivered_at"].endswith("Z")
    assert datetime.fromisoformat(newest["delivered_at"]) <= datetime.now(UTC)
    assert messages[1]["html"] is None

    [text] = await mailbox_messages(project.api, phone_number)
    assert text["id"] == sms and text["channel"] == "sms" and text["text"].startswith("sms https://")
    await mailbox_messages(project.api, elsewhere)

    # Unfiltered: the project's messages only, newest first; limit cuts the list.
    everything = (await project.api.get("/v1/dev/mailbox?limit=1000")).body["data"]
    assert {m["destination"] for m in everything} == {to, elsewhere, phone_number}
    limited = await project.api.get("/v1/dev/mailbox?limit=2")
    assert limited.status == 200 and [m["id"] for m in limited.body["data"]] == [m["id"] for m in everything[:2]]

    # Another project's key sees none of it.
    r = await other.api.get(f"/v1/dev/mailbox?destination={quote(to)}")
    assert r.status == 200 and r.body["data"] == []
    assert (await other.api.get("/v1/dev/mailbox")).body["data"] == []


async def test_mailbox_needs_a_full_access_key_and_valid_query(project: Project) -> None:
    async def key(scopes: list[str]) -> str:
        r = await project.api.post("/v1/api-keys", {"prefix": "sk_test_", "name": "mailbox", "scopes": scopes})
        assert r.status == 201, r.body
        return str(r.body["secret"])

    # Live sign-in links are the power to sign in as anyone: no scope is enough.
    for scopes in (["audit:read"], ["users:read"], ["users:read", "users:write", "organizations:write"]):
        assert_error(await project.api.get("/v1/dev/mailbox", key=await key(scopes)), 403,
                     "insufficient_scope")
    # Before the query is read.
    assert_error(await project.api.get("/v1/dev/mailbox?limit=0", key=await key(["audit:read"])),
                 403, "insufficient_scope")
    assert (await project.api.get("/v1/dev/mailbox", key=await key([]))).status == 200
    assert (await project.api.get("/v1/dev/mailbox")).status == 200  # the bootstrap key: full access
    assert_error(await project.api.get("/v1/dev/mailbox", key=None), 401, "missing_api_key")
    for query in ("limit=0", "limit=1001", "limit=ten", "destinaton=a@b.test"):
        assert_error(await project.api.get(f"/v1/dev/mailbox?{query}"), 400, "invalid_request")


@pytest.mark.parametrize(("base_url", "dev_mailbox", "served"), [
    ("https://auth.example.com", None, False),
    ("https://auth.example.com", False, False),
    ("https://auth.example.com", True, True),
    ("http://localhost:8080", None, True),
    ("http://127.0.0.1:8080", False, False),
])
async def test_mailbox_is_served_only_locally_or_when_enabled(
    http: ClientSession, outbox_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture,
    base_url: str, dev_mailbox: bool | None, served: bool,
) -> None:
    with caplog.at_level("WARNING", logger="authio.outbox"):
        async with delivering(http, outbox_settings(base_url=base_url, dev_mailbox=dev_mailbox)) as project:
            r = await project.api.get("/v1/dev/mailbox")
    if served:
        assert r.status == 200 and r.body["data"] == []
    else:
        assert_error(r, 404, "not_found")
    warnings = [rec.getMessage() for rec in caplog.records if "console message sink" in rec.getMessage()]
    if "localhost" in base_url or "127.0.0.1" in base_url:
        assert warnings == []
    else:  # a console sink off localhost always warns, and says whether links are served
        [warning] = warnings
        assert base_url in warning
        assert ("served by GET /v1/dev/mailbox" in warning) is served
        assert ("GET /v1/dev/mailbox is not served" in warning) is not served


async def test_console_sink_prints_links_and_warns_off_localhost(
    http: ClientSession, outbox_db: str, outbox_pool: asyncpg.Pool, redis_url: str, redis_prefix: str,
) -> None:
    env = process_env(outbox_db, redis_url, redis_prefix, SERVICE_OUTBOX_POLL_SECONDS="0.2",
                      SERVICE_BASE_URL="https://auth.example.com", SERVICE_DEV_MAILBOX="true")
    async with serve_process(http, env, "control-plane") as served:
        project = await bootstrap_project(served.api, "console")
        to, the_link = unique("console"), link()
        message_id = await enqueue(outbox_pool, project.id, to, subject="Your sign-in link",
                                   text=f"Sign in: {the_link}\n")
        await mailbox_messages(project.api, to)

        async def printed() -> bool:
            return any(the_link in line for line in served.stdout)
        await eventually(printed, what="the message on standard output")
        out = "".join(served.stdout)
        assert message_id in out and to in out and "Subject: Your sign-in link" in out
    warnings = [orjson.loads(line) for line in served.stderr if "console message sink" in line]
    assert warnings and warnings[0]["level"] == "WARNING"
    assert "https://auth.example.com" in warnings[0]["message"]
    assert "served by GET /v1/dev/mailbox to full-access keys" in warnings[0]["message"]


# --- end to end: the sign-in link travels by SMTP and by SMS, and works ------------------------


async def test_magic_link_arrives_by_smtp_and_signs_in(
    http: ClientSession, outbox_settings: Callable[..., Settings],
) -> None:
    sink = SmtpSink()
    async with smtp_server(sink) as port, delivering(http, outbox_settings(**smtp_settings(port))) as project:
        to = unique("ada").replace(".test", ".com")  # .test is a special-use domain: invalid_email
        r = await project.api.post(f"/v1/auth/magic-link/send?project_id={project.id}",
                                   {"destination": to}, key=None)
        assert r.status == 200, r.body
        [got] = await sink.wait_for(to)
        plain = got.message.get_body(("plain",))
        assert plain is not None
        the_link = link_in(plain.get_content())
        assert got.message["Subject"] == "Your sign-in link for outbox"
        v = await project.api.post(f"/v1/auth/magic-link/verify?project_id={project.id}",
                                   {"token": token_of(the_link)}, key=None)
        assert v.status == 200, v.body
        assert v.body["user"]["email"] == to and v.body["access_token"]


async def test_magic_link_arrives_by_sms_and_signs_in(
    http: ClientSession, outbox_settings: Callable[..., Settings],
) -> None:
    number = phone()
    async with twilio(lambda form, n: 201) as (receiver, url), delivering(
        http, outbox_settings(**twilio_settings(url)),
    ) as project:
        r = await project.api.post(f"/v1/auth/magic-link/send?project_id={project.id}",
                                   {"destination": number}, key=None)
        assert r.status == 200 and r.body["channel"] == "sms", r.body

        async def arrived() -> list[TwilioCall]:
            return receiver.to(number)

        [call] = await eventually(arrived, what=f"an SMS to {number}")
        assert call.form["From"] == FROM_NUMBER and len(call.form["Body"]) < 320
        v = await project.api.post(f"/v1/auth/magic-link/verify?project_id={project.id}",
                                   {"token": token_of(link_in(call.form["Body"]))}, key=None)
        assert v.status == 200, v.body
        assert v.body["user"]["phone_number"] == number


# --- shutdown ----------------------------------------------------------------------------------


async def test_the_worker_always_stops_when_cancelled(
    outbox_settings: Callable[..., Settings], outbox_pool: asyncpg.Pool,
) -> None:
    """Cancelled at any moment, even as one of its waits times out, the worker ends. Python
    3.11's asyncio.wait_for can swallow a cancellation that races its timeout; inside the worker's
    polling loops that left a stopping service waiting forever (one full test run in four)."""
    import io
    import random

    from control_plane.messages import senders as delivery

    settings = outbox_settings(outbox_poll_seconds=0.001)
    senders = delivery.build_senders(settings, console=delivery.ConsoleSink(stream=io.StringIO()),
                                     http=None)
    for _ in range(600):
        task = asyncio.create_task(outbox.run_outbox(outbox_pool, KMS, settings, senders))
        await asyncio.sleep(random.uniform(0, 0.004))
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        assert task in done, "the outbox worker did not stop within 5 s of being cancelled"


def test_service_code_never_uses_asyncio_wait_for() -> None:
    """The race above is asyncio.wait_for's (fixed only in Python 3.12): service code waits
    with ``async with asyncio.timeout(...)``, which never swallows a cancellation."""
    offenders = [f"{path.relative_to(ROOT)}:{n}"
                 for package in ("common", "control_plane", "engine")
                 for path in sorted((ROOT / package).rglob("*.py"))
                 for n, line in enumerate(path.read_text().splitlines(), start=1)
                 if "asyncio.wait_for(" in line]
    assert offenders == []
