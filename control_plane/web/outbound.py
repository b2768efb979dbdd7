"""Requests to receivers that customers name (webhook endpoints, audit streams): which URLs and
addresses are allowed, and the HTTP client that keeps to it on every attempt (DESIGN.md
"webhooks"; OWASP SSRF prevention).

* :func:`url_problem`: an endpoint's URL must be absolute ``https`` with a host, no credentials
  and no fragment; unless ``SERVICE_WEBHOOK_ALLOW_PRIVATE_URLS=true`` (which also allows
  ``http``), a host written as an address, or ``localhost``, must be public.
* :func:`resolved_problem`: the same rule after DNS, for the create and update calls.
* :func:`client`: an ``aiohttp.ClientSession`` whose resolver drops every non-public address a
  name resolves to (and fails when none is left), with no DNS cache and no connection reuse, so
  each attempt resolves again: a name that resolved to a public address at create time and to
  127.0.0.1 later is refused then. Redirects are never followed (``post`` passes
  ``allow_redirects=False``), the environment's proxies are ignored, and at most
  :data:`MAX_BODY_BYTES` of an answer are read.

"Public" is :attr:`ipaddress.IPv4Address.is_global`: loopback, private (RFC 1918, ULA),
link-local (cloud metadata at 169.254.169.254), unspecified, shared (RFC 6598) and reserved
ranges are refused, and an IPv4-mapped IPv6 address is judged by its IPv4 address.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Annotated, Final
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from pydantic import StringConstraints, WithJsonSchema

URL_PATTERN: Final = "^https?://[!-\"$-~]+$"
"""Visible ASCII (a host in its IDNA form), no fragment."""
_URL_SCHEMA: Final = {
    "type": "string", "minLength": 1, "maxLength": 2048, "pattern": URL_PATTERN,
    "description": ("An absolute https URL whose host resolves to public addresses only "
                    "(SERVICE_WEBHOOK_ALLOW_PRIVATE_URLS=true also allows http and any address).")}
Url = Annotated[str, StringConstraints(min_length=1, max_length=2048, pattern=URL_PATTERN),
                WithJsonSchema(_URL_SCHEMA)]
"""A receiver's URL in a request body; what it may name is judged by :func:`url_problem`."""
MAX_BODY_BYTES: Final = 4096
"""The most of a receiver's answer that is read (it is only kept as a hint on failure)."""
USER_AGENT: Final = "authio-webhooks/1"
_LABEL: Final = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
"""One label of a host name (RFC 1123 section 2.1, lower case; ``_`` as DNS itself allows)."""
RESOLVE_TIMEOUT_SECONDS: Final = 2.0
"""How long the create and update calls wait for DNS before taking the name as unresolved."""


class UnsafeAddress(OSError):
    """A receiver's name resolved to no public address."""


def is_public(address: str) -> bool:
    """Whether ``address`` (an IP address) is public (see the module docstring)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def _is_host_name(host: str) -> bool:
    """Whether ``host`` (lower case) is a name DNS can carry: a resolver refuses any other with
    an error of its own (Python's IDNA codec raises UnicodeError for a label over 63)."""
    name = host.removesuffix(".")
    return 0 < len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split("."))


