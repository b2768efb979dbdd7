"""The ingress routing of DESIGN.md ("Two services, one product"): ``/v1/stores/{id}/check``,
``/v1/stores/{id}/batch-check`` and ``/v1/edge/*`` to the engine, every other path to the
control plane, as each of our three routings sends it:

* ``deploy/kubernetes``'s ingress-nginx Ingresses, rendered by kustomize, with ingress-nginx's
  documented path matching (user guide, "Ingress Path Matching"): ``use-regex`` on any Ingress
  of a host makes every path of that host, across Ingresses, a case-insensitive regular
  expression anchored at its start (``location ~* "^PATH"``), written longest path first, and
  nginx takes the first regular expression that matches. The same locations are also run by real
  nginx (Debian's, installed when missing) in front of two stub upstreams, so nginx's PCRE, not
  Python's ``re``, has the last word.
* The Gateway API HTTPRoutes: precedence as ``HTTPRouteRule.matches`` defines it (Exact, then the
  longest PathPrefix, element-wise: ``/v1/edge`` matches ``/v1/edge`` and ``/v1/edge/...``), with
  RegularExpression matches (full matches) ranked each way implementations rank them, since the
  spec leaves it to them: above every PathPrefix (Envoy Gateway), below every PathPrefix (Istio),
  and among the prefixes by length. The routing must not depend on which.
* ``deploy/nginx.conf`` with the files it includes (``make run-split``'s routing): nginx's
  location selection (the longest prefix, then regular expressions in order, the first match
  winning; named locations skipped).

The paths are every path of ``docs/openapi.json`` with each parameter set to a sample id and to
the words the rules look for (``check``, ``batch-check``, ``tuples``, ``write``), so an id that
looks like a route's word does not fool them. The engine's share is also compared with the routes
the engine app really has (``engine.app.create_engine_app``), health checks aside.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from common.settings import Settings
from engine.app import create_engine_app
from tests.deploy.kustomize import one, render
from tests.fixtures.proxies import nginx_serving
from tests.fixtures.service import ROOT, free_ports

ENGINE, CONTROL_PLANE = "engine", "control-plane"
SERVICES = {"authio-engine": ENGINE, "authio-control-plane": CONTROL_PLANE,
            "authio_engine": ENGINE, "authio_control_plane": CONTROL_PLANE}
"""Kubernetes Services and nginx upstreams, by the service they reach."""
HOST = "auth.example.com"
DOCUMENT = json.loads((ROOT / "docs" / "openapi.json").read_text())
SAMPLE_IDS = ("st_01jdz3q7v8k2m4n6p8r0t2w4y6", "check", "batch-check", "tuples", "write")
HEALTH = {"/healthz", "/readyz"}


def expected(template: str) -> str:
    """DESIGN.md's rule for a path of the OpenAPI document."""
    if template in ("/v1/stores/{store_id}/check", "/v1/stores/{store_id}/batch-check") or \
            template.startswith("/v1/edge/"):
        return ENGINE
    return CONTROL_PLANE


def cases() -> list[tuple[str, str]]:
    """(concrete path, expected service) for every path of the document and sample id."""
    out = {}
    for template in DOCUMENT["paths"]:
        for sample in SAMPLE_IDS:
            out[re.sub(r"\{[^}]+\}", sample, template)] = expected(template)
    return sorted(out.items())


def test_the_rule_gives_the_engine_exactly_the_routes_it_serves() -> None:
    engine = create_engine_app(Settings.model_validate({}))
    served = {r.resource.canonical for r in engine.router.routes() if r.resource is not None}
    assert {t for t in DOCUMENT["paths"] if expected(t) == ENGINE} == served - HEALTH
    assert len(cases()) > len(DOCUMENT["paths"])


