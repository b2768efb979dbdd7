"""Envoy's HTTP ext_authz request shape, replayed exactly against a separately running engine.

This test stands in for Envoy, which is not installable on this machine (no Debian package).
It reads the documented configuration (``docs/edge/envoy.yaml``, shown in ``docs/edge.md``)
and sends what Envoy's ``envoy.filters.http.ext_authz`` filter sends to an ``http_service``
(Envoy's ``api/envoy/extensions/filters/http/ext_authz/v3/ext_authz.proto`` and the filter's
documentation, ``docs/root/configuration/http/http_filters/ext_authz_filter.rst``):

* the original request's method, and its path *with its query string* appended to
  ``path_prefix`` ("Sets a prefix to the value of authorization request header Path": a
  ``GET /api/docs?x=1`` is asked as ``GET /v1/edge/auth/api/docs?x=1``);
* the ``Host`` of the original request, and of its other headers only those matched by
  ``allowed_headers`` (here ``authorization`` and ``cookie``), plus the ones Envoy adds itself
  (``x-forwarded-for``, ``x-envoy-*``, ``x-request-id``) and ``authorization_request``'s
  ``headers_to_add`` ("client request of the same key will be overridden");
* never the body: ``Content-Length: 0`` whatever the method, POST, PUT and DELETE included.

Envoy lets the request through only on exactly 200, copying the ``allowed_upstream_headers`` of
the answer to the upstream request. Since the query string on the auth request is the client's,
the configured permission and pin travel in the headers Envoy adds, and every check and pin the
engine is given must hold (the query's too, DESIGN.md): a client adding
``?store_id=...&object=...&relation=...`` or ``?project_id=...`` can refuse its own request but
neither replace the configured check nor the pin.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest_asyncio
import yaml
from aiohttp import ClientSession

from common.settings import Settings
from tests.edge.helpers import DOC, IDENTITY_HEADERS, RELATION, Edge, edge
from tests.fixtures.proxies import EDGE_DOCS
from tests.fixtures.service import Api, bootstrap_project


def envoy_config(store_id: str) -> dict[str, Any]:
    """The ext_authz filter's ``typed_config`` of ``docs/edge/envoy.yaml``."""
    text = (EDGE_DOCS / "envoy.yaml").read_text().replace("{{STORE_ID}}", store_id)
    filters = {f["name"]: f["typed_config"] for f in yaml.safe_load(text)["http_filters"]}
    config: dict[str, Any] = filters["envoy.filters.http.ext_authz"]
    return config


class Envoy:
    """What Envoy's ext_authz HTTP client sends for one original request, per ``config``."""

    def __init__(self, http: ClientSession, engine: Api, config: dict[str, Any]) -> None:
        service = config["http_service"]
        self.http, self.engine = http, engine
        self.prefix: str = service["path_prefix"]
        self.allowed = {p["exact"] for p in config["allowed_headers"]["patterns"]}
        self.added = {h["key"]: h["value"]
                      for h in service.get("authorization_request", {}).get("headers_to_add", [])}
        self.upstream = {p["exact"] for p in
                         service["authorization_response"]["allowed_upstream_headers"]["patterns"]}

    async def check(self, method: str, path: str, headers: dict[str, str],
                    host: str = "app.example.com") -> tuple[int, dict[str, str]]:
        """``(status, the headers Envoy would copy to the upstream request)``."""
        sent = {k: v for k, v in headers.items() if k.lower() in self.allowed}
        sent.update({"Host": host, "Content-Length": "0", "x-forwarded-for": "203.0.113.7",
                     "x-forwarded-proto": "https", "x-request-id": secrets.token_hex(16),
                     "x-envoy-expected-rq-timeout-ms": "250", "x-envoy-internal": "true"})
        sent = {k: v for k, v in sent.items() if k not in self.added} | self.added
        async with self.http.request(method, self.engine.base_url + self.prefix + path,
                                     headers=sent, data=b"" if method != "GET" else None,
                                     skip_auto_headers=("Content-Type",)) as r:
            await r.read()
            return r.status, {k.lower(): v for k, v in r.headers.items()
                              if k.lower() in self.upstream}


@pytest_asyncio.fixture(scope="module")
async def setup(settings_factory: Callable[..., Settings], http: ClientSession,
                service: Api) -> AsyncIterator[Edge]:
    async with edge(http, settings_factory(), service) as found:
        yield found


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", "user-agent": "curl/8", "x-custom": "1"}


METHODS_AND_PATHS = [("GET", "/api/docs?x=1"), ("HEAD", "/"), ("POST", "/api/things"),
                     ("PUT", "/api/things/1?y=2"), ("PATCH", "/a/b/c"),
                     ("DELETE", "/api/things/1"), ("OPTIONS", "/api"),  # a CORS preflight
                     ("PROPFIND", "/dav/a"), ("TRACE", "/t")]  # Envoy asks with any method


