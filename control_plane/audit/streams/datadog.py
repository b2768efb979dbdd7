"""The ``datadog`` destination: Datadog's HTTP logs intake (v2, ``POST /api/v2/logs``, a JSON array
of logs, ``DD-API-KEY``; https://docs.datadoghq.com/api/latest/logs/#send-logs). Each event is
one log: ``ddsource`` ``authio``, ``service`` ``authio-audit``, tags naming the stream, project
and action, ``message`` the action and description, ``date`` the event's time, ``evt`` its id and
name (Datadog's standard attributes), and the event itself as ``audit``. The intake answers 202
once it has the batch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

import orjson
from pydantic import StringConstraints

from common.schemas import RequestModel
from control_plane.audit.streams.base import Batch, Context, Destination
from control_plane.web.outbound import Url

SITE_PATTERN: Final = r"^[a-z0-9]+([.-][a-z0-9]+)*\.[a-z]{2,}$"
"""A Datadog site: ``datadoghq.com``, ``datadoghq.eu``, ``us3.datadoghq.com``, ..."""


class DatadogConfig(RequestModel):
    """``{"type": "datadog", "api_key", "site"?, "url"?}``: logs go to
    ``https://http-intake.logs.<site>/api/v2/logs`` (site ``datadoghq.com`` unless given), or to
    ``url`` (a proxy, or a regional intake the site rule does not spell)."""

    type: Literal["datadog"]
    api_key: Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")]
    site: Annotated[str, StringConstraints(min_length=4, max_length=100, pattern=SITE_PATTERN)] = \
        "datadoghq.com"
    url: Url | None = None


def intake(config: Mapping[str, Any]) -> str:
    return str(config.get("url") or f"https://http-intake.logs.{config.get('site') or 'datadoghq.com'}/api/v2/logs")


async def send(ctx: Context, config: Mapping[str, Any], batch: Batch) -> None:
    logs = [{
        "ddsource": "authio", "service": "authio-audit", "hostname": "authio",
        "ddtags": f"stream:{batch.stream_id},project:{e.get('project_id')},action:{e['action']}",
        "message": f"{e['action']}: {e.get('description') or ''}".rstrip(": "),
        "date": e["created_at"], "evt": {"id": e["id"], "name": e["action"]}, "audit": e,
    } for e in batch.events]
    await ctx.post(intake(config), orjson.dumps(logs),
                   {"DD-API-KEY": config["api_key"], "Content-Type": "application/json"})


DESTINATION: Final = Destination(DatadogConfig, secrets=("api_key",), urls=("url",), signed=False,
                                 send=send)
