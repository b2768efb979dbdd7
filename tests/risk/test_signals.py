"""The risk engine's signals, each from a table: when it fires, when it does not, and when it
cannot judge (and says why). Signals are pure functions over an :class:`Attempt` and a
:class:`History`, so nothing here needs a database, Redis or a GeoIP file.

Every row starts from a familiar sign-in (``attempt()`` and ``history()``: a known device, network
and country in Berlin, one attempt counted, the last sign-in an hour earlier in the same place,
no refused sign-ins), which fires no signal, and states only what differs.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane.risk import signals
from control_plane.risk.signals import (
    blocked_network,
    destination_velocity,
    failed_attempts,
    impossible_travel,
    ip_velocity,
    new_country,
    new_device,
    new_network,
)
from control_plane.risk.signals.base import (
    EARTH_RADIUS_KM,
    NO_GEO,
    Attempt,
    History,
    LastSignIn,
    Limits,
    Outcome,
    Place,
    distance_km,
    geo_missing,
    span,
)

AT = 1_750_000_000.0
"""A fixed Unix time (2025-06-15) for the attempt; the history's times are relative to it."""
MINUTE, HOUR = 60.0, 3600.0

BERLIN = Place("DE", "Berlin", 52.52, 13.405, "81.2.69.0/24")
POTSDAM = Place("DE", "Potsdam", 52.39, 13.06, "81.2.70.0/24")
MUNICH = Place("DE", "Munich", 48.137, 11.575, "89.160.20.0/24")
PARIS = Place("FR", "Paris", 48.8566, 2.3522, "2.2.0.0/16")
SYDNEY = Place("AU", "Sydney", -33.87, 151.21, "1.128.0.0/11")

IP = "81.2.69.142"
LABEL = "Chrome on Mac OS X"
GEO_OFF = {"geo": False, "place": None}
"""No GeoIP database configured: no place for any address."""


def _km(a: Place, b: Place) -> float:
    assert a.latitude is not None and a.longitude is not None
    assert b.latitude is not None and b.longitude is not None
    return distance_km(a.latitude, a.longitude, b.latitude, b.longitude)


BERLIN_MUNICH_KM = _km(BERLIN, MUNICH)
"""About 504 km: just over the default 500 km floor of impossible travel."""
BERLIN_PARIS_KM = _km(BERLIN, PARIS)


def attempt(**changes: Any) -> Attempt:
    """A sign-in from Berlin on a known device, the first counted from its address and on the
    account; ``changes`` replace fields."""
    base = Attempt(ip=IP, device="fp-1", device_label=LABEL, geo=True, place=BERLIN, at=AT,
                   ip_attempts=1, destination_attempts=1, blocked_network=None)
    return replace(base, **changes)


def last_sign_in(place: Place, seconds_before: float) -> LastSignIn:
    """The last located sign-in: at ``place``, ``seconds_before`` the attempt."""
    assert place.latitude is not None and place.longitude is not None
    return LastSignIn(latitude=place.latitude, longitude=place.longitude, at=AT - seconds_before,
                      country=place.country, city=place.city)


def history(**changes: Any) -> History:
    """A returning user: the device, network and country are known, the last sign-in was in
    Berlin an hour ago, nothing was refused; ``changes`` replace fields."""
    base = History(devices_known=True, device_seen=True, networks_known=True, network_seen=True,
                   countries_known=True, country_seen=True, last=last_sign_in(BERLIN, HOUR),
                   failed_attempts=0)
    return replace(base, **changes)


def travel(origin: Place, seconds: float, to: Place, **history_changes: Any) -> dict[str, Any]:
    """The attempt at ``to``, ``seconds`` after the last sign-in at ``origin``."""
    return {"a": attempt(place=to), "h": history(last=last_sign_in(origin, seconds), **history_changes)}


def row(id: str, fired: bool, *texts: str, a: Attempt | None = None, h: History | None = None,
        limits: Limits | None = None) -> Any:
    """One case: the attempt, history and limits (defaults unless given), whether the signal
    fires, and text its reason must contain."""
    return pytest.param(a or attempt(), h or history(), limits or Limits(), fired, texts, id=id)


COLUMNS = ("a", "h", "limits", "fired", "texts")


