"""Failed attempts before this one: at least ``SERVICE_RISK_FAILED_ATTEMPTS`` refused sign-ins
of the user (a used or expired link, a passkey that did not verify) in the last
``SERVICE_RISK_FAILED_WINDOW_SECONDS``, as the audit log records them.
"""

from __future__ import annotations

from typing import Final

from control_plane.risk.signals.base import Attempt, History, Limits, Outcome, plural, span

NAME: Final = "failed_attempts"
DEFAULT_WEIGHT: Final = 30
DESCRIPTION: Final = ("At least SERVICE_RISK_FAILED_ATTEMPTS refused sign-ins of the user in the "
                      "failure window.")


def evaluate(attempt: Attempt, history: History, limits: Limits) -> Outcome:
    count = history.failed_attempts
    window = span(limits.failed_window_seconds)
    if count >= limits.failed_attempts:
        return Outcome(True, f"{plural(count, 'refused sign-in')} in the last {window} "
                             f"(at least {limits.failed_attempts})")
    return Outcome(False, f"{plural(count, 'refused sign-in')} in the last {window}")
