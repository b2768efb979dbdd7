"""A software WebAuthn authenticator with the browser in front of it, for the passkey scenario:
what ``navigator.credentials.create``/``get`` answer, as ``PublicKeyCredential.toJSON()``.

The bench's own copy of the tests' ``tests/fixtures/webauthn.py`` (the bench does not import
the tests), without the knobs that make it misbehave. ES256 keys (P-256, ``cryptography``),
attestation ``none``, the attestation object and COSE key in CBOR (``fido2.cbor``); the
credentials are discoverable and count their signatures (so the server's clone check runs on
every login). W3C WebAuthn Level 3, sections 5.1.3, 5.1.4, 6.1 and 6.5.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from fido2 import cbor

UP, UV, AT = 0x01, 0x04, 0x40  # authenticator data flags: user present, verified, attested
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
    """One discoverable credential: its id, relying party, user handle, key and counter."""

    credential_id: bytes
    rp_id: str
    user_handle: bytes
    key: ec.EllipticCurvePrivateKey
    sign_count: int = 0


class SoftAuthenticator:
    """A platform authenticator and the browser around it; ``origin`` is the page's."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def create(self, options: dict[str, Any]) -> tuple[Credential, dict[str, Any]]:
        """``navigator.credentials.create`` with the creation options JSON: the new credential
        and the ``RegistrationResponseJSON``."""
        rp = options["rp"]["id"]
        key = ec.generate_private_key(ec.SECP256R1())
        credential = Credential(os.urandom(32), rp, unb64url(options["user"]["id"]), key)
        client_data = self._client_data("webauthn.create", options["challenge"])
        attested = AAGUID + struct.pack(">H", len(credential.credential_id)) \
            + credential.credential_id + cose_key(key.public_key())
        auth_data = hashlib.sha256(rp.encode()).digest() + bytes([UP | UV | AT]) \
            + struct.pack(">I", 0) + attested
        attestation = cbor.encode({"fmt": "none", "attStmt": {}, "authData": auth_data})
        return credential, {
            "id": b64url(credential.credential_id), "rawId": b64url(credential.credential_id),
            "type": "public-key", "authenticatorAttachment": "platform",
            "clientExtensionResults": {"credProps": {"rk": True}},
            "response": {
                "clientDataJSON": b64url(client_data), "attestationObject": b64url(attestation),
                "authenticatorData": b64url(auth_data), "transports": ["internal"],
                "publicKeyAlgorithm": ES256,
            },
        }

    def get(self, options: dict[str, Any], credential: Credential) -> dict[str, Any]:
        """``navigator.credentials.get`` with the request options JSON, answered by
        ``credential``: the ``AuthenticationResponseJSON``."""
        credential.sign_count += 1
        client_data = self._client_data("webauthn.get", options["challenge"])
        auth_data = hashlib.sha256(options["rpId"].encode()).digest() + bytes([UP | UV]) \
            + struct.pack(">I", credential.sign_count)
        signature = credential.key.sign(auth_data + hashlib.sha256(client_data).digest(),
                                        ec.ECDSA(hashes.SHA256()))
        return {
            "id": b64url(credential.credential_id), "rawId": b64url(credential.credential_id),
            "type": "public-key", "authenticatorAttachment": "platform",
            "clientExtensionResults": {},
            "response": {"clientDataJSON": b64url(client_data),
                         "authenticatorData": b64url(auth_data), "signature": b64url(signature),
                         "userHandle": b64url(credential.user_handle)},
        }

    def _client_data(self, ceremony: str, challenge: str) -> bytes:
        return json.dumps({"type": ceremony, "challenge": challenge, "origin": self.origin,
                           "crossOrigin": False}, separators=(",", ":")).encode()
