"""The production ingress of ``deploy/nginx.conf`` (and the routing it includes,
``deploy/authio-routes.conf``) in front of a control plane and a separately running engine, with
Debian's nginx (installed by the tests when missing): checks and edge validation reach the
engine, everything else the control plane. Edge validation used to fall through to the control
plane, which answers it 404."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import ClientSession

from common.settings import Settings
from tests.edge.helpers import two_apps
from tests.fixtures.proxies import nginx_serving
from tests.fixtures.service import ROOT, Api, eventually, free_ports


async def test_the_ingress_routes_edge_validation_to_the_engine(
    settings_factory: Callable[..., Settings], http: ClientSession, service: Api,
    nginx_binary: str,
) -> None:
    async with two_apps(http, settings_factory(), service) as pair:
        port = free_ports(1)[0]
        site = (ROOT / "deploy" / "nginx.conf").read_text()
        for name, api in (("engine:8081", pair.engine), ("control-plane:8080", pair.control)):
            assert name in site
            site = site.replace(name, api.base_url.removeprefix("http://"))
        assert "listen 80;" in site
        site = site.replace("listen 80;", f"listen 127.0.0.1:{port};")
        # The routing is its own file, which `make run-split` includes too (devtools.split).
        include = "include authio-routes.conf;"
        assert include in site
        site = site.replace(include, f"include {ROOT / 'deploy' / 'authio-routes.conf'};")
        signed = await pair.sign_in()
        store = (await pair.project.api.post("/v1/stores", {"name": "ingress"})).body["id"]
        with nginx_serving(nginx_binary, site, port) as ingress:
            bearer = {"Authorization": f"Bearer {signed.access_token}"}
            key = {"Authorization": f"Bearer {pair.project.key}"}
            async with http.get(ingress.base_url + "/v1/edge/validate", headers=bearer) as r:
                assert r.status == 200, (r.status, await r.text())
                assert r.headers["Service-User-Id"] == signed.user_id
            async with http.get(ingress.base_url + "/v1/edge/auth/app/page",
                                headers=bearer) as r:
                assert r.status == 200, (r.status, await r.text())

            async def checked() -> bool:  # the engine answers checks (once it has the store)
                async with http.post(
                        f"{ingress.base_url}/v1/stores/{store}/check", headers=key,
                        json={"tuple_key": {"object": "doc:1", "relation": "viewer",
                                            "user": "user:x"}}) as r:
                    return r.status == 200 and (await r.json())["allowed"] is False

            await eventually(checked, within=10, what="a check through the ingress")
            async with http.get(ingress.base_url + "/v1/stores", headers=key) as r:
                assert r.status == 200  # the control plane's listing
