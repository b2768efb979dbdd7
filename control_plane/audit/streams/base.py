"""What every destination module gives: its configuration's model, its secrets, and ``send``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from common.schemas import RequestModel
from control_plane.web import outbound


class Refused(Exception):
    """The destination did not take the batch: ``reason`` (short, no secret), and how long it
    asked to be left alone (``retry_after``, seconds) when it said."""

    def __init__(self, reason: str, *, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason[:500]
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class Batch:
    """Events of one stream to deliver together, in the log's order: ``events`` as ``GET
    /v1/audit/events`` lists them; ``key`` names the batch the same way on every retry
    (``<stream id>:<first event id>``)."""

    stream_id: str
    key: str
    events: Sequence[Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class Context:
    """What a send may use: the outbound HTTP client, whether non-public addresses are allowed,
    and the attempt's time limit (seconds)."""

    http: aiohttp.ClientSession
    allow_private: bool
    timeout_seconds: float

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> None:
        """POST under the outbound rules; a 2xx is acknowledgement, anything else raises
        Refused."""
        answer = await outbound.post(self.http, url, body, headers,
                                     allow_private=self.allow_private,
                                     timeout_seconds=self.timeout_seconds)
        if answer.error is not None:
            raise Refused(answer.error, retry_after=answer.retry_after)


Send = Callable[[Context, Mapping[str, Any], Batch], Awaitable[None]]
Check = Callable[..., Awaitable[list[tuple[str, str]]]]
"""``check(config, allow_private=...)``: (field, problem) of each address the outbound rule
refuses, for destinations whose addresses are not URLs of ``urls``."""


@dataclass(frozen=True, slots=True)
class Destination:
    """A destination type: its ``config`` model, the names of its credential fields (shown as
    ``"***"``), the URL fields the outbound rule applies to (and ``check`` for other
    addresses), whether the stream gets a signing secret of its own, and ``send``."""

    config: type[RequestModel]
    secrets: tuple[str, ...]
    urls: tuple[str, ...]
    signed: bool
    send: Send
    check: Check | None = None
    close: Callable[[], Awaitable[None]] | None = None
    """Close the connections the module keeps (the streams' worker stopping)."""
