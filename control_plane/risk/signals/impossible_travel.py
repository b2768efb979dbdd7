"""Impossible travel: the distance from the last located successful sign-in, over the time
since, is faster than ``SERVICE_RISK_TRAVEL_MAX_KMH`` (1,000 km/h by default: faster than an
airliner), and at least ``SERVICE_RISK_TRAVEL_MIN_KM`` (500 km) away, so that the imprecision of
IP geolocation within a region never fires it. Not evaluated without a database, for an address
without a location, or for a user with no located sign-in.
"""

from __future__ import annotations

from typing import Final

from control_plane.risk.signals.base import (
    Attempt,
    History,
    Limits,
    Outcome,
    distance_km,
    geo_missing,
)

NAME: Final = "impossible_travel"
DEFAULT_WEIGHT: Final = 40
DESCRIPTION: Final = ("Faster than SERVICE_RISK_TRAVEL_MAX_KMH from the last sign-in's place, "
                      "at least SERVICE_RISK_TRAVEL_MIN_KM away.")


def _where(city: str | None, country: str | None) -> str:
    return ", ".join(part for part in (city, country) if part) or "an unnamed place"


def evaluate(attempt: Attempt, history: History, limits: Limits) -> Outcome:
    if (why := geo_missing(attempt)) is not None:
        return Outcome(False, why)
    place, last = attempt.place, history.last
    assert place is not None
    if place.latitude is None or place.longitude is None:
        return Outcome(False, "not evaluated: the GeoIP database has no location for the address")
    if last is None:
        return Outcome(False, "no earlier located sign-in")
    km = distance_km(last.latitude, last.longitude, place.latitude, place.longitude)
    hours = max(attempt.at - last.at, 0.0) / 3600
    route = f"{_where(last.city, last.country)} to {_where(place.city, place.country)}"
    if km < limits.travel_min_km:
        return Outcome(False, f"{km:,.0f} km from the last sign-in ({route})")
    speed = km / hours if hours > 0 else float("inf")
    took = f"{hours * 60:,.0f} min" if hours < 2 else f"{hours:,.1f} h"
    if speed <= limits.travel_max_kmh:
        return Outcome(False, f"{km:,.0f} km in {took} ({route}): possible")
    return Outcome(True, f"{km:,.0f} km in {took} ({route}): faster than "
                         f"{limits.travel_max_kmh:,.0f} km/h")
