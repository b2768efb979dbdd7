"""A known-bad network: the client address is in one of ``SERVICE_RISK_BLOCKED_NETWORKS``
(CIDRs). Its default weight alone reaches the default block threshold.
"""

from __future__ import annotations

from typing import Final

from control_plane.risk.signals.base import Attempt, History, Limits, Outcome

NAME: Final = "blocked_network"
DEFAULT_WEIGHT: Final = 100
DESCRIPTION: Final = "The client address is in a network of SERVICE_RISK_BLOCKED_NETWORKS."


def evaluate(attempt: Attempt, history: History, limits: Limits) -> Outcome:
    if attempt.ip is None:
        return Outcome(False, "not evaluated: no client address")
    if attempt.blocked_network is not None:
        return Outcome(True, f"{attempt.ip} is in the blocked network {attempt.blocked_network}")
    return Outcome(False, "not in a blocked network")
