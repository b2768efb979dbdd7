"""Velocity per client address: more than ``SERVICE_RISK_IP_ATTEMPTS`` sign-in attempts from the
address in the last ``SERVICE_RISK_VELOCITY_WINDOW_SECONDS`` (a sliding window in Redis), this
one included. Not evaluated while Redis is out of reach or without an address.
"""

from __future__ import annotations

from typing import Final

from control_plane.risk.signals.base import Attempt, History, Limits, Outcome, plural, span

NAME: Final = "ip_velocity"
DEFAULT_WEIGHT: Final = 30
DESCRIPTION: Final = ("More than SERVICE_RISK_IP_ATTEMPTS sign-in attempts from the client address "
                      "in the velocity window.")


def evaluate(attempt: Attempt, history: History, limits: Limits) -> Outcome:
    if attempt.ip is None:
        return Outcome(False, "not evaluated: no client address")
    count = attempt.ip_attempts
    if count is None:
        return Outcome(False, "not evaluated: the attempt counters (Redis) are out of reach")
    window = span(limits.window_seconds)
    if count > limits.ip_attempts:
        return Outcome(True, f"{plural(count, 'attempt')} from {attempt.ip} in {window} "
                             f"(more than {limits.ip_attempts})")
    return Outcome(False, f"{plural(count, 'attempt')} from {attempt.ip} in {window}")
