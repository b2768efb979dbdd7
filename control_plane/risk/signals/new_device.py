"""A device this user has not signed in from before.

The fingerprint is the browser, operating system and device families of the User-Agent (parsed
by ``ua-parser``) and the client hints' platform and mobile flag, without versions: a browser
update is the same device. A user with no known device (a first sign-in, or none recorded yet)
has nothing to compare with: the signal does not fire.
"""

from __future__ import annotations

from typing import Final

from control_plane.risk.signals.base import Attempt, History, Limits, Outcome

NAME: Final = "new_device"
DEFAULT_WEIGHT: Final = 15
DESCRIPTION: Final = "A device (browser, OS and device families) the user has not signed in from."


def evaluate(attempt: Attempt, history: History, limits: Limits) -> Outcome:
    if attempt.device is None:
        return Outcome(False, "not evaluated: no User-Agent or client hints")
    if not history.devices_known:
        return Outcome(False, "no earlier device to compare with")
    if history.device_seen:
        return Outcome(False, f"known device ({attempt.device_label})")
    return Outcome(True, f"new device: {attempt.device_label}")
