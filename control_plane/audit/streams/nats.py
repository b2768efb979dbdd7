"""The ``nats`` destination: NATS JetStream (``nats-py``). Each event is one message on
``subject`` (a stream of the broker must capture it), its body the event as ``GET
/v1/audit/events`` lists it, and its ``Nats-Msg-Id`` header the ``evt_`` id, so JetStream drops a
message sent again within its duplicate window (2 minutes by default): a batch resent after a
lost acknowledgement is stored once. A batch is acknowledged when JetStream acknowledged every
message of it (published asynchronously, in order, on one connection).

With ``credentials`` (a ``.creds`` file's content) the client answers the server's nonce with
the user's signature (nats-py through ``nkeys``, a dependency) and sends the user JWT.

Connections are kept per stream and configuration, and dropped on any failure (the next batch
connects again)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

import nkeys
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

_DECORATED: Final = re.compile(r"^-{3,}[^\r\n]*-{3,}\r?\n([\w.=-]+)\r?\n-{3,}[^\r\n]*-{3,}\r?$",
                               re.MULTILINE | re.ASCII)
"""A value between its dashed lines in a ``.creds`` file, as nats-io/jwt reads one: first the
user JWT, then the user's NKey seed."""

Server = Annotated[str, StringConstraints(min_length=1, max_length=300, pattern=SERVER_PATTERN)]


class NatsConfig(RequestModel):
    """``{"type": "nats", "servers": ["nats://host:4222"], "subject", "credentials"?}``:
    ``credentials`` is a ``.creds`` file's content (a user JWT and its NKey seed)."""

    type: Literal["nats"]
    servers: Annotated[list[Server], Field(min_length=1, max_length=10)]
    subject: Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=SUBJECT_PATTERN)]
    credentials: Annotated[str, StringConstraints(min_length=1, max_length=10_000)] | None = None


_CLIENTS: dict[str, tuple[tuple[Any, ...], Client]] = {}


def user_credentials(text: str) -> RawCredentials:
    """``text``, a ``.creds`` file's content, rewritten in the exact form nats-py reads (the JWT
    and the seed each on the line after its opening dashed line); ValueError saying what is
    wrong, no secret in it. nats-py reads the text itself only during the handshake, and never
    returns from a text without the JWT's opening line (it reads past the end forever)."""
    found = _DECORATED.findall(text)
    if len(found) < 2:
        raise ValueError("not a .creds file's content: a user JWT, then a user NKey seed, "
                         "each between its dashed BEGIN and END lines")
    jwt, seed = found[0], found[1]
    if jwt.count(".") != 2:
        raise ValueError("the first value is not a JWT")
    if not seed.startswith("SU"):
        raise ValueError("the second value is not a user's NKey seed (SU...)")
    try:
        nkeys.from_seed(seed.encode())
    except (nkeys.NkeysError, ValueError):
        raise ValueError("the user NKey seed does not decode") from None
    return RawCredentials(
        f"-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n")


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
    creds = None
    if config.get("credentials"):
        try:
            creds = user_credentials(config["credentials"])
        except ValueError as exc:
            raise Refused(f"NATS credentials: {exc}") from None
    client = Client()
    try:
        async with asyncio.timeout(2 * ctx.timeout_seconds):  # each server once, not forever
            await client.connect(  # its connect_timeout, typed int, is asyncio's: seconds, a float
                servers=list(config["servers"]), connect_timeout=ctx.timeout_seconds,  # type: ignore[arg-type]
                max_reconnect_attempts=1, allow_reconnect=False, error_cb=_quiet,
                dont_randomize=True,  # the servers in their given order (and no shared RNG)
                user_credentials=creds)
    except BaseException:
        # nats-py keeps the socket of a handshake the server refused (an authorization error)
        # open when it does not reconnect: closed here, not leaked at each retry.
        with contextlib.suppress(Exception):
            await client.close()
        raise
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
    except (NatsError, OSError, TimeoutError) as exc:
        await _drop(batch.stream_id)
        raise Refused(f"NATS: {type(exc).__name__}: {exc}"[:300]) from None


DESTINATION: Final = Destination(NatsConfig, secrets=("credentials",), urls=(), signed=False,
                                 send=send, check=check, close=close)