def check(outcome: Outcome, fired: bool, texts: tuple[str, ...]) -> None:
    assert isinstance(outcome, Outcome)
    assert outcome.fired is fired, outcome.reason
    assert outcome.reason
    for text in texts:
        assert text in outcome.reason


# --- new_device ---------------------------------------------------------------------------------

NEW_DEVICE = [
    row("unseen-device-fires", True, f"new device: {LABEL}", h=history(device_seen=False)),
    row("unseen-device-label-in-reason", True, "new device: Firefox on Windows",
        a=attempt(device="fp-2", device_label="Firefox on Windows"), h=history(device_seen=False)),
    row("unseen-device-fires-without-geoip", True, f"new device: {LABEL}",
        a=attempt(**GEO_OFF), h=history(device_seen=False)),
    row("known-device", False, f"known device ({LABEL})"),
    row("first-device-nothing-to-compare", False, "no earlier device to compare with",
        h=history(devices_known=False, device_seen=False)),
    row("no-user-agent-or-hints", False, "not evaluated: no User-Agent or client hints",
        a=attempt(device=None), h=history(device_seen=False)),
    row("no-fingerprint-even-without-history", False, "not evaluated: no User-Agent",
        a=attempt(device=None), h=history(devices_known=False, device_seen=False)),
]


@pytest.mark.parametrize(COLUMNS, NEW_DEVICE)
def test_new_device(a: Attempt, h: History, limits: Limits, fired: bool, texts: tuple[str, ...]) -> None:
    check(new_device.evaluate(a, h, limits), fired, texts)


# --- new_network --------------------------------------------------------------------------------

NEW_NETWORK = [
    row("unseen-network-fires", True, "new network 81.2.69.0/24", h=history(network_seen=False)),
    row("unseen-network-sydney", True, "new network 1.128.0.0/11",
        a=attempt(ip="1.128.0.1", place=SYDNEY), h=history(network_seen=False)),
    row("known-network", False, "known network 81.2.69.0/24"),
    row("first-network-nothing-to-compare", False, "no earlier network to compare with",
        h=history(networks_known=False, network_seen=False)),
    row("no-geoip-database", False, NO_GEO, "SERVICE_GEOIP_DATABASE",
        a=attempt(**GEO_OFF), h=history(network_seen=False)),
    row("no-geoip-database-wins-over-place", False, NO_GEO,
        a=attempt(geo=False), h=history(network_seen=False)),
    row("address-not-in-database", False, "not evaluated: the address is not in the GeoIP database",
        a=attempt(place=None), h=history(network_seen=False)),
    row("database-names-no-network", False, "not evaluated: the GeoIP database names no network",
        a=attempt(place=replace(BERLIN, network=None)), h=history(network_seen=False)),
    row("no-client-address", False, "not evaluated",
        a=attempt(ip=None, place=None), h=history(network_seen=False)),
]


@pytest.mark.parametrize(COLUMNS, NEW_NETWORK)
def test_new_network(a: Attempt, h: History, limits: Limits, fired: bool, texts: tuple[str, ...]) -> None:
    check(new_network.evaluate(a, h, limits), fired, texts)


# --- new_country --------------------------------------------------------------------------------

NEW_COUNTRY = [
    row("unseen-country-fires", True, "new country AU", a=attempt(place=SYDNEY), h=history(country_seen=False)),
    row("unseen-country-own-code", True, "new country DE", h=history(country_seen=False)),
    row("known-country", False, "known country DE"),
    row("known-country-other-city", False, "known country DE", a=attempt(place=MUNICH)),
    row("first-country-nothing-to-compare", False, "no earlier country to compare with",
        a=attempt(place=SYDNEY), h=history(countries_known=False, country_seen=False)),
    row("no-geoip-database", False, NO_GEO, a=attempt(**GEO_OFF), h=history(country_seen=False)),
    row("address-not-in-database", False, "not evaluated: the address is not in the GeoIP database",
        a=attempt(place=None), h=history(country_seen=False)),
    row("database-names-no-country", False, "not evaluated: the GeoIP database names no country",
        a=attempt(place=replace(SYDNEY, country=None)), h=history(country_seen=False)),
    row("no-client-address", False, "not evaluated",
        a=attempt(ip=None, place=None), h=history(country_seen=False)),
]


