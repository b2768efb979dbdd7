"""Envelope encryption of secrets at rest (DESIGN.md "signing keys", "secrets at rest").

Each secret gets a fresh AES-256-GCM data key; the data key is wrapped (AES-256-GCM) by the
key-encryption key (KEK) from ``SERVICE_KMS_KEY`` or ``SERVICE_KMS_KEY_FILE``. A sealed value is

    b"\\x01" | kek_id (8 bytes) | wrap_nonce (12) | wrapped data key (32 + 16 tag)
           | nonce (12) | ciphertext + tag (16)

``kek_id`` (the first 8 bytes of SHA-256 of the KEK) says which KEK wrapped the data key, so a
value sealed under another KEK fails with a clear error instead of a bare tag mismatch. ``aad``
binds a sealed value to its place (for example ``b"signing_key:" + kid``): a ciphertext copied
into another row does not open. ``mac`` gives a keyed digest under a key derived from the KEK
for one purpose (HKDF-SHA256, RFC 5869), for values that must be recomputable but never stored.
A cloud KMS plugs in behind the same methods (``seal`` and ``open`` wrapping the data key
remotely, ``mac`` as its HMAC operation).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

_VERSION: Final = b"\x01"
_NONCE: Final = 12
_KEK_ID: Final = 8
_WRAPPED: Final = 32 + 16


class KmsError(Exception):
    """A sealed value cannot be opened: another KEK, a corrupt value, or the wrong ``aad``."""


class LocalKms:
    """Envelope encryption under one local 32-byte KEK."""

    def __init__(self, kek: bytes) -> None:
        if len(kek) != 32:
            raise ValueError("the key-encryption key must be 32 bytes")
        self._kek = AESGCM(kek)
        self._kek_bytes = kek
        self._mac_keys: dict[bytes, bytes] = {}
        self.kek_id: Final = hashlib.sha256(kek).digest()[:_KEK_ID]

    def mac(self, purpose: bytes, data: bytes) -> bytes:
        """HMAC-SHA256 (32 bytes) of ``data`` under the key derived from the KEK for
        ``purpose`` (HKDF-SHA256 with ``purpose`` as its info): the same for the same inputs and
        KEK, and unrelated across purposes."""
        key = self._mac_keys.get(purpose)
        if key is None:
            key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                       info=b"authio mac:" + purpose).derive(self._kek_bytes)
            self._mac_keys[purpose] = key
        return hmac.digest(key, data, "sha256")

    def seal(self, plaintext: bytes, aad: bytes) -> bytes:
        """Encrypt ``plaintext`` under a fresh data key wrapped by the KEK."""
        dek = AESGCM.generate_key(bit_length=256)
        wrap_nonce, nonce = os.urandom(_NONCE), os.urandom(_NONCE)
        wrapped = self._kek.encrypt(wrap_nonce, dek, _VERSION + self.kek_id)
        body = AESGCM(dek).encrypt(nonce, plaintext, aad)
        return _VERSION + self.kek_id + wrap_nonce + wrapped + nonce + body

    def open(self, sealed: bytes, aad: bytes) -> bytes:
        """The plaintext of ``sealed``. Raises KmsError when it cannot be opened."""
        head = 1 + _KEK_ID
        if len(sealed) < head + _NONCE + _WRAPPED + _NONCE + 16 or sealed[:1] != _VERSION:
            raise KmsError("not a sealed value of this format")
        if sealed[1:head] != self.kek_id:
            raise KmsError("sealed under another key-encryption key (SERVICE_KMS_KEY changed?)")
        i = head
        wrap_nonce, i = sealed[i:i + _NONCE], i + _NONCE
        wrapped, i = sealed[i:i + _WRAPPED], i + _WRAPPED
        nonce, body = sealed[i:i + _NONCE], sealed[i + _NONCE:]
        try:
            dek = self._kek.decrypt(wrap_nonce, wrapped, _VERSION + self.kek_id)
            return AESGCM(dek).decrypt(nonce, body, aad)
        except InvalidTag:
            raise KmsError("the sealed value is corrupt or belongs elsewhere (aad)") from None