async def test_allowed_is_exactly_200_with_the_identity(http: ClientSession,
                                                        setup: Edge) -> None:
    envoy = Envoy(http, setup.engine, envoy_config(setup.store_id))
    assert envoy.prefix == "/v1/edge/auth" and envoy.allowed == {"authorization", "cookie"}
    for method, path in METHODS_AND_PATHS:
        for creds in (bearer(setup.viewer.access_token),
                      {"cookie": f"theme=dark; service_session={setup.viewer.access_token}"}):
            status, copied = await envoy.check(method, path, creds)
            assert status == 200, (method, path, status)
            assert copied == {"service-user-id": setup.viewer.user_id,
                              "service-session-id": setup.viewer.session_id,
                              "service-project-id": setup.project.id}, (method, path)
    assert set(envoy.upstream) == {h.lower() for h in IDENTITY_HEADERS}


async def test_refused_is_401_or_403(http: ClientSession, setup: Edge) -> None:
    envoy = Envoy(http, setup.engine, envoy_config(setup.store_id))
    for method, path in METHODS_AND_PATHS:
        assert (await envoy.check(method, path, {}))[0] == 401, (method, path)
        assert (await envoy.check(method, path, bearer("x.y.z")))[0] == 401
        # Signed in, but not a viewer of the document the configuration names.
        assert (await envoy.check(method, path, bearer(setup.other.access_token)))[0] == 403
    # Without the permission entries (a session check alone), the other user passes.
    config = envoy_config(setup.store_id)
    del config["http_service"]["authorization_request"]
    alone = Envoy(http, setup.engine, config)
    assert (await alone.check("DELETE", "/api/x", bearer(setup.other.access_token)))[0] == 200
    assert (await alone.check("DELETE", "/api/x", {}))[0] == 401


async def test_the_client_query_can_only_refuse(http: ClientSession, setup: Edge) -> None:
    """The original query string arrives on the auth request: a check or pin named there is
    checked as well as Envoy's, never instead of it."""
    envoy = Envoy(http, setup.engine, envoy_config(setup.store_id))
    viewer, other = bearer(setup.viewer.access_token), bearer(setup.other.access_token)
    # The client cannot swap the configured check for one it passes...
    own = f"?store_id={setup.store_id}&object=doc:nothing&relation=viewer"
    wrote = await setup.project.api.post(f"/v1/stores/{setup.store_id}/write", {
        "writes": [{"object": "doc:mine", "relation": RELATION,
                    "user": f"user:{setup.other.user_id}"}]})
    assert wrote.status == 200
    for query in (own, f"?store_id={setup.store_id}&object=doc:mine&relation={RELATION}",
                  f"?object=doc:mine&relation={RELATION}"):
        assert (await envoy.check("GET", "/api/docs" + query, other))[0] == 403, query
    # ...and what it adds can only refuse its own request: an allowed user naming a check it
    # fails, a malformed one or another project is refused; naming one it passes changes nothing.
    for query in ("?store_id=42&object=shoe&relation=size", "?store_id=nope",
                  f"?store_id={setup.store_id}&object={DOC}&relation=owner",
                  "?project_id=proj_x"):
        assert (await envoy.check("GET", "/shop/search" + query, viewer))[0] == 403, query
    status, copied = await envoy.check(
        "GET", f"/shop?store_id={setup.store_id}&object={DOC}&relation={RELATION}", viewer)
    assert status == 200 and copied["service-user-id"] == setup.viewer.user_id
    config = envoy_config(setup.store_id)
    del config["http_service"]["authorization_request"]
    alone = Envoy(http, setup.engine, config)
    assert (await alone.check("GET", "/shop?store_id=1&object=a&relation=b", other))[0] == 403
    assert (await alone.check("GET", "/shop?q=1", other))[0] == 200


async def test_the_pin_comes_from_envoy_not_the_client(http: ClientSession,
                                                       setup: Edge) -> None:
    """An application pinned to one project (``Service-Project`` in ``headers_to_add``) refuses
    another project's token, whatever ``?project_id=`` the client adds (a pin there must hold
    too)."""
    other = await bootstrap_project(setup.control, "edge-other")
    config = envoy_config(setup.store_id)
    config["http_service"]["authorization_request"] = {
        "headers_to_add": [{"key": "Service-Project", "value": other.id}]}
    pinned = Envoy(http, setup.engine, config)
    token = bearer(setup.viewer.access_token)
    assert (await pinned.check("GET", "/api", token))[0] == 401
    assert (await pinned.check("GET", f"/api?project_id={setup.project.id}", token))[0] == 401
    config["http_service"]["authorization_request"]["headers_to_add"][0]["value"] = \
        setup.project.id
    envoy = Envoy(http, setup.engine, config)
    assert (await envoy.check("GET", f"/api?project_id={other.id}", token))[0] == 401
    assert (await envoy.check("GET", f"/api?project_id={setup.project.id}", token))[0] == 200