@pytest.mark.parametrize(COLUMNS, NEW_COUNTRY)
def test_new_country(a: Attempt, h: History, limits: Limits, fired: bool, texts: tuple[str, ...]) -> None:
    check(new_country.evaluate(a, h, limits), fired, texts)


# --- impossible_travel --------------------------------------------------------------------------

UNNAMED_SYDNEY = Place(None, None, SYDNEY.latitude, SYDNEY.longitude, None)

IMPOSSIBLE_TRAVEL = [
    row("berlin-sydney-10-min-fires", True, "16,095 km in 10 min", "(Berlin, DE to Sydney, AU)",
        "faster than 1,000 km/h", **travel(BERLIN, 10 * MINUTE, SYDNEY)),
    row("berlin-sydney-30-h-possible", False, "16,095 km in 30.0 h", "(Berlin, DE to Sydney, AU): possible",
        **travel(BERLIN, 30 * HOUR, SYDNEY)),
    row("berlin-paris-1-h-possible", False, "877 km in 60 min (Berlin, DE to Paris, FR): possible",
        **travel(BERLIN, HOUR, PARIS)),
    row("same-place-minute-later", False, "0 km from the last sign-in (Berlin, DE to Berlin, DE)",
        **travel(BERLIN, MINUTE, BERLIN)),
    row("potsdam-berlin-same-second", False, "27 km from the last sign-in (Potsdam, DE to Berlin, DE)",
        **travel(POTSDAM, 0, BERLIN)),
    row("unnamed-place-in-route", True, "(Berlin, DE to an unnamed place)", "faster than",
        **travel(BERLIN, 10 * MINUTE, UNNAMED_SYDNEY)),
    row("country-only-place-in-route", True, "(Berlin, DE to AU)",
        **travel(BERLIN, 10 * MINUTE, replace(SYDNEY, city=None))),
    row("custom-speed-bound-in-reason", True, "877 km in 60 min", "faster than 500 km/h",
        limits=Limits(travel_max_kmh=500), **travel(BERLIN, HOUR, PARIS)),
    row("no-earlier-located-sign-in", False, "no earlier located sign-in",
        a=attempt(place=SYDNEY), h=history(last=None)),
    row("no-geoip-database", False, NO_GEO, a=attempt(**GEO_OFF), h=history(last=last_sign_in(SYDNEY, 0))),
    row("address-not-in-database", False, "not evaluated: the address is not in the GeoIP database",
        a=attempt(place=None), h=history(last=last_sign_in(SYDNEY, 0))),
    row("no-latitude", False, "not evaluated: the GeoIP database has no location for the address",
        a=attempt(place=replace(SYDNEY, latitude=None)), h=history(last=last_sign_in(BERLIN, 0))),
    row("no-longitude", False, "not evaluated: the GeoIP database has no location for the address",
        a=attempt(place=replace(SYDNEY, longitude=None)), h=history(last=last_sign_in(BERLIN, 0))),
    row("country-but-no-location", False, "has no location",
        a=attempt(place=Place("AU", None, None, None, "1.128.0.0/11")), h=history(last=last_sign_in(BERLIN, 0))),
    row("no-client-address", False, "not evaluated",
        a=attempt(ip=None, place=None), h=history(last=last_sign_in(SYDNEY, 0))),
]


@pytest.mark.parametrize(COLUMNS, IMPOSSIBLE_TRAVEL)
def test_impossible_travel(a: Attempt, h: History, limits: Limits, fired: bool, texts: tuple[str, ...]) -> None:
    check(impossible_travel.evaluate(a, h, limits), fired, texts)


def _seconds_at(km: float, kmh: float) -> float:
    """How long ``km`` takes at ``kmh``, in seconds."""
    return km / kmh * HOUR


