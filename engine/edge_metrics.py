"""What edge validation counts (issue 12: no audit per validation, counters instead), as
OpenTelemetry instruments of the API's global meter (``common.telemetry.setup_metrics`` installs
the SDK's provider; without it each record is the API's no-op proxy).

* ``authio.edge.validations`` (counter, ``{validation}``): every judged request, attribute
  ``outcome``: ``valid`` or ``denied``;
* ``authio.edge.denials`` (counter, ``{denial}``): the denied ones, attribute ``reason``:
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

from typing import Final

from opentelemetry import metrics, trace

from common.errors import InvalidSession, ServiceError

__all__ = ["denied", "revocation_lag", "valid"]

_meter = metrics.get_meter("authio.engine.edge")
_validations = _meter.create_counter(
    "authio.edge.validations", unit="{validation}",
    description="Edge validations judged, by outcome (valid, denied).")
_denials = _meter.create_counter(
    "authio.edge.denials", unit="{denial}", description="Edge validations denied, by reason.")
_lag = _meter.create_histogram(
    "authio.edge.revocation_lag", unit="s",
    description="From a session revocation's commit to the engine's mirror holding it.")

_VALID: Final = {"outcome": "valid"}
_DENIED: Final = {"outcome": "denied"}
_REASONS: dict[str, dict[str, str]] = {}


def valid() -> None:
    """Count one valid session (and allowed permission, when asked)."""
    _validations.add(1, _VALID)
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute("authio.edge.outcome", "valid")


def denied(exc: ServiceError) -> None:
    """Count one denial; its reason from ``exc`` (``details.reason`` of ``invalid_session``,
    else the error code)."""
    reason = exc.code
    if isinstance(exc, InvalidSession):
        reason = str(exc.details.get("reason", reason))
    attributes = _REASONS.get(reason)
    if attributes is None:
        attributes = _REASONS.setdefault(reason, {"reason": reason})
    _validations.add(1, _DENIED)
    _denials.add(1, attributes)
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes({"authio.edge.outcome": "denied", "authio.edge.reason": reason})


def revocation_lag(seconds: float) -> None:
    """Record one revocation's lag (s; a negative one, clock skew, counts as 0)."""
    _lag.record(max(seconds, 0.0))