# --- ingress-nginx ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Location:
    """One location ingress-nginx writes for an Ingress path."""

    path: str
    service: str
    regex: bool  # the host is in regular expression mode

    def nginx(self) -> str:
        """The location's modifier and path, as ingress-nginx's template writes it."""
        return f'~* "^{self.path}"' if self.regex else self.path


def ingress_locations(objects: list[dict[str, Any]], host: str) -> list[Location]:
    """The locations of ``host``'s server block, in the order ingress-nginx writes them."""
    ingresses = [o for o in objects if o["kind"] == "Ingress"
                 and any(r.get("host") == host for r in o["spec"]["rules"])]
    regex = any(o["metadata"].get("annotations", {}).get(a) not in (None, "false")
                for o in ingresses for a in ("nginx.ingress.kubernetes.io/use-regex",
                                             "nginx.ingress.kubernetes.io/rewrite-target"))
    assert regex, "the engine's paths are regular expressions: use-regex must be on"
    given = [p for o in ingresses for r in o["spec"]["rules"] if r.get("host") == host
             for p in r["http"]["paths"]]
    # ingress-nginx refuses regular expressions in Prefix and Exact paths.
    assert {p["pathType"] for p in given} == {"ImplementationSpecific"}
    paths = [Location(p["path"], p["backend"]["service"]["name"], regex) for p in given]
    return sorted(paths, key=lambda loc: len(loc.path), reverse=True)  # stable, as theirs


def ingress_nginx_route(locations: list[Location], path: str) -> str | None:
    """The Service nginx sends ``path`` to: the first regular expression that matches."""
    for loc in locations:
        if re.match("^" + loc.path, path, re.IGNORECASE):
            return SERVICES[loc.service]
    return None


@pytest.fixture(scope="module")
def ingress_nginx(tmp_path_factory: pytest.TempPathFactory) -> list[Location]:
    return ingress_locations(render(tmp_path_factory.mktemp("ingress"), "ingress-nginx"), HOST)


def test_ingress_nginx_sends_each_path_to_its_service(ingress_nginx: list[Location]) -> None:
    wrong = [(path, want, got) for path, want in cases()
             if (got := ingress_nginx_route(ingress_nginx, path)) != want]
    assert not wrong, wrong


def test_the_ingress_nginx_model_can_fail(ingress_nginx: list[Location]) -> None:
    """Written in the Ingress's order rather than longest first, "/" would take everything."""
    unsorted = sorted(ingress_nginx, key=lambda loc: len(loc.path))
    assert ingress_nginx_route(unsorted, "/v1/stores/s/check") == CONTROL_PLANE


def test_the_engine_ingress_is_its_own_object(tmp_path: Path) -> None:
    """Engine sharding patches the engine's Ingress alone (an upstream-hash-by annotation)."""
    engine = one(render(tmp_path, "ingress-nginx"), "Ingress", "authio-engine")
    assert {p["backend"]["service"]["name"] for r in engine["spec"]["rules"]
            for p in r["http"]["paths"]} == {"authio-engine"}


@contextlib.contextmanager
def nginx_with_stubs(binary: str, server_body: str) -> Iterator[str]:
    """Real nginx serving ``server_body`` (locations proxying to the upstreams authio_engine and
    authio_control_plane) on a free port, each upstream a stub server of the same nginx that
    answers its own name. Yields the base URL."""
    port, engine, control = free_ports(3)
    site = (f"upstream authio_engine {{ server 127.0.0.1:{engine}; }}\n"
            f"upstream authio_control_plane {{ server 127.0.0.1:{control}; }}\n"
            f"server {{ listen 127.0.0.1:{engine}; location / {{ return 200 '{ENGINE}'; }} }}\n"
            f"server {{ listen 127.0.0.1:{control}; location / {{ return 200 '{CONTROL_PLANE}'; }} }}\n"
            f"server {{ listen 127.0.0.1:{port};\n{server_body}\n}}\n")
    with nginx_serving(binary, site, port) as proxy:
        yield proxy.base_url