IMPOSSIBLE_TRAVEL_BOUNDS = [
    # The distance floor: under it, never, even at infinite speed (the same second).
    row("under-floor-same-second-never", False, "504 km from the last sign-in (Munich, DE to Berlin, DE)",
        limits=Limits(travel_min_km=BERLIN_MUNICH_KM + 0.01), **travel(MUNICH, 0, BERLIN)),
    row("just-over-floor-same-second-fires", True, "504 km in 0 min", "faster than 1,000 km/h",
        limits=Limits(travel_min_km=BERLIN_MUNICH_KM - 0.01), **travel(MUNICH, 0, BERLIN)),
    row("munich-504-km-over-default-floor", True, "504 km in 0 min (Munich, DE to Berlin, DE)",
        **travel(MUNICH, 0, BERLIN)),
    row("potsdam-under-default-floor-same-second", False, "27 km from the last sign-in",
        **travel(POTSDAM, 0, BERLIN)),
    row("under-floor-paris-same-second", False, "877 km from the last sign-in",
        limits=Limits(travel_min_km=900), **travel(BERLIN, 0, PARIS)),
    # The speed bound: over the floor, just under it is possible, just over it is not.
    row("paris-just-under-max-speed", False, "(Berlin, DE to Paris, FR): possible",
        **travel(BERLIN, _seconds_at(BERLIN_PARIS_KM, 999.9), PARIS)),
    row("paris-just-over-max-speed", True, "(Berlin, DE to Paris, FR): faster than 1,000 km/h",
        **travel(BERLIN, _seconds_at(BERLIN_PARIS_KM, 1000.1), PARIS)),
    row("sydney-just-under-max-speed", False, "possible",
        **travel(BERLIN, _seconds_at(_km(BERLIN, SYDNEY), 999.9), SYDNEY)),
    row("sydney-just-over-max-speed", True, "faster than 1,000 km/h",
        **travel(BERLIN, _seconds_at(_km(BERLIN, SYDNEY), 1000.1), SYDNEY)),
    # No time at all over a long distance.
    row("sydney-zero-elapsed-fires", True, "16,095 km in 0 min", "faster than 1,000 km/h",
        **travel(BERLIN, 0, SYDNEY)),
    row("paris-zero-elapsed-fires", True, "877 km in 0 min", **travel(BERLIN, 0, PARIS)),
]


@pytest.mark.parametrize(COLUMNS, IMPOSSIBLE_TRAVEL_BOUNDS)
def test_impossible_travel_bounds(a: Attempt, h: History, limits: Limits, fired: bool,
                                  texts: tuple[str, ...]) -> None:
    check(impossible_travel.evaluate(a, h, limits), fired, texts)


