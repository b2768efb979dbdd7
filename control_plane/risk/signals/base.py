"""What every signal takes and answers (the registry is the package: ``control_plane.risk.signals``).

The risk engine's signals are pure functions over a sign-in and the user's recent history.

Each module is one signal: its ``NAME`` (the key in a policy's ``signals``), ``DEFAULT_WEIGHT``
(its contribution when it fires, on the 0 to 100 score), ``DESCRIPTION``, and ``evaluate(attempt,
history, limits)``, which answers whether it fired and a reason a person can read. Nothing here
does I/O: :class:`Attempt` and :class:`History` carry what the service read (the request, the
GeoIP database, Redis, PostgreSQL), so every signal is tested from a table.

A signal that cannot judge (no GeoIP database, Redis out of reach, a user with no history of
that kind) does not fire and says why in its reason: the decision explains itself either way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Place:
    """Where an address is, by the GeoIP database: ISO 3166-1 ``country``, ``city`` name,
    ``latitude``/``longitude`` in degrees (None when the database has no location for it), and
    ``network``, the database's network holding the address (``"81.2.69.0/24"``)."""

    country: str | None
    city: str | None
    latitude: float | None
    longitude: float | None
    network: str | None


@dataclass(frozen=True, slots=True)
class Attempt:
    """One sign-in as the signals see it.

    * ``ip``: the client address (the peer, or ``X-Forwarded-For`` behind trusted proxies).
    * ``device``: the device fingerprint (User-Agent and client hints; None without either),
      ``device_label`` a readable name for it (``"Chrome on Mac OS X"``).
    * ``geo``: whether a GeoIP database is configured; ``place``: the address's place in it
      (None when not configured, not found, or no address).
    * ``at``: Unix seconds.
    * ``ip_attempts`` / ``destination_attempts``: sign-in attempts from this address / on this
      account in the velocity window, this one included (None: Redis out of reach).
    * ``blocked_network``: the configured known-bad network holding ``ip``, if any.
    """

    ip: str | None
    device: str | None
    device_label: str
    geo: bool
    place: Place | None
    at: float
    ip_attempts: int | None
    destination_attempts: int | None
    blocked_network: str | None


@dataclass(frozen=True, slots=True)
class LastSignIn:
    """The user's last successful sign-in with a known location (Unix seconds ``at``)."""

    latitude: float
    longitude: float
    at: float
    country: str | None
    city: str | None


@dataclass(frozen=True, slots=True)
class History:
    """What the user's earlier sign-ins left: for each kind (devices, networks, countries)
    whether any is known and whether this attempt's is among them; the ``last`` located
    sign-in; ``failed_attempts``, refused sign-ins in the failure window before this one."""

    devices_known: bool = False
    device_seen: bool = False
    networks_known: bool = False
    network_seen: bool = False
    countries_known: bool = False
    country_seen: bool = False
    last: LastSignIn | None = None
    failed_attempts: int = 0


@dataclass(frozen=True, slots=True)
class Limits:
    """The thresholds of the signals that count or measure (``SERVICE_RISK_*``): attempts per
    address and per account in the velocity window, refused attempts in the failure window, and
    the travel bound (km/h) with its distance floor (km)."""

    ip_attempts: int = 30
    destination_attempts: int = 10
    failed_attempts: int = 3
    window_seconds: int = 600
    failed_window_seconds: int = 900
    travel_max_kmh: float = 1000.0
    travel_min_km: float = 500.0


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a signal says: whether it ``fired`` and why (``reason``, for a person)."""

    fired: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Signal:
    """A signal's part in a decision: its ``name``, whether it ``fired``, its ``contribution``
    to the score (its weight when fired, else 0) and its ``reason``."""

    name: str
    fired: bool
    contribution: int
    reason: str


Evaluate = Callable[[Attempt, History, Limits], Outcome]

NO_GEO: Final = "not evaluated: no GeoIP database is configured (SERVICE_GEOIP_DATABASE)"


def geo_missing(attempt: Attempt) -> str | None:
    """Why a geo signal cannot judge ``attempt`` (no database, or the address is not in it),
    or None when it can."""
    if not attempt.geo:
        return NO_GEO
    if attempt.ip is None:
        return "not evaluated: no client address"
    if attempt.place is None:
        return "not evaluated: the address is not in the GeoIP database"
    return None


def plural(n: int, thing: str) -> str:
    """``n`` and ``thing``, plural unless one (``1 attempt``, ``3 attempts``)."""
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def span(seconds: int) -> str:
    """A window's length for a reason: ``10 min``, or ``90 s`` under two minutes."""
    return f"{seconds // 60} min" if seconds >= 120 else f"{seconds} s"


EARTH_RADIUS_KM: Final = 6371.0088
"""The mean Earth radius (IUGG), for great-circle distances."""


def distance_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """The great-circle distance between two points in degrees, in km (haversine)."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    a = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(a)))
