"""What the store registry holds and does, as OpenTelemetry instruments of the API's global meter
(``common.telemetry.setup_metrics`` installs the SDK's provider; without it they are the API's
no-op proxies). For sizing replicas and seeing on-demand mode work (docs/sharding.md).

* ``authio.engine.store_loads`` (monotonic counter, ``{load}``): loads of one store after start
  (a new store heard of, or a first check in on-demand mode), attribute ``outcome``: ``loaded``,
  ``missing`` (no such store) or ``failed`` (PostgreSQL could not be read); the start-up
  snapshot is not counted;
* ``authio.engine.store_drops`` (monotonic counter, ``{store}``): stores let go, attribute
  ``reason``: ``idle`` (on-demand mode) or ``deleted``;
* ``authio.engine.stores`` (gauge, ``{store}``) and ``authio.engine.tuples`` (gauge,
  ``{tuple}``): what the process's registries hold when the metrics are collected.

Counting is a dict update on events that each cost a query at least; the gauges are read only
at collection (O(stores) for the tuples). Not on the check path.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Final, Protocol

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

__all__ = ["dropped", "loaded", "watch"]

_loads: Final = {"loaded": 0, "missing": 0, "failed": 0}
_drops: Final = {"idle": 0, "deleted": 0}


class Holder(Protocol):
    """What the gauges read of a registry (``engine.registry.StoreRegistry``)."""

    def __len__(self) -> int: ...  # stores in memory
    def tuples(self) -> int: ...  # tuples in memory


_registries: weakref.WeakSet[Holder] = weakref.WeakSet()


def _observe_loads(_options: CallbackOptions) -> Iterable[Observation]:
    return [Observation(n, {"outcome": k}) for k, n in _loads.items()]


def _observe_drops(_options: CallbackOptions) -> Iterable[Observation]:
    return [Observation(n, {"reason": k}) for k, n in _drops.items()]


def _observe_stores(_options: CallbackOptions) -> Iterable[Observation]:
    return [Observation(sum(len(r) for r in list(_registries)))]


def _observe_tuples(_options: CallbackOptions) -> Iterable[Observation]:
    return [Observation(sum(r.tuples() for r in list(_registries)))]


_meter = metrics.get_meter("authio.engine.stores")
_meter.create_observable_counter(
    "authio.engine.store_loads", callbacks=[_observe_loads], unit="{load}",
    description="Loads of one store after start, by outcome (loaded, missing, failed).")
_meter.create_observable_counter(
    "authio.engine.store_drops", callbacks=[_observe_drops], unit="{store}",
    description="Stores dropped from memory, by reason (idle, deleted).")
_meter.create_observable_gauge(
    "authio.engine.stores", callbacks=[_observe_stores], unit="{store}",
    description="Stores in the engine's memory.")
_meter.create_observable_gauge(
    "authio.engine.tuples", callbacks=[_observe_tuples], unit="{tuple}",
    description="Tuples in the engine's memory, over every store.")


def watch(registry: Holder) -> None:
    """Count ``registry``'s stores and tuples in the gauges (held weakly)."""
    _registries.add(registry)


def loaded(outcome: str) -> None:
    """Count one store load ended with ``outcome`` (``loaded``, ``missing``, ``failed``)."""
    _loads[outcome] += 1


def dropped(reason: str) -> None:
    """Count one store dropped for ``reason`` (``idle``, ``deleted``)."""
    _drops[reason] += 1
