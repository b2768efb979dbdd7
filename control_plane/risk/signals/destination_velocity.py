"""Velocity per destination (the account signed in to): more than
``SERVICE_RISK_DESTINATION_ATTEMPTS`` sign-in attempts on the account in the velocity window
(Redis), this one included. Not evaluated while Redis is out of reach.
"""

from __future__ import annotations

from typing import Final

from control_plane.risk.signals.base import Attempt, History, Limits, Outcome, plural, span

NAME: Final = "destination_velocity"
DEFAULT_WEIGHT: Final = 35
DESCRIPTION: Final = ("More than SERVICE_RISK_DESTINATION_ATTEMPTS sign-in attempts on the account "
                      "in the velocity window.")


def evaluate(attempt: Attempt, history: History, limits: Limits) -> Outcome:
    count = attempt.destination_attempts
    if count is None:
        return Outcome(False, "not evaluated: the attempt counters (Redis) are out of reach")
    window = span(limits.window_seconds)
    if count > limits.destination_attempts:
        return Outcome(True, f"{plural(count, 'attempt')} on this account in {window} "
                             f"(more than {limits.destination_attempts})")
    return Outcome(False, f"{plural(count, 'attempt')} on this account in {window}")
