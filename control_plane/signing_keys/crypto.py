"""Signing-key material: generation, sealing and the public JWK. Pure (no I/O but the KMS's
local cryptography).

A key is Ed25519 (``EdDSA``, the default) or 2048-bit RSA (``RS256``), named ``kid_<ulid>``. The
private key (PKCS #8 DER) is kept only sealed by the KMS with ``aad = b"signing_key:" + kid``, so
a sealed key copied into another row does not open. The public JWK is RFC 7517's, with ``kid``,
``alg`` and ``use: "sig"`` (RFC 8037 OKP for Ed25519, RFC 7518 6.3 for RSA).
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass
from typing import Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from common.access_tokens import ALGS, Alg
from common.ids import new_id
from control_plane.kms import LocalKms

__all__ = ["ALGS", "DEFAULT_ALG", "Alg", "NewKey", "PrivateKey", "generate_key",
           "open_private_key", "public_jwk"]

DEFAULT_ALG: Final[Alg] = "EdDSA"
RSA_BITS: Final = 2048
RSA_EXPONENT: Final = 65537

PrivateKey = ed25519.Ed25519PrivateKey | rsa.RSAPrivateKey


def private_aad(kid: str) -> bytes:
    """The KMS ``aad`` binding a sealed private key to its ``kid``."""
    return b"signing_key:" + kid.encode()


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _uint(n: int) -> str:
    return _b64url(n.to_bytes(max(1, (n.bit_length() + 7) // 8), "big"))


def public_jwk(private_key: PrivateKey, kid: str, alg: Alg) -> dict[str, str]:
    """The RFC 7517 public JWK of ``private_key`` with ``kid``, ``alg`` and ``use: "sig"``."""
    if isinstance(private_key, ed25519.Ed25519PrivateKey):
        raw = private_key.public_key().public_bytes(serialization.Encoding.Raw,
                                                    serialization.PublicFormat.Raw)
        return {"kty": "OKP", "crv": "Ed25519", "x": _b64url(raw), "kid": kid, "alg": alg,
                "use": "sig"}
    numbers = private_key.public_key().public_numbers()
    return {"kty": "RSA", "n": _uint(numbers.n), "e": _uint(numbers.e), "kid": kid, "alg": alg,
            "use": "sig"}


def open_private_key(kms: LocalKms, kid: str, sealed: bytes) -> PrivateKey:
    """Unseal and load a stored private key. Raises control_plane.kms.KmsError when the KEK or
    ``kid`` does not match, ValueError when the plaintext is not a supported key."""
    key = serialization.load_der_private_key(kms.open(sealed, private_aad(kid)), password=None)
    if not isinstance(key, ed25519.Ed25519PrivateKey | rsa.RSAPrivateKey):
        raise ValueError("the stored signing key is neither Ed25519 nor RSA")
    return key


@dataclass(frozen=True, slots=True)
class NewKey:
    """A freshly generated key, ready to store: its public JWK and sealed private key."""

    kid: str
    alg: Alg
    public_jwk: dict[str, str]
    private_sealed: bytes


def _generate(kms: LocalKms, alg: Alg) -> NewKey:
    private_key: PrivateKey
    if alg == "EdDSA":
        private_key = ed25519.Ed25519PrivateKey.generate()
    elif alg == "RS256":
        private_key = rsa.generate_private_key(public_exponent=RSA_EXPONENT, key_size=RSA_BITS)
    else:
        raise ValueError(f"unsupported signing algorithm {alg!r}")
    kid = new_id("kid")
    der = private_key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    return NewKey(kid, alg, public_jwk(private_key, kid, alg), kms.seal(der, private_aad(kid)))


async def generate_key(kms: LocalKms, alg: Alg) -> NewKey:
    """A new key pair for ``alg``, the private half sealed. RSA generation (tens of
    milliseconds) runs in a thread so the event loop keeps serving."""
    if alg == "RS256":
        return await asyncio.to_thread(_generate, kms, alg)
    return _generate(kms, alg)
