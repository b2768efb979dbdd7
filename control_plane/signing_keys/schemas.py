"""Signing-key bodies: the key as ``GET /v1/signing-keys`` lists it, the JWK Set, and the
rotation request."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from common.access_tokens import Alg
from common.schemas import RequestModel


@dataclass(frozen=True, slots=True)
class SigningKey:
    """A stored signing key, never its private material. ``status``: ``pending`` (published,
    not signing yet), ``active`` (signing) or ``retired`` (published until ``publish_until``,
    when every token it signed has expired)."""

    kid: str
    alg: Alg
    status: Literal["pending", "active", "retired"]
    created_at: datetime
    activated_at: datetime | None
    retired_at: datetime | None
    publish_until: datetime | None


@dataclass(frozen=True, slots=True)
class Jwks:
    """An RFC 7517 JWK Set: the project's published public keys (active first)."""

    keys: list[dict[str, Any]]


class RotateBody(RequestModel):
    """``alg``: the algorithm of the new key, which becomes the project's (default: the
    project's own)."""

    alg: Alg | None = None
