"""Where the outbox delivers messages: SMTP email, Twilio-shaped SMS, and the console.

A sink is a :class:`Sender` per channel (``email``, ``sms``), chosen by ``SERVICE_EMAIL_SINK``
(``console`` | ``smtp``) and ``SERVICE_SMS_SINK`` (``console`` | ``twilio``); ``build_senders``
makes the pair. A sender either returns (the message was handed over) or raises
:class:`DeliveryError`, ``permanent`` when retrying cannot help (the outbox then fails the message
at once) and otherwise transient (retried with backoff).

Delivery is at least once (``control_plane.messages.tasks``), so every message carries its stable
``msg_`` id for the receiver to deduplicate on:

* email: ``Message-ID: <msg_...@authio>``;
* SMS: the request header ``Idempotency-Key: msg_...`` (Twilio itself ignores it; a gateway or
  proxy in front of the provider can use it), and the id is never put into the text.

``ConsoleSink`` (the default of both channels, for ``make run``) prints each message, link
included, on standard output and keeps the last 1000 per process in memory for the development
mailbox (``control_plane.messages.endpoints``).
"""

from __future__ import annotations

import base64
import email.utils
import sys
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from typing import Any, Final, Protocol, TextIO

import aiohttp
import aiosmtplib
import orjson

from common.settings import Settings
from control_plane.web.schemas import Channel