def routed_by(base_url: str) -> Callable[[str], str]:
    """A function asking the nginx at ``base_url`` where a path goes (the stub's answer)."""
    netloc = base_url.removeprefix("http://")

    def ask(path: str) -> str:
        connection = http.client.HTTPConnection(netloc, timeout=10)
        try:
            connection.request("POST", path, body=b"{}")
            reply = connection.getresponse()
            return reply.read().decode()
        finally:
            connection.close()

    return ask


def test_real_nginx_routes_ingress_nginx_locations_alike(
        ingress_nginx: list[Location], nginx_binary: str) -> None:
    upstream = {"authio-engine": "authio_engine", "authio-control-plane": "authio_control_plane"}
    body = "\n".join(f"location {loc.nginx()} {{ proxy_pass http://{upstream[loc.service]}; }}"
                     for loc in ingress_nginx)
    with nginx_with_stubs(nginx_binary, body) as base_url:
        ask = routed_by(base_url)
        wrong = [(path, want, got) for path, want in cases() if (got := ask(path)) != want]
    assert not wrong, wrong


# --- the Gateway API --------------------------------------------------------------------------


@dataclass(frozen=True)
class Match:
    """One path match of an HTTPRoute rule, and where its rule sends a request."""

    kind: str  # Exact, PathPrefix, RegularExpression
    value: str
    service: str

    def matches(self, path: str) -> bool:
        if self.kind == "Exact":
            return path == self.value
        if self.kind == "PathPrefix":  # element-wise; a trailing "/" of the value is ignored
            prefix = self.value.rstrip("/")
            return path == prefix or path.startswith(prefix + "/") or prefix == ""
        assert self.kind == "RegularExpression", self.kind
        return re.fullmatch(self.value, path) is not None


REGEX_RANKS = {
    "above every PathPrefix (Envoy Gateway)": lambda m: (
        {"Exact": 3, "RegularExpression": 2, "PathPrefix": 1}[m.kind], len(m.value)),
    "below every PathPrefix (Istio)": lambda m: (
        {"Exact": 3, "PathPrefix": 2, "RegularExpression": 1}[m.kind], len(m.value)),
    "among the prefixes by length": lambda m: (
        {"Exact": 2, "PathPrefix": 1, "RegularExpression": 1}[m.kind], len(m.value)),
}
"""The rank of a match under each precedence of RegularExpression (highest wins; ties keep the
order of the routes and rules, which the spec resolves by age and name)."""


def gateway_matches(objects: list[dict[str, Any]], host: str, listener: str) -> list[Match]:
    """The path matches of the HTTPRoutes attached to ``listener`` of the Gateway for ``host``."""
    out = []
    for route in (o for o in objects if o["kind"] == "HTTPRoute"):
        spec = route["spec"]
        if host not in spec.get("hostnames", [host]) or not any(
                p.get("sectionName") == listener for p in spec["parentRefs"]):
            continue
        for rule in spec["rules"]:
            (backend,) = rule["backendRefs"]
            for m in rule.get("matches", [{"path": {"type": "PathPrefix", "value": "/"}}]):
                out.append(Match(m["path"]["type"], m["path"]["value"], backend["name"]))
    return out


def gateway_route(matches: list[Match], path: str, rank: Callable[[Match], Any]) -> str | None:
    """The Service of the highest-ranked match of ``path`` (None: the Gateway's 404)."""
    candidates = [m for m in matches if m.matches(path)]
    if not candidates:
        return None
    best = max(candidates, key=rank)  # max keeps the first of equals
    return SERVICES[best.service]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> list[Match]:
    objects = render(tmp_path_factory.mktemp("gateway"), "gateway-api")
    https = [x for x in one(objects, "Gateway", "authio")["spec"]["listeners"]
             if x["protocol"] == "HTTPS"]
    assert [x["hostname"] for x in https] == [HOST]
    return gateway_matches(objects, HOST, https[0]["name"])


