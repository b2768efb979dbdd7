"""Edge validation's telemetry (issue 12): no audit per validation, OpenTelemetry counters of
validations by outcome and denials by reason, and the revocation lag, read here through the
SDK's in-memory reader on the process's meter provider (the instruments are the API's global
meter, as ``common.telemetry.setup_metrics`` serves them to a collector)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import ClientSession
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from common.settings import Settings
from tests.edge.helpers import two_apps
from tests.edge.test_edge_revocation import revoked
from tests.fixtures.identity import session_call
from tests.fixtures.service import Api, bootstrap_project

_reader: InMemoryMetricReader | None = None


@pytest.fixture
def reader() -> InMemoryMetricReader:
    """The process's meter provider, installed once (OpenTelemetry allows one per process)."""
    global _reader
    if _reader is None:
        _reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[_reader]))
    return _reader


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    found: list[Any] = []
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    found.extend(metric.data.data_points)
    return found


def counts(reader: InMemoryMetricReader, name: str, attribute: str) -> dict[str, int]:
    return {str(p.attributes[attribute]): int(p.value) for p in points(reader, name)}


def lag_count(reader: InMemoryMetricReader) -> tuple[int, float]:
    found = points(reader, "authio.edge.revocation_lag")
    return (found[0].count, found[0].max) if found else (0, 0.0)


def moved(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


async def test_counters_and_revocation_lag_move(reader: InMemoryMetricReader,
                                                settings_factory: Callable[..., Settings],
                                                http: ClientSession, service: Api) -> None:
    async with two_apps(http, settings_factory(), service) as pair:
        signed = await pair.sign_in()
        other = await bootstrap_project(pair.control, "metrics-other")
        outcomes = counts(reader, "authio.edge.validations", "outcome")
        reasons = counts(reader, "authio.edge.denials", "reason")
        lags = lag_count(reader)

        async def call(token: str | None, query: str = "") -> int:
            r = await session_call(pair.engine, "GET", f"/v1/edge/validate{query}", token)
            return r.status

        assert await call(signed.access_token) == 200
        assert await call(signed.access_token) == 200  # the cached path counts too
        assert await call(None) == 401
        assert await call("not.a.jwt") == 401
        assert await call(signed.access_token, f"?project_id={other.id}") == 401
        r = await session_call(pair.engine, "GET", "/v1/edge/auth", None)
        assert r.status == 401
        assert moved(outcomes, counts(reader, "authio.edge.validations", "outcome")) \
            == {"valid": 2, "denied": 4}
        assert moved(reasons, counts(reader, "authio.edge.denials", "reason")) \
            == {"no_session": 2, "signature": 1, "project": 1}

        revoked_at = time.time()
        r = await session_call(pair.control, "POST", "/v1/sessions/revoke", signed.access_token)
        assert r.status == 200, r.body
        while not revoked(await session_call(pair.engine, "GET", "/v1/edge/validate",
                                             signed.access_token)):
            assert time.time() - revoked_at < 5, "not refused within 5 s"
        count, worst = lag_count(reader)
        # At least this engine's (the suite's own service mirrors the same channel).
        assert count >= lags[0] + 1
        assert 0 <= worst < time.time() - revoked_at + 1
        assert counts(reader, "authio.edge.denials", "reason")["revoked"] \
            >= reasons.get("revoked", 0) + 1
