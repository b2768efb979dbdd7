"""Audit stream destinations, one module each (DESIGN.md "audit streams"): ``webhook`` (JSON
batches signed like webhooks), ``datadog`` (the HTTP logs intake), ``splunk_hec`` (the HTTP
Event Collector), ``s3`` (one create-only object per batch) and ``nats`` (JetStream, one
message per event, deduplicated by ``Nats-Msg-Id``). Each module's ``DESTINATION``
(``base.Destination``) gives its configuration model (the fields of the create body), its
credential fields (shown as ``"***"``), the addresses the outbound rule applies to, and
``send``, which delivers one batch or raises ``base.Refused``."""

from __future__ import annotations

from typing import Final

from control_plane.audit.streams import datadog, nats, s3, splunk_hec, webhook
from control_plane.audit.streams.base import Destination

DESTINATIONS: Final[dict[str, Destination]] = {
    "webhook": webhook.DESTINATION, "datadog": datadog.DESTINATION,
    "splunk_hec": splunk_hec.DESTINATION, "s3": s3.DESTINATION, "nats": nats.DESTINATION,
}