@pytest.mark.parametrize("ranking", REGEX_RANKS)
def test_the_gateway_api_sends_each_path_to_its_service(gateway: list[Match], ranking: str
                                                        ) -> None:
    rank = REGEX_RANKS[ranking]
    wrong = [(path, want, got) for path, want in cases()
             if (got := gateway_route(gateway, path, rank)) != want]
    assert not wrong, wrong


def test_the_gateway_model_can_fail(gateway: list[Match]) -> None:
    """A control-plane catch-all PathPrefix "/" would take the checks wherever regular
    expressions rank below prefixes (Istio), which is why the route lists its prefixes."""
    with_catch_all = [*gateway, Match("PathPrefix", "/", "authio-control-plane")]
    assert gateway_route(with_catch_all, "/v1/stores/s/check",
                         REGEX_RANKS["below every PathPrefix (Istio)"]) == CONTROL_PLANE
    assert gateway_route(with_catch_all, "/v1/stores/s/check",
                         REGEX_RANKS["above every PathPrefix (Envoy Gateway)"]) == ENGINE


def test_the_gateway_redirects_plain_http(tmp_path: Path) -> None:
    objects = render(tmp_path, "gateway-api")
    redirect = one(objects, "HTTPRoute", "authio-https-redirect")
    assert [p["sectionName"] for p in redirect["spec"]["parentRefs"]] == ["http"]
    (rule,) = redirect["spec"]["rules"]
    assert rule["filters"] == [{"type": "RequestRedirect", "requestRedirect": {
        "scheme": "https", "statusCode": 301}}]


# --- deploy/nginx.conf ------------------------------------------------------------------------


def nginx_conf_locations() -> list[tuple[str, str, str]]:
    """(modifier, path, upstream) of each location of ``deploy/nginx.conf`` and the files it
    includes (``deploy/`` relative), in order; named locations left out."""
    deploy = ROOT / "deploy"
    text = (deploy / "nginx.conf").read_text()
    for _ in range(3):  # includes, as nginx reads them
        text = re.sub(r"^\s*include\s+(\S+);", lambda m: (deploy / m[1]).read_text(), text,
                      flags=re.MULTILINE)
    out = []
    for m in re.finditer(r"^\s*location\s+(?:(=|~\*|~|\^~)\s+)?(\S+)\s*\{(.*?)^\s*\}", text,
                         re.MULTILINE | re.DOTALL):
        if m[2].startswith("@"):
            continue
        upstream = re.search(r"proxy_pass\s+http://(\w+)", m[3])
        assert upstream is not None, m[0]
        out.append((m[1] or "", m[2], upstream[1]))
    return out


def nginx_route(locations: list[tuple[str, str, str]], path: str) -> str | None:
    """nginx's choice (ngx_http_core_module, "location"): an exact match; else the longest
    prefix, kept if it is ``^~``; else the first regular expression that matches; else that
    prefix."""
    exact = [u for mod, p, u in locations if mod == "=" and p == path]
    if exact:
        return SERVICES[exact[0]]
    prefixes = [(p, mod, u) for mod, p, u in locations if mod in ("", "^~") and path.startswith(p)]
    longest = max(prefixes, key=lambda x: len(x[0]), default=None)
    if longest is not None and longest[1] == "^~":
        return SERVICES[longest[2]]
    for mod, p, u in locations:
        if mod in ("~", "~*") and re.search(p, path, re.IGNORECASE if mod == "~*" else 0):
            return SERVICES[u]
    return SERVICES[longest[2]] if longest is not None else None


def test_deploy_nginx_conf_sends_each_path_to_its_service() -> None:
    locations = nginx_conf_locations()
    assert {u for _, _, u in locations} == {"authio_engine", "authio_control_plane"}
    wrong = [(path, want, got) for path, want in cases()
             if (got := nginx_route(locations, path)) != want]
    assert not wrong, wrong
