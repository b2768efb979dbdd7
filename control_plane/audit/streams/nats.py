"""The ``nats`` destination: NATS JetStream (``nats-py``). Each event is one message on
``subject`` (a stream of the broker must capture it), its body the event as ``GET
/v1/audit/events`` lists it, and its ``Nats-Msg-Id`` header the ``evt_`` id, so JetStream drops a
message sent again within its duplicate window (2 minutes by default): a batch resent after a
lost acknowledgement is stored once. A batch is acknowledged when JetStream acknowledged every
message of it (published asynchronously, in order, on one connection).

Connections are kept per stream and configuration, and dropped on any failure (the next batch
connects again)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

import nats
import orjson
from nats.aio.client import Client, RawCredentials
from nats.errors import Error as NatsError
from pydantic import Field, StringConstraints

from common.schemas import RequestModel
from control_plane.audit.streams.base import Batch, Context, Destination, Refused
from control_plane.web import outbound

SUBJECT_PATTERN: Final = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$"
"""A subject to publish on: tokens separated by dots, no wildcard."""
SERVER_PATTERN: Final = r"^(nats|tls)://[!-~]+$"

Server = Annotated[str, StringConstraints(min_length=1, max_length=300, pattern=SERVER_PATTERN)]


class NatsConfig(RequestModel):
    """``{"type": "nats", "servers": ["nats://host:4222"], "subject", "credentials"?}``:
    ``credentials`` is a ``.creds`` file's content (a user JWT and its NKey seed)."""

    type: Literal["nats"]
    servers: Annotated[list[Server], Field(min_length=1, max_length=10)]
    subject: Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=SUBJECT_PATTERN)]
    credentials: Annotated[str, StringConstraints(min_length=1, max_length=10_000)] | None = None


_CLIENTS: dict[str, tuple[tuple[Any, ...], Client]] = {}


async def check(config: Mapping[str, Any], *, allow_private: bool) -> list[tuple[str, str]]:
    """(field, problem) of each server the outbound address rule refuses."""
    problems = []
    for i, server in enumerate(config["servers"]):
        host = urlsplit(server).hostname or ""
        problem = await outbound.host_problem(host, allow_private=allow_private)
        if problem:
            problems.append((f"destination.servers.{i}", problem))
    return problems


async def _client(ctx: Context, stream_id: str, config: Mapping[str, Any]) -> Client:
    key = (tuple(config["servers"]), config.get("credentials"))
    found = _CLIENTS.get(stream_id)
    if found is not None and found[0] == key and found[1].is_connected:
        return found[1]
    if found is not None:
        await _drop(stream_id)
    if await check(config, allow_private=ctx.allow_private):
        raise Refused("refused: a server's address is not public")
    creds = config.get("credentials")
    async with asyncio.timeout(2 * ctx.timeout_seconds):  # each server once, not forever
        client = await nats.connect(
            servers=list(config["servers"]), connect_timeout=ctx.timeout_seconds,
            max_reconnect_attempts=1, allow_reconnect=False, error_cb=_quiet,
            dont_randomize=True,  # the servers in their given order (and no shared RNG)
            user_credentials=RawCredentials(creds) if creds else None)
    _CLIENTS[stream_id] = (key, client)
    return client


async def _quiet(exc: Exception) -> None:
    """nats-py's error callback: its own default logs each connection error with a traceback;
    a failed batch is logged once by the stream worker instead."""


async def _drop(stream_id: str) -> None:
    found = _CLIENTS.pop(stream_id, None)
    if found is not None:
        try:
            await found[1].close()
        except Exception:
            pass


async def close() -> None:
    """Close every kept connection."""
    for stream_id in list(_CLIENTS):
        await _drop(stream_id)


async def send(ctx: Context, config: Mapping[str, Any], batch: Batch) -> None:
    try:
        client = await _client(ctx, batch.stream_id, config)
        js = client.jetstream()
        acks = [await js.publish_async(config["subject"], orjson.dumps(e),
                                       headers={"Nats-Msg-Id": str(e["id"])})
                for e in batch.events]
        async with asyncio.timeout(ctx.timeout_seconds):
            await asyncio.gather(*acks)
    except Refused:
        raise
    except ImportError as exc:  # nats-py signs with credentials through the optional nkeys
        await _drop(batch.stream_id)
        raise Refused(f"NATS credentials need the nkeys package, not installed ({exc})") from None
    except (NatsError, OSError, TimeoutError) as exc:
        await _drop(batch.stream_id)
        raise Refused(f"NATS: {type(exc).__name__}: {exc}"[:300]) from None


DESTINATION: Final = Destination(NatsConfig, secrets=("credentials",), urls=(), signed=False,
                                 send=send, check=check, close=close)
