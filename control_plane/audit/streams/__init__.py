"""Audit stream destinations, one module each (DESIGN.md "audit streams"): ``webhook`` (JSON
batches signed like webhooks), ``datadog`` (the HTTP logs intake), ``splunk_hec`` (the HTTP
Event Collector). Each has a ``Config`` model (its fields in the create body), the names of its
``SECRETS`` (shown as ``"***"``), and ``send``, which delivers one batch or raises
``base.Refused``."""

from __future__ import annotations

from typing import Final

from control_plane.audit.streams import datadog, splunk_hec, webhook
from control_plane.audit.streams.base import Destination

DESTINATIONS: Final[dict[str, Destination]] = {
    "webhook": webhook.DESTINATION, "datadog": datadog.DESTINATION,
    "splunk_hec": splunk_hec.DESTINATION,
}
