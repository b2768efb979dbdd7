"""TLS served by the services themselves (SPEC.md 1: TLS 1.2 or newer; docs/tls.md).

Given ``SERVICE_TLS_CERT_FILE`` and ``SERVICE_TLS_KEY_FILE`` (PEM: the certificate chain, leaf
first, and its private key; ``SERVICE_TLS_KEY_PASSWORD_FILE`` when the key is encrypted), every
listener of ``authio serve`` (the engine, each of its workers, the control plane, both in one)
speaks HTTPS only, with :func:`server_context`:

* TLS 1.2 and 1.3 (``minimum_version`` TLS 1.2; OpenSSL negotiates 1.3 when the client has it);
* for TLS 1.2 only ephemeral ECDHE key exchange with AES-GCM or ChaCha20-Poly1305
  (:data:`TLS12_CIPHERS`: forward secrecy, AEAD only; no CBC, no RSA key exchange, no SHA-1
  MACs), the server's order preferred; TLS 1.3's suites are OpenSSL's defaults, all AEAD;
* no compression (CRIME), no renegotiation (``OP_NO_RENEGOTIATION``), ALPN ``http/1.1``.

This follows Mozilla's "intermediate" server configuration (version 5.7), minus its DHE suites
(finite-field DH needs parameters of our own and is slower; every client of TLS 1.2 has ECDHE).

The responses then carry ``Strict-Transport-Security`` (:data:`HSTS`, RFC 6797): two years,
subdomains included. A plain-HTTP listener sends none: browsers ignore it there (RFC 6797 8.1),
and behind an ingress that terminates TLS the ingress sets it (ingress-nginx does by default).

:class:`ServerTls` holds the live context and reloads it on SIGHUP: the files are read again
into the same context, so handshakes from then on present the new certificate while the
connections already open keep theirs. A new pair that does not load (a missing file, a key
that is not the certificate's, a wrong passphrase) is logged at ERROR and the old one stays.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from typing import Final

__all__ = ["HSTS", "HSTS_HEADER", "TLS12_CIPHERS", "ServerTls", "server_context", "server_tls"]

log = logging.getLogger("authio.tls")

TLS12_CIPHERS: Final = "ECDHE+AESGCM:ECDHE+CHACHA20"
"""The OpenSSL cipher list for TLS 1.2 (TLS 1.3's suites are set apart by OpenSSL): ECDHE with
ECDSA or RSA certificates, AES-128/256-GCM or ChaCha20-Poly1305."""
HSTS_HEADER: Final = "Strict-Transport-Security"
HSTS: Final = "max-age=63072000; includeSubDomains"
"""Two years (63,072,000 s), the value HSTS preload lists ask for, without ``preload``: adding a
domain to browsers' built-in lists is the domain owner's decision, not this service's."""


def _password(password_file: str | None) -> bytes | Callable[[], bytes]:
    """The key's passphrase: the file's bytes without a trailing line break. Raises OSError.

    Without a file, a callable answering an empty passphrase: given None, OpenSSL asks for the
    passphrase of an encrypted key on the controlling terminal, and a service started from one
    (or under a test runner holding one) would wait there forever instead of failing at start."""
    if not password_file:
        return lambda: b""
    with open(password_file, "rb") as f:
        return f.read().rstrip(b"\r\n")


def _load(context: ssl.SSLContext, cert_file: str, key_file: str,
          password_file: str | None) -> None:
    """Read the certificate chain and key into ``context``. Raises OSError (ssl.SSLError is one:
    unreadable PEM, a key that does not match, a wrong passphrase)."""
    context.load_cert_chain(cert_file, key_file, password=_password(password_file))


def server_context(cert_file: str, key_file: str,
                   password_file: str | None = None) -> ssl.SSLContext:
    """A server context as the module docstring says, holding ``cert_file`` and ``key_file``.
    Raises OSError (ssl.SSLError included) when they cannot be loaded."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= (ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
                        | ssl.OP_CIPHER_SERVER_PREFERENCE)
    context.set_alpn_protocols(["http/1.1"])
    _load(context, cert_file, key_file, password_file)
    return context


class ServerTls:
    """A listener's TLS: the live :attr:`context` and the files it came from."""

    def __init__(self, cert_file: str, key_file: str, password_file: str | None = None) -> None:
        self.cert_file, self.key_file, self.password_file = cert_file, key_file, password_file
        self.context = server_context(cert_file, key_file, password_file)

    def reload(self) -> bool:
        """Read the files again into :attr:`context` (SIGHUP); True when the new pair is in use.

        The pair is first loaded into a context of its own: ``load_cert_chain`` replaces the
        certificate before it checks the key, so loading a bad pair straight into the live
        context could leave it with a certificate and no key. Only a pair that loads there is
        loaded into the live one."""
        try:
            server_context(self.cert_file, self.key_file, self.password_file)
            _load(self.context, self.cert_file, self.key_file, self.password_file)
        except OSError as exc:
            log.error("TLS reload: cannot load %s and %s (%s); still serving the previous "
                      "certificate", self.cert_file, self.key_file, exc)
            return False
        log.info("TLS reload: serving the certificate of %s", self.cert_file)
        return True


def server_tls(cert_file: str | None, key_file: str | None,
               password_file: str | None = None) -> ServerTls | None:
    """:class:`ServerTls` for the settings' files (``Settings.tls_cert_file`` and so on), or
    None when TLS is not configured. Raises OSError when they cannot be loaded."""
    if not cert_file or not key_file:
        return None
    return ServerTls(cert_file, key_file, password_file)
