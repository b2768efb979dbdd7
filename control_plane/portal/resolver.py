"""TXT lookups for domain verification, through dnspython's asyncio resolver.

The servers asked are ``SERVICE_DNS_RESOLVER``'s (``Settings.dns_nameservers``), else the
system's (``/etc/resolv.conf``). Nothing is cached: a verification looks again each time, so a
record published a moment ago is seen as soon as the server asked has it. A lookup that cannot
conclude (a timeout, every server failing) says so rather than calling the record missing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final, Literal

import dns.asyncresolver
import dns.exception
import dns.name
import dns.nameserver
import dns.rdatatype
import dns.resolver

log = logging.getLogger("authio.portal")

LIFETIME_SECONDS: Final = 5.0
"""How long one lookup may take in all (every server and retry)."""
MAX_RECORDS: Final = 20
"""The most TXT records of a name kept from one answer."""

Outcome = Literal["found", "missing", "failed"]


@dataclass(frozen=True, slots=True)
class TxtLookup:
    """What a lookup gave: ``found`` (``records``: each TXT record's strings joined, as RFC 7208
    3.3 joins an SPF record's), ``missing`` (no such name, or no TXT record at it) or ``failed``
    (no server answered in time, or every one refused: ``detail`` says which)."""

    outcome: Outcome
    records: tuple[str, ...] = ()
    detail: str = ""


class TxtResolver:
    """Asks ``nameservers`` (``(address, port)`` pairs; none: the system's resolver) for TXT
    records."""

    def __init__(self, nameservers: tuple[tuple[str, int], ...] = (), *,
                 lifetime: float = LIFETIME_SECONDS) -> None:
        self.lifetime = lifetime
        self.problem: str | None = None
        self.resolver: dns.asyncresolver.Resolver | None = None
        try:
            resolver = dns.asyncresolver.Resolver(configure=not nameservers)
        except dns.resolver.NoResolverConfiguration:
            self.problem = "this server has no DNS resolver configured (set SERVICE_DNS_RESOLVER)"
            log.warning("domain verification: %s", self.problem)
            return
        if nameservers:
            resolver.nameservers = [dns.nameserver.Do53Nameserver(address, port)
                                    for address, port in nameservers]
        self.resolver = resolver

    async def txt(self, name: str) -> TxtLookup:
        """The TXT records at ``name`` (an absolute name; a trailing dot is implied)."""
        if self.resolver is None:
            return TxtLookup("failed", detail=self.problem or "no resolver")
        try:
            answer = await self.resolver.resolve(
                dns.name.from_text(name), dns.rdatatype.TXT, search=False, lifetime=self.lifetime)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return TxtLookup("missing")
        except dns.resolver.LifetimeTimeout:
            return TxtLookup("failed", detail="the DNS lookup timed out")
        except dns.resolver.NoNameservers:
            return TxtLookup("failed", detail="every DNS server asked failed to answer")
        except dns.exception.DNSException as exc:
            log.info("domain verification: TXT lookup of %s failed: %r", name, exc)
            return TxtLookup("failed", detail="the DNS lookup failed")
        records = tuple(
            b"".join(rdata.strings).decode("utf-8", "replace")
            for rdata in list(answer)[:MAX_RECORDS])
        return TxtLookup("found", records) if records else TxtLookup("missing")
