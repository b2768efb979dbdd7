"""Outbound TLS verifies the peer's certificate, and a private CA is added the standard way:
``SSL_CERT_FILE`` (OpenSSL's default verify paths, read when a process builds its default
context) names a bundle (docs/tls.md).

Here the sender is the OAuth client: signing in with Google fetches the provider's OpenID
Connect discovery document from ``SERVICE_OAUTH_GOOGLE_ISSUER``, pointed at an https server of
this test whose certificate a ``trustme`` CA issued. The service runs as ``authio serve``
subprocesses, one not trusting that CA and one trusting it through ``SSL_CERT_FILE``. Webhook
deliveries (``tests/webhooks/test_tls.py``) and SMTP (``tests/messages/test_outbox.py``,
``starttls`` and ``tls``) are held to the same rule by their own tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlencode

import trustme
from aiohttp import ClientSession, web

from tests.fixtures.service import bootstrap_project, free_ports, serve_process
from tests.tls.helpers import HOST, issue, service_env

REDIRECT = "https://app.example/callback"


@contextlib.asynccontextmanager
async def discovery_server(ca: trustme.CA, directory: Path) -> AsyncIterator[tuple[str, list[str]]]:
    """An https OpenID provider's discovery document on a free port, with a certificate of
    ``ca``; yields its issuer URL and the paths it was asked for."""
    from common.tls import server_context

    files = issue(ca, directory)
    port = free_ports(1)[0]
    issuer = f"https://{HOST}:{port}"
    asked: list[str] = []

    async def document(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.json_response({
            "issuer": issuer, "authorization_endpoint": f"{issuer}/authorize",
            "token_endpoint": f"{issuer}/token", "jwks_uri": f"{issuer}/jwks",
            "response_types_supported": ["code"], "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"]})

    app = web.Application()
    app.router.add_get("/.well-known/openid-configuration", document)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, HOST, port,
                          ssl_context=server_context(str(files.cert), str(files.key))).start()
        yield issuer, asked
    finally:
        await runner.cleanup()


async def _start_sign_in(http: ClientSession, env: dict[str, str]) -> tuple[int, str, str]:
    """In a fresh ``authio serve all`` with ``env``: configure Google for a new project and
    start a sign-in; (status, Location or error code, the process's log)."""
    async with serve_process(http, env, "all") as served:
        project = await bootstrap_project(served.api, "tls-oauth")
        r = await project.api.request("PUT", "/v1/oauth/providers/google", json={
            "client_id": "client", "client_secret": "secret", "redirect_uris": [REDIRECT]})
        assert r.status == 201, r.body
        query = urlencode({"project_id": project.id, "redirect_uri": REDIRECT})
        async with http.get(f"{served.api.base_url}/v1/auth/oauth/google/start?{query}",
                            allow_redirects=False) as answer:
            body = await answer.json() if answer.status != 302 else None
            where = answer.headers.get("Location", "") if body is None else body["error"]["code"]
        deadline = time.monotonic() + 5  # the log line is on its way through the pipe
        while body is not None and "discovery failed" not in served.logs():
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        return answer.status, where, served.logs()


async def test_oauth_discovery_verifies_the_provider_certificate(
        http: ClientSession, tmp_path: Path, tls_database_url: str, redis_url: str,
        redis_prefix: str) -> None:
    """Not trusting the provider's CA, the service refuses its certificate: the sign-in cannot
    start (503) and the provider is never asked over HTTP. With ``SSL_CERT_FILE`` naming that
    CA, the document is fetched and the browser is sent to the provider's authorization
    endpoint."""
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    async with discovery_server(ca, tmp_path / "provider") as (issuer, asked):
        env = {**service_env(tls_database_url, redis_url, redis_prefix, None),
               "SERVICE_OAUTH_GOOGLE_ISSUER": issuer}

        status, code, logs = await _start_sign_in(http, env)
        assert (status, code) == (503, "service_unavailable"), (status, code, logs)
        assert "ClientConnectorCertificateError" in logs, logs
        assert asked == []

        status, location, logs = await _start_sign_in(http, {**env, "SSL_CERT_FILE": str(ca_file)})
        assert status == 302, (status, location, logs)
        assert location.startswith(f"{issuer}/authorize?"), location
        assert asked == ["/.well-known/openid-configuration"]
