"""A country this user has not signed in from before (ISO 3166-1 code from the GeoIP database).
Not evaluated without a database, for an address it does not place in a country, or for a user
with no known country.
"""

from __future__ import annotations

from typing import Final

from control_plane.risk.signals.base import Attempt, History, Limits, Outcome, geo_missing

NAME: Final = "new_country"
DEFAULT_WEIGHT: Final = 20
DESCRIPTION: Final = "A country the user has not signed in from."


def evaluate(attempt: Attempt, history: History, limits: Limits) -> Outcome:
    if (why := geo_missing(attempt)) is not None:
        return Outcome(False, why)
    assert attempt.place is not None
    country = attempt.place.country
    if country is None:
        return Outcome(False, "not evaluated: the GeoIP database names no country")
    if not history.countries_known:
        return Outcome(False, "no earlier country to compare with")
    if history.country_seen:
        return Outcome(False, f"known country {country}")
    return Outcome(True, f"new country {country}")