def url_problem(url: str, *, allow_private: bool) -> str | None:
    """Why ``url`` cannot be a receiver's URL as written, or None."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError:
        return "must be a URL"
    if not parts.hostname or parts.fragment or "#" in url or parts.username or parts.password:
        return "must be an absolute URL with a host, and no fragment or credentials"
    if parts.scheme != "https" and not (allow_private and parts.scheme == "http"):
        return "must use https"
    host = parts.hostname.lower()
    if not _is_address(host) and not _is_host_name(host):
        return ("must name a valid host (at most 253 characters, labels of 1 to 63 letters, "
                "digits and hyphens)")
    if allow_private:
        return None
    if host == "localhost" or host.endswith(".localhost"):
        return "must not name this machine"
    if not _is_address(host):
        return None  # a name: judged once resolved
    return None if is_public(host) else f"must not be a non-public address ({host})"


async def resolved_problem(url: str, *, allow_private: bool) -> str | None:
    """:func:`url_problem`, then, for a name, whether any address it resolves to now is not
    public (a name that does not resolve yet, or not within :data:`RESOLVE_TIMEOUT_SECONDS`, is
allowed: its attempts fail until it does, and each attempt is judged again)."""
    problem = url_problem(url, allow_private=allow_private)
    if problem or allow_private:
        return problem
    host = urlsplit(url).hostname or ""
    resolver = DefaultResolver()
    try:
        async with asyncio.timeout(RESOLVE_TIMEOUT_SECONDS):
            infos = await resolver.resolve(host, 0, socket.AF_UNSPEC)
    except (OSError, TimeoutError):
        return None
    finally:
        await resolver.close()
    bad = sorted({i["host"] for i in infos if not is_public(i["host"])})
    return f"must not resolve to a non-public address ({', '.join(bad)})" if bad else None


async def host_problem(host: str, *, allow_private: bool) -> str | None:
    """Why a destination's ``host`` (a name or an address, not a URL: a message broker's) cannot
    be sent to, or None: the rule of :func:`resolved_problem`."""
    return await resolved_problem(f"https://{host}/", allow_private=allow_private)


class PublicResolver(AbstractResolver):
    """The default resolver, keeping only public addresses; raises UnsafeAddress when none is
    left."""

    def __init__(self) -> None:
        self._inner = DefaultResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        infos = await self._inner.resolve(host, port, family)
        public = [i for i in infos if is_public(i["host"])]
        if not public:
            found = ", ".join(sorted({i["host"] for i in infos}))
            raise UnsafeAddress(f"{host} resolves to no public address ({found})")
        return public

    async def close(self) -> None:
        await self._inner.close()


def client(*, timeout_seconds: float, allow_private: bool) -> aiohttp.ClientSession:
    """The session deliveries go through (see the module docstring); close it when done."""
    connector = aiohttp.TCPConnector(
        resolver=None if allow_private else PublicResolver(), use_dns_cache=False,
        force_close=True, limit=100)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_seconds),
        trust_env=False, auto_decompress=False, headers={"User-Agent": USER_AGENT})


@dataclass(frozen=True, slots=True)
class Answer:
    """What a receiver did with one POST: its ``status`` (None: no answer), ``retry_after``
    (seconds, from a ``Retry-After`` header of delay-seconds or HTTP-date), ``error`` (None
    for a 2xx), and the time taken (ms)."""

    status: int | None
    retry_after: float | None
    error: str | None
    duration_ms: int


async def post(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str],
               *, allow_private: bool, timeout_seconds: float) -> Answer:
    """POST ``body`` to ``url`` once, under the rules above; never raises for what the receiver
    or the network did (the answer says)."""
    started = time.monotonic()

    def took() -> int:
        return int((time.monotonic() - started) * 1000)

    problem = url_problem(url, allow_private=allow_private)
    if problem:
        return Answer(None, None, f"refused: the URL {problem}", took())
    try:
        async with session.post(url, data=body, headers=headers, allow_redirects=False) as resp:
            hint = await resp.content.read(MAX_BODY_BYTES)
            retry_after = _retry_after(resp.headers.get("Retry-After"))
            if 200 <= resp.status < 300:
                return Answer(resp.status, None, None, took())
            text = hint[:200].decode(errors="replace").strip()
            return Answer(resp.status, retry_after,
                          f"HTTP {resp.status}" + (f": {text}" if text else ""), took())
    except TimeoutError:
        return Answer(None, None, f"no answer within {timeout_seconds:g} s", took())
    except aiohttp.ClientConnectorError as exc:
        cause = exc.os_error
        reason = f"refused: {cause}" if isinstance(cause, UnsafeAddress) else f"cannot connect: {cause}"
        return Answer(None, None, reason[:300], took())
    except (aiohttp.ClientError, OSError) as exc:
        return Answer(None, None, f"{type(exc).__name__}: {exc}"[:300], took())


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` (RFC 9110 10.2.3) in seconds: delay-seconds or an HTTP-date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
