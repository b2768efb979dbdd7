"""Verifying the webhooks authio sends (the Standard Webhooks scheme, standardwebhooks.com;
DESIGN.md "webhook signing"), with the standard library's ``hmac`` alone.

A delivery carries ``webhook-id`` (the event's ``evt_`` id, the same on every retry),
``webhook-timestamp`` (Unix seconds of the attempt) and ``webhook-signature``: space-separated
``v1,<base64 of HMAC-SHA256(key, "<webhook-id>.<webhook-timestamp>.<body>")>``, one per secret
(the old and the new one for 24 hours after a rotation). The key is the base64 after the
endpoint secret's ``whsec_`` prefix.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["TOLERANCE_SECONDS", "WebhookVerificationError", "verify_webhook"]

TOLERANCE_SECONDS: Final = 300.0
"""How far ``webhook-timestamp`` may be from the receiver's clock, either way (5 minutes, as
the Standard Webhooks libraries): an older message is refused as a possible replay."""


class WebhookVerificationError(ValueError):
    """The message is not a delivery signed with the secret: a header missing or malformed, a
    timestamp outside the tolerance, or no signature matching. Answer it 400 and ignore it."""


def verify_webhook(payload: bytes | str, headers: Mapping[str, str], secret: str, *,
                   tolerance: float = TOLERANCE_SECONDS, now: float | None = None) -> Any:
    """The decoded JSON body of a webhook delivery, once its signature holds.

    ``payload`` the request body exactly as received (bytes, or text that is its UTF-8
    decoding: verify before any JSON parsing, which would change the bytes), ``headers`` the
    request's headers (any mapping; names compared case-insensitively), ``secret`` the
    endpoint's ``whsec_...`` secret (from ``create_webhook_endpoint`` or
    ``rotate_webhook_endpoint_secret``), ``tolerance`` seconds (300) between
    ``webhook-timestamp`` and ``now`` (Unix seconds, default the clock). The answer is the
    event: ``{"id": "evt_...", "type": action, "timestamp", "data": the audit event}``; the
    ``id`` (also ``webhook-id``) is the same on every retry and replay, so deduplicate on it.
    Signatures are compared in constant time. Raises :class:`WebhookVerificationError`."""
    h = {k.lower(): v for k, v in headers.items()}
    msg_id, stamp, signatures = h.get("webhook-id"), h.get("webhook-timestamp"), h.get("webhook-signature")
    if not msg_id or not stamp or not signatures:
        raise WebhookVerificationError("missing webhook-id, webhook-timestamp or webhook-signature")
    try:
        timestamp = int(stamp)
    except ValueError:
        raise WebhookVerificationError("webhook-timestamp is not a number of seconds") from None
    current = time.time() if now is None else now
    if timestamp < current - tolerance:
        raise WebhookVerificationError("the message is too old (webhook-timestamp)")
    if timestamp > current + tolerance:
        raise WebhookVerificationError("the message is too new (webhook-timestamp)")
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        raise WebhookVerificationError("the secret is not whsec_ followed by base64") from None
    body = payload.encode() if isinstance(payload, str) else bytes(payload)
    mac = hmac.digest(key, f"{msg_id}.{stamp}.".encode() + body, hashlib.sha256)
    expected = base64.b64encode(mac)
    for candidate in signatures.split():
        version, _, signature = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(signature.encode(), expected):
            try:
                return json.loads(body)
            except ValueError:
                raise WebhookVerificationError("the signed body is not JSON") from None
    raise WebhookVerificationError("no signature matches the secret")
