"""Webhook delivery over real TLS, traced to a real collector.

The serving process (``authio serve control-plane``, a subprocess: OpenSSL reads ``SSL_CERT_FILE``
when aiohttp builds its default context at import, and the tracer provider is global to a
process) trusts one test certificate authority through ``SSL_CERT_FILE``, as an operator would
add a private one. One receiver is served over https with a certificate of that authority,
another with a certificate of an authority the process does not trust. Spans go by OTLP/HTTP to
the suite's collector (``tests.fixtures.peers.receiving``), which decodes the real protobuf
exports.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import ClientSession

from tests.fixtures.database import migrated_database
from tests.fixtures.identity import email
from tests.fixtures.peers import Span, receiving, self_signed_certificate
from tests.fixtures.service import bootstrap_project, serve_process
from tests.webhooks.helpers import deliveries, receiver, subprocess_env, subscribe


@pytest.fixture(scope="module")
def tls_database_url(database_url: str) -> Iterator[str]:
    """A database of this test's own: no in-process service (which trusts no test authority)
    delivers from it."""
    with migrated_database(database_url, "webhooks_tls") as url:
        yield url


def _certificate(directory: Path) -> tuple[Path, Path]:
    directory.mkdir()
    return self_signed_certificate(directory)


async def test_https_delivery_is_verified_and_traced(http: ClientSession, tls_database_url: str,
                                                     redis_url: str, redis_prefix: str,
                                                     tmp_path: Path) -> None:
    """A receiver whose certificate chains to a trusted authority gets the delivery, verified by
    the ``standardwebhooks`` library, with a ``traceparent`` of the delivery's trace; the
    collector gets a CLIENT span ``webhook.deliver`` carrying the endpoint's URL and the HTTP
    status (SPEC.md 1 rule 5). A receiver with an untrusted certificate gets nothing: the
    attempt fails with the certificate error, recorded on the delivery and on an ERROR span."""
    trusted = _certificate(tmp_path / "trusted")
    stranger = _certificate(tmp_path / "stranger")
    async with receiving() as collector, receiver(tls=trusted) as good, \
            receiver(tls=stranger) as bad:
        env = {**subprocess_env(tls_database_url, redis_url, redis_prefix),
               "OTEL_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": collector.base_url,
               "OTEL_SAMPLER_RATIO": "1.0", "SSL_CERT_FILE": str(trusted[0]),
               "SERVICE_WEBHOOK_RETRY_SCHEDULE": "600"}
        async with serve_process(http, env, "control-plane") as cp:
            project = await bootstrap_project(cp.api, "tls")
            ok = await subscribe(project.api, good, ["user.created"])
            ko = await subscribe(project.api, bad, ["user.created"])
            assert (await project.api.post("/v1/users", {"email": email()})).status == 201

            [got] = await good.wait_for(1)
            assert got.verified == {good.secrets[0]: True}
            version, trace_id, parent_id, flags = got.headers["traceparent"].split("-")
            assert version == "00" and int(flags, 16) & 1  # sampled

            def delivery_span(endpoint_id: str) -> Span:
                return next(s for s in collector.spans if s.name == "webhook.deliver"
                            and s.attributes.get("webhook.endpoint_id") == endpoint_id)

            await collector.wait_for(lambda s: s.name == "webhook.deliver", count=2)
            span = delivery_span(ok["id"])
            assert (span.kind, span.service, span.status) == ("CLIENT", "authio-control-plane", "UNSET")
            assert span.attributes["url.full"] == good.url and span.http_status == 200
            assert span.attributes["webhook.event_id"] == got.headers["webhook-id"]
            # The header names the delivery span's trace, and a span in it: the delivery span
            # itself, or the HTTP client's span under it.
            assert span.trace_id == trace_id
            await collector.wait_for(lambda s: s.span_id == parent_id)
            sent_by = next(s for s in collector.trace(trace_id) if s.span_id == parent_id)
            assert span.span_id in (sent_by.span_id, sent_by.parent_span_id)

            failed = delivery_span(ko["id"])
            assert failed.status == "ERROR" and failed.attributes["url.full"] == bad.url
            assert failed.http_status is None
            [delivery] = await deliveries(project.api, ko["id"], until=lambda d: bool(d and d[0]["attempts"]))
            [attempt] = delivery["attempts"]
            assert attempt["status_code"] is None
            assert "certificate verify failed" in attempt["error"], attempt
            assert delivery["status"] == "pending" and delivery["next_attempt_at"] is not None
            assert bad.received == []
