"""What the risk engine reads of a sign-in's request: the device fingerprint of its User-Agent and
client hints, and the place of its address in a MaxMind-format City database.

* :func:`device`: the browser, operating system and device families ``ua-parser`` finds in the
  User-Agent (uap-core's regexes, matched in Rust by ``ua-parser-rs``), and the client hints'
  platform and mobile flag (``Sec-CH-UA-Platform``, ``Sec-CH-UA-Mobile``, RFC 8942), without
  versions (a browser update is the same device), hashed to 16 bytes of hex, cached per
  User-Agent and hints (most sign-ins come from a few thousand).
* :class:`GeoIp`: lookups in the database of ``SERVICE_GEOIP_DATABASE`` (``maxminddb``, the
  file memory-mapped): country, city, location and the database's network holding the address.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
from dataclasses import dataclass
from typing import Any, Final

import maxminddb
from ua_parser import parse

from control_plane.risk.signals.base import Place

MAX_USER_AGENT: Final = 1024
"""Longer User-Agent strings are cut before parsing (none real is this long)."""
_UNKNOWN: Final = "Other"


@dataclass(frozen=True, slots=True)
class Device:
    """A device as the risk engine knows it: the ``fingerprint`` and a ``label`` for people."""

    fingerprint: str
    label: str


def device(user_agent: str | None, hints: dict[str, Any] | None = None) -> Device | None:
    """The device of a request's ``User-Agent`` and client ``hints`` (``platform``, ``mobile``:
    the raw header values), or None when it sent neither."""
    hints = hints or {}
    platform = str(hints.get("platform") or "").strip('" ')
    mobile = str(hints.get("mobile") or "").strip()
    if not user_agent and not platform:
        return None
    return _device((user_agent or "")[:MAX_USER_AGENT], platform, mobile)


@functools.lru_cache(maxsize=4096)
def _device(user_agent: str, platform: str, mobile: str) -> Device:
    """The device of a User-Agent and hints; cached (most sign-ins come from a few thousand)."""
    parsed = parse(user_agent)
    browser = parsed.user_agent.family if parsed.user_agent else _UNKNOWN
    system = parsed.os.family if parsed.os else _UNKNOWN
    kind = parsed.device.family if parsed.device else _UNKNOWN
    key = "\x1f".join((browser, system, kind, platform, mobile))
    fingerprint = hashlib.sha256(key.encode()).hexdigest()[:32]
    on = system if system != _UNKNOWN else (platform or "an unknown system")
    label = f"{browser if browser != _UNKNOWN else 'an unknown browser'} on {on}"
    if kind not in (_UNKNOWN, "Mac") and kind not in on:
        label += f" ({kind})"
    return Device(fingerprint, label)


def warm_up() -> None:
    """Load the User-Agent regexes (a quarter second) before the first sign-in needs them."""
    parse("Mozilla/5.0")


def address_of(ip: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``ip`` as an address, an IPv4-mapped IPv6 address as the IPv4 one it carries (the
    address an IPv4 client has on a dual-stack socket); None when it is not an address."""
    if not ip:
        return None
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class GeoIp:
    """A MaxMind-format City database, open for the life of the process (memory-mapped)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._reader = maxminddb.open_database(path, maxminddb.MODE_MMAP)

    def place(self, ip: str | None) -> Place | None:
        """The place of ``ip`` (an IPv4-mapped IPv6 address is looked up as IPv4), or None when
        the database does not hold it or ``ip`` is not an address."""
        address = address_of(ip)
        if address is None:
            return None
        try:
            record, prefix_len = self._reader.get_with_prefix_len(address)
        except ValueError:  # an IPv6 address in an IPv4-only database
            return None
        if not isinstance(record, dict):
            return None
        found: dict[str, Any] = dict(record)
        country: dict[str, Any] = found.get("country") or found.get("registered_country") or {}
        city = (found.get("city") or {}).get("names", {}).get("en")
        location: dict[str, Any] = found.get("location") or {}
        network = ipaddress.ip_network(f"{address}/{prefix_len}", strict=False)
        return Place(country=country.get("iso_code"), city=city,
                     latitude=location.get("latitude"), longitude=location.get("longitude"),
                     network=str(network))

    def close(self) -> None:
        self._reader.close()
