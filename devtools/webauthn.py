"""A software WebAuthn authenticator and client for the tests and the bench: what a browser and a
platform authenticator do together, answered as a browser's ``PublicKeyCredential.toJSON()``.

Keys are ES256 (P-256, ``cryptography``); the attestation object and COSE key are CBOR
(``fido2.cbor``); attestation is ``none``. It stores discoverable credentials (a passkey
provider), so a login without ``allowCredentials`` finds them by relying-party id; counting
credentials count their signatures (so the server's clone check runs on every login). Every knob
a test needs to misbehave is a keyword: another origin, RP id, challenge or ceremony type in
``clientDataJSON``, no user verification, a counter of the test's choosing. W3C WebAuthn
Level 3, sections 5.1.3, 5.1.4, 6.1 and 6.5.

Here, not in tests/, so that the bench (bench/scenarios/passkeys.py) shares it without importing
the tests; the services never import it (see :mod:`devtools`). tests/fixtures/webauthn.py
re-exports it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from fido2 import cbor

UP, UV, BE, BS, AT = 0x01, 0x04, 0x08, 0x10, 0x40
ES256 = -7
AAGUID = bytes.fromhex("a11ce0000000400080000000000000a1")


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def cose_key(public: ec.EllipticCurvePublicKey) -> bytes:
    """The COSE_Key (RFC 9053) of a P-256 public key, for ES256."""
    numbers = public.public_numbers()
    return cbor.encode({1: 2, 3: ES256, -1: 1, -2: numbers.x.to_bytes(32, "big"),
                        -3: numbers.y.to_bytes(32, "big")})


@dataclass
class Credential:
    """One discoverable credential the authenticator holds."""

    credential_id: bytes
    rp_id: str
    user_handle: bytes
    key: ec.EllipticCurvePrivateKey
    sign_count: int = 0
    counting: bool = True  # False: a synced passkey, whose counter is always 0
    backed_up: bool = False


@dataclass
class SoftAuthenticator:
    """The authenticator and the browser in front of it; ``origin`` is the page's."""

    origin: str
    credentials: list[Credential] = field(default_factory=list)

    def create(self, options: dict[str, Any], *, origin: str | None = None,
               rp_id: str | None = None, challenge: str | None = None,
               ceremony: str = "webauthn.create", uv: bool = True, counting: bool = True,
               synced: bool = False) -> dict[str, Any]:
        """``navigator.credentials.create`` with ``options`` (creation options JSON):
        ``RegistrationResponseJSON``. ``synced``: a passkey that a provider syncs (BE and BS
        set, counter 0)."""
        rp = rp_id or options["rp"]["id"]
        key = ec.generate_private_key(ec.SECP256R1())
        credential = Credential(os.urandom(32), rp, unb64url(options["user"]["id"]), key,
                                counting=counting and not synced, backed_up=synced)
        client_data = self._client_data(ceremony, challenge or options["challenge"], origin)
        flags = UP | AT | (UV if uv else 0) | (BE | BS if synced else 0)
        attested = AAGUID + struct.pack(">H", len(credential.credential_id)) \
            + credential.credential_id + cose_key(key.public_key())
        auth_data = hashlib.sha256(rp.encode()).digest() + bytes([flags]) \
            + struct.pack(">I", 0) + attested
        attestation = cbor.encode({"fmt": "none", "attStmt": {}, "authData": auth_data})
        self.credentials.append(credential)
        return {
            "id": b64url(credential.credential_id), "rawId": b64url(credential.credential_id),
            "type": "public-key", "authenticatorAttachment": "platform",
            "clientExtensionResults": {"credProps": {"rk": True}},
            "response": {
                "clientDataJSON": b64url(client_data), "attestationObject": b64url(attestation),
                "authenticatorData": b64url(auth_data), "transports": ["hybrid", "internal"],
                "publicKey": b64url(b"not checked by the server"), "publicKeyAlgorithm": ES256,
            },
        }

    def get(self, options: dict[str, Any], *, credential: Credential | None = None,
            origin: str | None = None, rp_id: str | None = None, challenge: str | None = None,
            ceremony: str = "webauthn.get", uv: bool = True, sign_count: int | None = None,
            tamper: bool = False, user_handle: bool = True) -> dict[str, Any]:
        """``navigator.credentials.get`` with ``options`` (request options JSON):
        ``AuthenticationResponseJSON``. The credential is ``credential``, else the first of
        ``allowCredentials`` held, else the newest discoverable one of the RP id. ``tamper``
        flips a bit of the signature; ``sign_count`` overrides the counter."""
        rp = rp_id or options["rpId"]
        if credential is None:
            allowed = {unb64url(c["id"]) for c in options.get("allowCredentials") or []}
            held = [c for c in self.credentials if c.rp_id == options["rpId"]
                    and (not allowed or c.credential_id in allowed)]
            assert held, "no credential for this relying party"
            credential = held[-1]
        if credential.counting:
            credential.sign_count += 1
        count = credential.sign_count if sign_count is None else sign_count
        client_data = self._client_data(ceremony, challenge or options["challenge"], origin)
        flags = UP | (UV if uv else 0) | (BE | BS if credential.backed_up else 0)
        auth_data = hashlib.sha256(rp.encode()).digest() + bytes([flags]) + struct.pack(">I", count)
        signature = credential.key.sign(auth_data + hashlib.sha256(client_data).digest(),
                                        ec.ECDSA(hashes.SHA256()))
        if tamper:
            signature = signature[:-1] + bytes([signature[-1] ^ 1])
        response: dict[str, Any] = {
            "clientDataJSON": b64url(client_data), "authenticatorData": b64url(auth_data),
            "signature": b64url(signature),
        }
        if user_handle:
            response["userHandle"] = b64url(credential.user_handle)
        return {
            "id": b64url(credential.credential_id), "rawId": b64url(credential.credential_id),
            "type": "public-key", "authenticatorAttachment": "platform",
            "clientExtensionResults": {}, "response": response,
        }

    def _client_data(self, ceremony: str, challenge: str, origin: str | None) -> bytes:
        return json.dumps({"type": ceremony, "challenge": challenge,
                           "origin": origin or self.origin, "crossOrigin": False},
                          separators=(",", ":")).encode()