latitudes = st.floats(-90, 90, allow_nan=False)
longitudes = st.floats(-180, 180, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(lat1=latitudes, lon1=longitudes, lat2=latitudes, lon2=longitudes,
       elapsed=st.floats(-1e6, 1e7, allow_nan=False), margin=st.floats(0.001, 20_000),
       max_kmh=st.floats(0.001, 1e6))
def test_impossible_travel_never_fires_under_the_floor(lat1: float, lon1: float, lat2: float, lon2: float,
                                                       elapsed: float, margin: float, max_kmh: float) -> None:
    km = distance_km(lat1, lon1, lat2, lon2)
    limits = Limits(travel_min_km=km + margin, travel_max_kmh=max_kmh)
    a = attempt(place=Place("XX", "Here", lat2, lon2, None))
    h = history(last=LastSignIn(lat1, lon1, AT - elapsed, "YY", "There"))
    outcome = impossible_travel.evaluate(a, h, limits)
    assert outcome.fired is False
    assert "from the last sign-in (There, YY to Here, XX)" in outcome.reason


# --- ip_velocity --------------------------------------------------------------------------------

IP_VELOCITY = [
    row("one-attempt", False, f"1 attempt from {IP} in 10 min"),
    row("at-limit-does-not-fire", False, f"30 attempts from {IP} in 10 min", a=attempt(ip_attempts=30)),
    row("over-limit-fires", True, f"31 attempts from {IP} in 10 min (more than 30)", a=attempt(ip_attempts=31)),
    row("far-over-limit-fires", True, "500 attempts from", "(more than 30)", a=attempt(ip_attempts=500)),
    row("custom-limit-at", False, "5 attempts from", "in 5 min",
        a=attempt(ip_attempts=5), limits=Limits(ip_attempts=5, window_seconds=300)),
    row("custom-limit-over", True, f"6 attempts from {IP} in 5 min (more than 5)",
        a=attempt(ip_attempts=6), limits=Limits(ip_attempts=5, window_seconds=300)),
    row("short-window-in-seconds", True, "in 90 s (more than 2)",
        a=attempt(ip_attempts=3), limits=Limits(ip_attempts=2, window_seconds=90)),
    row("ipv6-address-in-reason", True, "31 attempts from 2001:db8::1",
        a=attempt(ip="2001:db8::1", ip_attempts=31)),
    row("redis-out-of-reach", False, "not evaluated: the attempt counters (Redis) are out of reach",
        a=attempt(ip_attempts=None)),
    row("no-client-address", False, "not evaluated: no client address", a=attempt(ip=None, ip_attempts=31)),
    row("no-client-address-nor-redis", False, "not evaluated: no client address",
        a=attempt(ip=None, ip_attempts=None)),
    row("fires-without-geoip", True, "(more than 30)", a=attempt(ip_attempts=31, **GEO_OFF)),
]


@pytest.mark.parametrize(COLUMNS, IP_VELOCITY)
def test_ip_velocity(a: Attempt, h: History, limits: Limits, fired: bool, texts: tuple[str, ...]) -> None:
    check(ip_velocity.evaluate(a, h, limits), fired, texts)


# --- destination_velocity -----------------------------------------------------------------------

DESTINATION_VELOCITY = [
    row("one-attempt", False, "1 attempt on this account in 10 min"),
    row("at-limit-does-not-fire", False, "10 attempts on this account in 10 min", a=attempt(destination_attempts=10)),
    row("over-limit-fires", True, "11 attempts on this account in 10 min (more than 10)",
        a=attempt(destination_attempts=11)),
    row("custom-limit-at", False, "3 attempts on this account in 90 s",
        a=attempt(destination_attempts=3), limits=Limits(destination_attempts=3, window_seconds=90)),
    row("custom-limit-over", True, "4 attempts on this account in 90 s (more than 3)",
        a=attempt(destination_attempts=4), limits=Limits(destination_attempts=3, window_seconds=90)),
    row("redis-out-of-reach", False, "not evaluated: the attempt counters (Redis) are out of reach",
        a=attempt(destination_attempts=None)),
    row("no-client-address-still-counts", True, "11 attempts on this account",
        a=attempt(ip=None, destination_attempts=11)),
    row("ip-counter-does-not-matter", False, "1 attempt on this account", a=attempt(ip_attempts=1000)),
]


@pytest.mark.parametrize(COLUMNS, DESTINATION_VELOCITY)
def test_destination_velocity(a: Attempt, h: History, limits: Limits, fired: bool, texts: tuple[str, ...]) -> None:
    check(destination_velocity.evaluate(a, h, limits), fired, texts)


# --- failed_attempts ----------------------------------------------------------------------------

FAILED_ATTEMPTS = [
    row("no-refused-sign-ins", False, "0 refused sign-ins in the last 15 min"),
    row("under-limit", False, "2 refused sign-ins in the last 15 min", h=history(failed_attempts=2)),
    row("at-limit-fires", True, "3 refused sign-ins in the last 15 min (at least 3)", h=history(failed_attempts=3)),
    row("over-limit-fires", True, "7 refused sign-ins", "(at least 3)", h=history(failed_attempts=7)),
    row("custom-limit-one", True, "1 refused sign-in in the last 60 s (at least 1)",
        h=history(failed_attempts=1), limits=Limits(failed_attempts=1, failed_window_seconds=60)),
    row("custom-limit-under", False, "4 refused sign-ins in the last 30 min",
        h=history(failed_attempts=4), limits=Limits(failed_attempts=5, failed_window_seconds=1800)),
    row("velocity-window-is-not-failure-window", False, "in the last 15 min",
        limits=Limits(window_seconds=60)),
    row("fires-without-address-geoip-or-redis", True, "(at least 3)",
        a=attempt(ip=None, ip_attempts=None, destination_attempts=None, **GEO_OFF), h=history(failed_attempts=3)),
]


@pytest.mark.parametrize(COLUMNS, FAILED_ATTEMPTS)
def test_failed_attempts(a: Attempt, h: History, limits: Limits, fired: bool, texts: tuple[str, ...]) -> None:
    check(failed_attempts.evaluate(a, h, limits), fired, texts)


# --- blocked_network ----------------------------------------------------------------------------

BLOCKED_NETWORK = [
    row("in-blocked-network-fires", True, "198.51.100.7 is in the blocked network 198.51.100.0/24",
        a=attempt(ip="198.51.100.7", blocked_network="198.51.100.0/24")),
    row("ipv6-blocked-network-fires", True, "2001:db8::1 is in the blocked network 2001:db8::/32",
        a=attempt(ip="2001:db8::1", blocked_network="2001:db8::/32")),
    row("fires-without-geoip", True, "in the blocked network 198.51.100.0/24",
        a=attempt(ip="198.51.100.7", blocked_network="198.51.100.0/24", **GEO_OFF)),
    row("not-in-blocked-network", False, "not in a blocked network"),
    row("no-client-address", False, "not evaluated: no client address",
        a=attempt(ip=None, blocked_network="198.51.100.0/24")),
]


@pytest.mark.parametrize(COLUMNS, BLOCKED_NETWORK)
def test_blocked_network(a: Attempt, h: History, limits: Limits, fired: bool, texts: tuple[str, ...]) -> None:
    check(blocked_network.evaluate(a, h, limits), fired, texts)


# --- every signal -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", signals.NAMES)
def test_a_familiar_sign_in_fires_nothing(name: str) -> None:
    outcome = signals.EVALUATORS[name](attempt(), history(), Limits())
    assert outcome.fired is False, outcome.reason
    assert outcome.reason


GEO_SIGNALS = ("new_network", "new_country", "impossible_travel")

attempts = st.builds(
    Attempt, ip=st.sampled_from([None, IP, "2001:db8::1"]), device=st.sampled_from([None, "fp-1"]),
    device_label=st.just(LABEL), geo=st.booleans(),
    place=st.sampled_from([None, BERLIN, SYDNEY, replace(PARIS, network=None, country=None)]),
    at=st.floats(0, 2e9), ip_attempts=st.none() | st.integers(0, 100),
    destination_attempts=st.none() | st.integers(0, 100),
    blocked_network=st.sampled_from([None, "198.51.100.0/24"]))
histories = st.builds(
    History, devices_known=st.booleans(), device_seen=st.booleans(), networks_known=st.booleans(),
    network_seen=st.booleans(), countries_known=st.booleans(), country_seen=st.booleans(),
    last=st.sampled_from([None, last_sign_in(BERLIN, HOUR), last_sign_in(SYDNEY, 0)]),
    failed_attempts=st.integers(0, 10))


@settings(max_examples=300, deadline=None)
@given(a=attempts, h=histories)
def test_every_signal_explains_itself_and_cannot_judge_without_firing(a: Attempt, h: History) -> None:
    for name, evaluate in signals.EVALUATORS.items():
        outcome = evaluate(a, h, Limits())
        assert isinstance(outcome.fired, bool)
        assert outcome.reason.strip(), name
        if outcome.reason.startswith("not evaluated"):
            assert outcome.fired is False, (name, outcome.reason)
        if name in GEO_SIGNALS and (why := geo_missing(a)) is not None:
            assert outcome == Outcome(False, why), name


@settings(max_examples=300, deadline=None)
@given(count=st.integers(0, 1000), limit=st.integers(0, 1000))
def test_count_thresholds(count: int, limit: int) -> None:
    limits = Limits(ip_attempts=limit, destination_attempts=limit, failed_attempts=limit)
    a = attempt(ip_attempts=count, destination_attempts=count)
    assert ip_velocity.evaluate(a, history(), limits).fired is (count > limit)
    assert destination_velocity.evaluate(a, history(), limits).fired is (count > limit)
    assert failed_attempts.evaluate(attempt(), history(failed_attempts=count), limits).fired is (count >= limit)


# --- helpers of base ----------------------------------------------------------------------------

DISTANCES = [
    pytest.param(BERLIN, SYDNEY, 16_090.0, 0.01, id="berlin-sydney-16090-km"),
    pytest.param(BERLIN, PARIS, 878.0, 0.01, id="berlin-paris-878-km"),
    pytest.param(BERLIN, POTSDAM, 27.5, 0.02, id="berlin-potsdam-27-km"),
    pytest.param(BERLIN, MUNICH, 504.0, 0.01, id="berlin-munich-504-km"),
]


@pytest.mark.parametrize(("a", "b", "km", "tolerance"), DISTANCES)
def test_distance_km(a: Place, b: Place, km: float, tolerance: float) -> None:
    assert _km(a, b) == pytest.approx(km, rel=tolerance)
    assert _km(b, a) == pytest.approx(km, rel=tolerance)


@pytest.mark.parametrize("place", [BERLIN, SYDNEY, PARIS, Place(None, None, 90.0, 0.0, None)],
                         ids=["berlin", "sydney", "paris", "north-pole"])
def test_distance_from_a_point_to_itself_is_zero(place: Place) -> None:
    assert _km(place, place) == 0.0


def test_distance_antipodes_is_half_the_circumference() -> None:
    assert distance_km(0.0, 0.0, 0.0, 180.0) == pytest.approx(math.pi * EARTH_RADIUS_KM)
    assert distance_km(90.0, 0.0, -90.0, 0.0) == pytest.approx(math.pi * EARTH_RADIUS_KM)


@settings(max_examples=500, deadline=None)
@given(lat1=latitudes, lon1=longitudes, lat2=latitudes, lon2=longitudes)
def test_distance_is_symmetric_and_bounded(lat1: float, lon1: float, lat2: float, lon2: float) -> None:
    there = distance_km(lat1, lon1, lat2, lon2)
    back = distance_km(lat2, lon2, lat1, lon1)
    assert there == pytest.approx(back, abs=1e-6)
    assert 0.0 <= there <= math.pi * EARTH_RADIUS_KM + 1e-6


@pytest.mark.parametrize(("seconds", "text"), [
    pytest.param(600, "10 min", id="600-s"),
    pytest.param(900, "15 min", id="900-s"),
    pytest.param(120, "2 min", id="120-s"),
    pytest.param(119, "119 s", id="119-s"),
    pytest.param(90, "90 s", id="90-s"),
])
def test_span(seconds: int, text: str) -> None:
    assert span(seconds) == text


@pytest.mark.parametrize(("a", "reason"), [
    pytest.param(attempt(), None, id="database-and-place"),
    pytest.param(attempt(**GEO_OFF), NO_GEO, id="no-database"),
    pytest.param(attempt(geo=False), NO_GEO, id="no-database-wins"),
    pytest.param(attempt(place=None), "not evaluated: the address is not in the GeoIP database", id="not-in-database"),
])
def test_geo_missing(a: Attempt, reason: str | None) -> None:
    assert geo_missing(a) == reason


# --- the registry -------------------------------------------------------------------------------

MODULES = [new_device, new_network, new_country, impossible_travel, ip_velocity, destination_velocity,
           failed_attempts, blocked_network]


def test_registry_names() -> None:
    assert len(signals.NAMES) == 8
    assert len(set(signals.NAMES)) == 8
    assert signals.NAMES == ("new_device", "new_network", "new_country", "impossible_travel", "ip_velocity",
                             "destination_velocity", "failed_attempts", "blocked_network")
    assert list(signals.SIGNALS) == MODULES
    for table in (signals.DEFAULT_WEIGHTS, signals.EVALUATORS, signals.DESCRIPTIONS):
        assert list(table) == list(signals.NAMES)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rpartition(".")[2])
def test_registry_entry(module: Any) -> None:
    name = module.__name__.rpartition(".")[2]
    assert module.NAME == name
    assert signals.EVALUATORS[name] is module.evaluate
    assert signals.DEFAULT_WEIGHTS[name] == module.DEFAULT_WEIGHT
    assert isinstance(module.DEFAULT_WEIGHT, int)
    assert 0 <= signals.DEFAULT_WEIGHTS[name] <= 100
    assert signals.DESCRIPTIONS[name] == module.DESCRIPTION
    assert signals.DESCRIPTIONS[name].strip()


def test_blocked_network_alone_reaches_100() -> None:
    assert signals.DEFAULT_WEIGHTS["blocked_network"] == 100
