"""The ``webhook`` destination: each batch POSTed as ``{"stream_id", "events": [...]}`` and signed
like webhooks (Standard Webhooks) under the stream's own secret, ``webhook-id`` being the batch's
key (``<stream id>:<first event id>``, the same on every retry)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final, Literal

import orjson

from common.schemas import RequestModel
from control_plane.audit.streams.base import Batch, Context, Destination
from control_plane.web import webhook_signing
from control_plane.web.outbound import Url


class WebhookConfig(RequestModel):
    """``{"type": "webhook", "url"}``: an https URL on a public address (the webhook rule)."""

    type: Literal["webhook"]
    url: Url


async def send(ctx: Context, config: Mapping[str, Any], batch: Batch) -> None:
    body = orjson.dumps({"stream_id": batch.stream_id, "events": list(batch.events)})
    headers = webhook_signing.headers([config["secret"]], batch.key, int(time.time()), body)
    await ctx.post(config["url"], body, headers)


DESTINATION: Final = Destination(WebhookConfig, secrets=(), urls=("url",), signed=True, send=send)
