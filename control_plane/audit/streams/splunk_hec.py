"""The ``splunk_hec`` destination: Splunk's HTTP Event Collector (``POST
/services/collector/event``, ``Authorization: Splunk <token>``, events as JSON objects one after
another; https://docs.splunk.com/Documentation/Splunk/latest/Data/HECRESTendpoints). Each event
is one HEC event: ``time`` (epoch seconds), ``host`` and ``source`` ``authio``, ``sourcetype``
``_json``, the ``index`` when configured, and the audit event as ``event``. HEC answers 200 with
``{"text": "Success", "code": 0}``."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Final, Literal

import orjson
from pydantic import StringConstraints

from common.schemas import RequestModel
from control_plane.audit.streams.base import Batch, Context, Destination
from control_plane.web.outbound import Url

COLLECTOR_PATH: Final = "/services/collector/event"


class SplunkConfig(RequestModel):
    """``{"type": "splunk_hec", "url", "token", "index"?}``: ``url`` is the collector's base
    (``https://splunk.example.com:8088``) or its full event endpoint."""

    type: Literal["splunk_hec"]
    url: Url
    token: Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")]
    index: Annotated[str, StringConstraints(min_length=1, max_length=80,
                                            pattern=r"^[a-z0-9][a-z0-9_-]*$")] | None = None


def endpoint(config: Mapping[str, Any]) -> str:
    url = str(config["url"]).rstrip("/")
    return url if url.endswith(COLLECTOR_PATH) else url + COLLECTOR_PATH


async def send(ctx: Context, config: Mapping[str, Any], batch: Batch) -> None:
    index = config.get("index")
    lines = []
    for e in batch.events:
        at = datetime.fromisoformat(str(e["created_at"]).replace("Z", "+00:00")).timestamp()
        item: dict[str, Any] = {"time": round(at, 6), "host": "authio", "source": "authio",
                                "sourcetype": "_json", "event": e}
        if index:
            item["index"] = index
        lines.append(orjson.dumps(item))
    await ctx.post(endpoint(config), b"\n".join(lines),
                   {"Authorization": f"Splunk {config['token']}",
                    "Content-Type": "application/json"})


DESTINATION: Final = Destination(SplunkConfig, secrets=("token",), urls=("url",), signed=False,
                                 send=send)
