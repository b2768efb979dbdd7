"""The ``s3`` destination: S3-compatible object storage through ``aiobotocore``. Each batch is one
object of JSON lines (one event per line, as ``GET /v1/audit/events`` lists it) under a key
made of the batch alone, ``<prefix><stream id>/<yyyy>/<mm>/<dd>/<first event id>.jsonl`` (the
date of its first event), written create-only (``If-None-Match: *``): a batch sent again after a
lost acknowledgement finds its object there (412) and counts as acknowledged, so each batch is
stored exactly once.

Clients are kept per stream and configuration, and dropped on any failure."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

import orjson
from aiobotocore.session import get_session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import StringConstraints

from common.schemas import RequestModel
from control_plane.audit.streams.base import Batch, Context, Destination, Refused
from control_plane.web.outbound import Url

BUCKET_PATTERN: Final = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"
"""S3's bucket naming rules (3 to 63 lower-case letters, digits, dots and hyphens)."""
PREFIX_PATTERN: Final = r"^[A-Za-z0-9!_.*'()/-]*$"
"""A key prefix of S3's safe characters."""


class S3Config(RequestModel):
    """``{"type": "s3", "bucket", "prefix"?, "region"?, "endpoint_url"?, "access_key_id",
    "secret_access_key"}``: ``endpoint_url`` for S3-compatible storage other than AWS."""

    type: Literal["s3"]
    bucket: Annotated[str, StringConstraints(min_length=3, max_length=63, pattern=BUCKET_PATTERN)]
    prefix: Annotated[str, StringConstraints(max_length=200, pattern=PREFIX_PATTERN)] = ""
    region: Annotated[str, StringConstraints(min_length=1, max_length=40,
                                             pattern=r"^[a-z0-9-]+$")] = "us-east-1"
    endpoint_url: Url | None = None
    access_key_id: Annotated[str, StringConstraints(min_length=1, max_length=128,
                                                    pattern=r"^[\x21-\x7e]+$")]
    secret_access_key: Annotated[str, StringConstraints(min_length=1, max_length=256,
                                                        pattern=r"^[\x21-\x7e]+$")]


_CLIENTS: dict[str, tuple[tuple[Any, ...], Any, contextlib.AsyncExitStack]] = {}


def object_key(config: Mapping[str, Any], batch: Batch) -> str:
    first = batch.events[0]
    day = str(first["created_at"])[:10].replace("-", "/")
    return f"{config.get('prefix') or ''}{batch.stream_id}/{day}/{first['id']}.jsonl"


async def _client(ctx: Context, stream_id: str, config: Mapping[str, Any]) -> Any:
    key = tuple(config.get(k) for k in ("region", "endpoint_url", "access_key_id",
                                        "secret_access_key"))
    found = _CLIENTS.get(stream_id)
    if found is not None and found[0] == key:
        return found[1]
    await _drop(stream_id)
    stack = contextlib.AsyncExitStack()
    client = await stack.enter_async_context(get_session().create_client(
        "s3", region_name=config.get("region") or "us-east-1",
        endpoint_url=config.get("endpoint_url"), aws_access_key_id=config["access_key_id"],
        aws_secret_access_key=config["secret_access_key"],
        config=Config(connect_timeout=ctx.timeout_seconds, read_timeout=ctx.timeout_seconds,
                      # One attempt: the stream retries a refused batch itself (backoff, status).
                      retries={"total_max_attempts": 1, "mode": "standard"},
                      s3={"addressing_style": "path"})))
    _CLIENTS[stream_id] = (key, client, stack)
    return client


async def _drop(stream_id: str) -> None:
    found = _CLIENTS.pop(stream_id, None)
    if found is not None:
        with contextlib.suppress(Exception):
            await found[2].aclose()


async def close() -> None:
    """Close every kept connection."""
    for stream_id in list(_CLIENTS):
        await _drop(stream_id)


async def send(ctx: Context, config: Mapping[str, Any], batch: Batch) -> None:
    body = b"".join(orjson.dumps(e) + b"\n" for e in batch.events)
    try:
        client = await _client(ctx, batch.stream_id, config)
        await client.put_object(Bucket=config["bucket"], Key=object_key(config, batch), Body=body,
                                ContentType="application/x-ndjson", IfNoneMatch="*")
    except ClientError as exc:
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status == 412 or error.get("Code") == "PreconditionFailed":
            return  # written by an earlier attempt whose acknowledgement was lost
        await _drop(batch.stream_id)
        raise Refused(f"S3 {status}: {error.get('Code')}: {error.get('Message')}"[:300]) from None
    except (BotoCoreError, OSError, TimeoutError) as exc:
        await _drop(batch.stream_id)
        raise Refused(f"S3: {type(exc).__name__}: {exc}"[:300]) from None


DESTINATION: Final = Destination(S3Config, secrets=("access_key_id", "secret_access_key"),
                                 urls=("endpoint_url",), signed=False, send=send, close=close)
