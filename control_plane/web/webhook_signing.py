"""Standard Webhooks signatures (https://www.standardwebhooks.com, DESIGN.md "webhook signing").

A secret is ``whsec_`` + the base64 of 24 random bytes; the key is those bytes. A message is
signed as ``v1,`` + base64(HMAC-SHA256(key, "<webhook-id>.<webhook-timestamp>.<body>")); several
signatures (the new and the previous secret for 24 hours after a rotation) are joined by spaces
in ``webhook-signature``. Receivers verify with the ``standardwebhooks`` libraries, in constant
time (SPEC.md 5 rule 6).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Sequence
from typing import Final

SECRET_PREFIX: Final = "whsec_"
SECRET_BYTES: Final = 24


def new_secret() -> str:
    """A fresh signing secret."""
    return SECRET_PREFIX + base64.b64encode(os.urandom(SECRET_BYTES)).decode()


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``v1,...`` signature of one message under ``secret``."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    mac = hmac.digest(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac).decode()


def headers(secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers of one message, signed under each of ``secrets``."""
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": " ".join(sign(s, msg_id, timestamp, body) for s in secrets),
            "content-type": "application/json"}
