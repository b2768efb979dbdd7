"""What edge validation counts (issue 12: no audit per validation, counters instead), as
OpenTelemetry instruments of the API's global meter (``common.telemetry.setup_metrics`` installs
the SDK's provider; without it each record is the API's no-op proxy).

* ``authio.edge.validations`` (monotonic counter, ``{validation}``): every judged request, attribute
  ``outcome``: ``valid`` or ``denied``;
* ``authio.edge.denials`` (monotonic counter, ``{denial}``): the denied ones, attribute ``reason``:
  ``no_session``, ``signature``, ``expired``, ``project``, ``revoked`` (the 401 reasons),
  ``forbidden`` (a denied permission), or the error code of another refusal (``not_ready``,
  ``invalid_request``...);
* ``authio.edge.revocation_lag`` (histogram, ``s``): from a revocation's commit in the control
  plane (the time carried in the channel message, ``common.revocations.message``) to the moment
  the engine's mirror holds it; recorded for sessions first heard on the channel (clocks of two
  machines: skew adds to it).

When the server span is recorded, it carries ``authio.edge.outcome`` and
``authio.edge.reason`` too (the ``stdout`` exporter's view of the same facts).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation

from common.errors import InvalidSession, ServiceError
from common.telemetry import traces_requests

__all__ = ["denied", "revocation_lag", "valid"]

# The hot path only adds to plain integers; the SDK reads them when it collects (observable
# counters): an SDK Counter.add costs several microseconds a call (attribute hashing, view
# matching), which the cached-token path cannot afford.
_validations: Final = {"valid": 0, "denied": 0}
_denials: dict[str, int] = {}
_VALID: Final = {"outcome": "valid"}
_DENIED: Final = {"outcome": "denied"}


def _observe_validations(_options: CallbackOptions) -> Iterable[Observation]:
    return [Observation(_validations["valid"], _VALID),
            Observation(_validations["denied"], _DENIED)]


def _observe_denials(_options: CallbackOptions) -> Iterable[Observation]:
    return [Observation(n, {"reason": reason}) for reason, n in list(_denials.items())]


_meter = metrics.get_meter("authio.engine.edge")
_meter.create_observable_counter(
    "authio.edge.validations", callbacks=[_observe_validations], unit="{validation}",
    description="Edge validations judged, by outcome (valid, denied).")
_meter.create_observable_counter(
    "authio.edge.denials", callbacks=[_observe_denials], unit="{denial}",
    description="Edge validations denied, by reason.")
_lag = _meter.create_histogram(
    "authio.edge.revocation_lag", unit="s",
    description="From a session revocation's commit to the engine's mirror holding it.")


def valid() -> None:
    """Count one valid session (and allowed permission, when asked)."""
    _validations["valid"] += 1
    if traces_requests():
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute("authio.edge.outcome", "valid")


def denied(exc: ServiceError) -> None:
    """Count one denial; its reason from ``exc`` (``details.reason`` of ``invalid_session``,
    else the error code)."""
    reason = exc.code
    if isinstance(exc, InvalidSession):
        reason = str(exc.details.get("reason", reason))
    _validations["denied"] += 1
    _denials[reason] = _denials.get(reason, 0) + 1
    if traces_requests():
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attributes({"authio.edge.outcome": "denied", "authio.edge.reason": reason})


def revocation_lag(seconds: float) -> None:
    """Record one revocation's lag (s; a negative one, clock skew, counts as 0). Not a hot
    path: once per revocation heard."""
    _lag.record(max(seconds, 0.0))
