"""The derived successor of a refresh token (``sessions.service.successor_of``) and the KMS's
``mac`` beneath it."""

from __future__ import annotations

import re
import secrets

from common.auth import token_digest
from control_plane.kms import LocalKms
from control_plane.sessions.service import new_refresh_token, successor_of


def test_the_successor_is_the_same_for_the_same_token_and_key() -> None:
    kms = LocalKms(secrets.token_bytes(32))
    token, _ = new_refresh_token()
    successor, digest = successor_of(token, kms)
    assert successor_of(token, kms) == (successor, digest)
    assert digest == token_digest(successor)
    # The shape of every refresh token: rt_ and 43 base64url characters (32 bytes).
    assert re.fullmatch(r"rt_[A-Za-z0-9_-]{43}", successor)
    assert successor_of(new_refresh_token()[0], kms)[0] != successor


def test_the_successor_depends_on_the_key_and_the_purpose() -> None:
    a, b = LocalKms(secrets.token_bytes(32)), LocalKms(secrets.token_bytes(32))
    token, _ = new_refresh_token()
    assert successor_of(token, a) != successor_of(token, b)
    assert a.mac(b"refresh_successor", b"x") != a.mac(b"other", b"x")
    assert len(a.mac(b"refresh_successor", b"x")) == 32