MAILBOX_CAPACITY: Final = 1000
TWILIO_TIMEOUT_SECONDS: Final = 30.0
_MAX_REASON: Final = 300


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One message to hand over: ``subject`` is used by email only, ``text`` is the plain-text
    body (the whole SMS), ``html`` an optional HTML alternative for email."""

    id: str
    project_id: str
    channel: Channel
    kind: str
    destination: str
    subject: str
    text: str
    html: str | None = None


class DeliveryError(Exception):
    """A delivery attempt failed. ``reason`` is short and holds no secret and no message body;
    ``permanent`` says retrying cannot help; ``retry_after`` (seconds) is the provider's own
    wish, when it said one."""

    def __init__(self, reason: str, *, permanent: bool = False,
                 retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = short_reason(reason)
        self.permanent = permanent
        self.retry_after = retry_after


class Sender(Protocol):
    """Hands one message of its channel to the outside world. Raises DeliveryError."""

    async def send(self, message: OutgoingMessage) -> None: ...


def short_reason(text: str) -> str:
    """``text`` on one line and at most 300 characters: the form of a stored ``last_error``."""
    text = " ".join(text.split())
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 1] + "…"


def message_id_header(message_id: str) -> str:
    """The email ``Message-ID`` of an outbox message: ``<msg_...@authio>`` (RFC 5322 3.6.4)."""
    return f"<{message_id}@authio>"


# --- SMTP ---------------------------------------------------------------------------------------


class SmtpSender:
    """Email over SMTP with aiosmtplib, one connection per message.

    Settings: ``SERVICE_SMTP_HOST``/``_PORT``; ``SERVICE_SMTP_TLS`` ``starttls`` (upgrade is
    required), ``tls`` (implicit TLS, usually port 465) or ``none``; ``SERVICE_SMTP_USERNAME``/
    ``_PASSWORD`` (login only when a username is set); ``SERVICE_SMTP_FROM``;
    ``SERVICE_SMTP_TIMEOUT_SECONDS``. Server certificates are verified against the system's
    trust store (``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` name a private CA).

    A recipient refused with a 5xx reply, or a 5xx reply to the message data, is permanent;
    4xx replies, connection failures and timeouts are transient.
    """

    def __init__(self, settings: Settings) -> None:
        assert settings.smtp_host, "SERVICE_SMTP_HOST is required (checked by Settings)"
        self._host = settings.smtp_host
        self._port = settings.smtp_port
        self._tls = settings.smtp_tls
        self._username = settings.smtp_username or None
        self._password = (settings.smtp_password.get_secret_value()
                          if settings.smtp_password is not None else None)
        self._from = settings.smtp_from
        self._timeout = settings.smtp_timeout_seconds

    def build(self, message: OutgoingMessage) -> EmailMessage:
        """The RFC 5322 message: Subject, From, To, Message-ID, Date, Auto-Submitted, the text
        and, when given, an HTML alternative."""
        mail = EmailMessage()
        mail["Subject"] = message.subject
        mail["From"] = self._from
        mail["To"] = message.destination
        mail["Message-ID"] = message_id_header(message.id)
        mail["Date"] = email.utils.formatdate(usegmt=True)
        mail["Auto-Submitted"] = "auto-generated"  # RFC 3834: no auto-replies, please
        mail.set_content(message.text)
        if message.html:
            mail.add_alternative(message.html, subtype="html")
        return mail

    async def send(self, message: OutgoingMessage) -> None:
        mail = self.build(message)
        try:
            await aiosmtplib.send(
                mail, hostname=self._host, port=self._port, username=self._username,
                password=self._password, timeout=self._timeout,
                use_tls=self._tls == "tls", start_tls=self._tls == "starttls",
            )
        except aiosmtplib.SMTPRecipientsRefused as exc:
            codes = [r.code for r in exc.recipients]
            first = exc.recipients[0] if exc.recipients else None
            reply = f"{first.code} {first.message}" if first else "no reply"
            raise DeliveryError(f"smtp recipient refused: {reply}",
                                permanent=bool(codes) and all(500 <= c < 600 for c in codes)) from None
        except aiosmtplib.SMTPDataError as exc:
            raise DeliveryError(f"smtp message refused: {exc.code} {exc.message}",
                                permanent=500 <= exc.code < 600) from None
        except aiosmtplib.SMTPResponseException as exc:
            raise DeliveryError(f"smtp {type(exc).__name__}: {exc.code} {exc.message}") from None
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
            raise DeliveryError(f"smtp {type(exc).__name__}: {exc}") from None


# --- Twilio -------------------------------------------------------------------------------------


class TwilioSender:
    """SMS through Twilio Programmable Messaging's REST shape.

    ``POST {SERVICE_TWILIO_BASE_URL}/2010-04-01/Accounts/{sid}/Messages.json`` with the form
    fields ``To``, ``From``, ``Body``, HTTP Basic auth ``sid:token``, and ``Idempotency-Key:
    msg_...``. Success is a 2xx (Twilio answers 201 with the Message resource). Errors carry
    Twilio's exception body ``{"code", "message", "more_info", "status"}``: 429 and 5xx are
    transient (``Retry-After`` honoured), as are 401 (credentials being fixed must not lose
    messages) and connection failures or timeouts; any other 4xx (for example 400 with code
    21211, an invalid ``To`` number) is permanent. ``session`` belongs to the caller (the outbox
    worker), which closes it.
    """

    def __init__(self, settings: Settings, session: aiohttp.ClientSession, *,
                 timeout_seconds: float = TWILIO_TIMEOUT_SECONDS) -> None:
        assert settings.twilio_account_sid and settings.twilio_auth_token and settings.twilio_from
        sid = settings.twilio_account_sid
        self.url = f"{settings.twilio_base_url.rstrip('/')}/2010-04-01/Accounts/{sid}/Messages.json"
        credentials = f"{sid}:{settings.twilio_auth_token.get_secret_value()}".encode()
        self._authorization = "Basic " + base64.b64encode(credentials).decode("ascii")  # RFC 7617
        self._from = settings.twilio_from
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)

    async def send(self, message: OutgoingMessage) -> None:
        form = {"To": message.destination, "From": self._from, "Body": message.text}
        try:
            async with self._session.post(
                self.url, data=form, timeout=self._timeout,
                headers={"Authorization": self._authorization, "Idempotency-Key": message.id,
                         "Accept": "application/json"},
            ) as response:
                if 200 <= response.status < 300:
                    return
                raw = await response.read()
                status, retry_after = response.status, _retry_after(response.headers)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise DeliveryError(f"twilio {type(exc).__name__}: {exc}") from None
        code, text = _twilio_error(raw)
        reason = f"twilio HTTP {status}" + (f" code {code}" if code is not None else "")
        reason += f": {text}" if text else ""
        transient = status in (401, 408, 429) or status >= 500 or status < 400
        raise DeliveryError(reason, permanent=not transient, retry_after=retry_after)


def _twilio_error(raw: bytes) -> tuple[Any, str]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, ""
    if not isinstance(body, dict):
        return None, ""
    message = body.get("message")
    return body.get("code"), message if isinstance(message, str) else ""


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or an HTTP date), or None."""
    value = headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


# --- console and the development mailbox --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MailboxEntry:
    """A message the console sink delivered."""

    message: OutgoingMessage
    delivered_at: datetime


class ConsoleSink:
    """Prints each message readably on ``stream`` (standard output by default, flushed) and keeps
    the last ``capacity`` messages in memory, per process, for the development mailbox. Never
    fails. Serves both channels."""

    def __init__(self, *, capacity: int = MAILBOX_CAPACITY, stream: TextIO | None = None) -> None:
        self._entries: deque[MailboxEntry] = deque(maxlen=capacity)
        self._stream = stream

    async def send(self, message: OutgoingMessage) -> None:
        entry = MailboxEntry(message, datetime.now(UTC))
        self._entries.append(entry)
        stream = self._stream or sys.stdout
        stream.write(render(entry))
        stream.flush()

    def messages(self, project_id: str, *, destination: str | None = None,
                 limit: int = 50) -> list[MailboxEntry]:
        """The project's delivered messages, newest first, at most ``limit``."""
        found: list[MailboxEntry] = []
        for entry in reversed(self._entries):
            m = entry.message
            if m.project_id == project_id and (destination is None or m.destination == destination):
                found.append(entry)
                if len(found) >= limit:
                    break
        return found


def render(entry: MailboxEntry) -> str:
    """The console form of a delivered message (the link is in the text)."""
    m = entry.message
    head = f"── {m.channel} {m.kind} message {m.id} to {m.destination} (project {m.project_id}) "
    lines = [head + "─" * max(3, 78 - len(head))]
    if m.channel == "email":
        lines.append(f"Subject: {m.subject}")
        lines.append("")
    lines.append(m.text.rstrip("\n"))
    lines.append("─" * 78)
    return "\n".join(lines) + "\n"


# --- selection ----------------------------------------------------------------------------------


def uses_console(settings: Settings) -> bool:
    """True when either channel is configured to the console sink."""
    return settings.email_sink == "console" or settings.sms_sink == "console"


def build_senders(settings: Settings, *, console: ConsoleSink | None,
                  http: aiohttp.ClientSession | None) -> dict[Channel, Sender]:
    """The sender of each channel as configured. ``console`` is required when a channel uses the
    console sink, ``http`` when SMS goes to Twilio."""
    senders: dict[Channel, Sender] = {}
    if settings.email_sink == "smtp":
        senders["email"] = SmtpSender(settings)
    else:
        assert console is not None
        senders["email"] = console
    if settings.sms_sink == "twilio":
        assert http is not None
        senders["sms"] = TwilioSender(settings, http)
    else:
        assert console is not None
        senders["sms"] = console
    return senders
