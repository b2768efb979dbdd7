"""The risk engine's signals, one module each (the shapes they share: ``base``).

Each module is one signal: its ``NAME`` (the key in a policy's ``signals``), ``DEFAULT_WEIGHT``
(its contribution to the 0 to 100 score when it fires), ``DESCRIPTION``, and
``evaluate(attempt, history, limits)``, a pure function answering whether it fired and why.
"""

from __future__ import annotations

from types import ModuleType
from typing import Final

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
from control_plane.risk.signals.base import Evaluate

SIGNALS: Final[tuple[ModuleType, ...]] = (
    new_device, new_network, new_country, impossible_travel, ip_velocity, destination_velocity,
    failed_attempts, blocked_network)
"""Every signal, in the order decisions list them."""
NAMES: Final = tuple(str(m.NAME) for m in SIGNALS)
DEFAULT_WEIGHTS: Final = {str(m.NAME): int(m.DEFAULT_WEIGHT) for m in SIGNALS}
EVALUATORS: Final[dict[str, Evaluate]] = {str(m.NAME): m.evaluate for m in SIGNALS}
DESCRIPTIONS: Final = {str(m.NAME): str(m.DESCRIPTION) for m in SIGNALS}
