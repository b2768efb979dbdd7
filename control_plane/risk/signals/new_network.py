"""A network this user has not signed in from before: the GeoIP database's network holding the
address (``81.2.69.0/24``). Not evaluated without a database, for an address it does not hold,
or for a user with no known network.
"""

from __future__ import annotations

from typing import Final

from control_plane.risk.signals.base import Attempt, History, Limits, Outcome, geo_missing

NAME: Final = "new_network"
DEFAULT_WEIGHT: Final = 10
DESCRIPTION: Final = "A network (the GeoIP database's) the user has not signed in from."


def evaluate(attempt: Attempt, history: History, limits: Limits) -> Outcome:
    if (why := geo_missing(attempt)) is not None:
        return Outcome(False, why)
    assert attempt.place is not None
    if attempt.place.network is None:
        return Outcome(False, "not evaluated: the GeoIP database names no network")
    if not history.networks_known:
        return Outcome(False, "no earlier network to compare with")
    if history.network_seen:
        return Outcome(False, f"known network {attempt.place.network}")
    return Outcome(True, f"new network {attempt.place.network}")
