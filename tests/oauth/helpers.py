"""Driving an OAuth sign-in over HTTP as a browser would: the service's start, the provider's
redirects (followed by hand, cookies kept), the callback."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import orjson
from aiohttp import ClientSession

from tests.fixtures import conformance
from tests.fixtures.service import Api, Project, Response
from tests.oauth.peers import CLIENT_ID, CLIENT_SECRET, OidcPeer

APP_REDIRECT = "https://app.example.com/signed-in"


async def configure(project: Project, name: str, *, issuer: str | None = None,
                    client_id: str = CLIENT_ID, client_secret: str = CLIENT_SECRET,
                    redirect_uris: list[str] | None = None, **extra: Any) -> Response:
    body: dict[str, Any] = {"client_id": client_id, "client_secret": client_secret,
                            "redirect_uris": redirect_uris or [APP_REDIRECT], **extra}
    if issuer is not None:
        body["issuer"] = issuer
    return await project.api.request("PUT", f"/v1/oauth/providers/{name}", json=body)


async def fetch(browser: ClientSession, api: Api, path: str,
                headers: dict[str, str] | None = None) -> Response:
    """``GET`` a path of the service with the browser's cookies, redirects not followed, the
    answer held to the OpenAPI document."""
    async with browser.get(api.base_url + path, headers=headers or {}, allow_redirects=False) as r:
        raw = await r.read()
        problems = conformance.document().problems("GET", path, r.status, r.content_type,
                                                   r.headers, raw)
        assert not problems, "\n".join(problems)
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = None
        return Response(r.status, r.headers, body, raw)


async def start(browser: ClientSession, api: Api, project: Project, name: str,
                redirect_uri: str = APP_REDIRECT) -> Response:
    query = urlencode({"project_id": project.id, "redirect_uri": redirect_uri})
    return await fetch(browser, api, f"/v1/auth/oauth/{name}/start?{query}")


async def authorize(browser: ClientSession, url: str, *, account: str | None,
                    callback_prefix: str) -> str:
    """Follow the provider's redirects from the authorization ``url`` until one leads to the
    service's callback, logging ``account`` in when the provider asks (oidc-provider's
    interaction, ``?account=``); the callback's path and query."""
    for _ in range(10):
        if url.startswith(callback_prefix):
            parts = urlsplit(url)
            return f"{parts.path}?{parts.query}"
        if "/interaction/" in url:
            url += "?" + urlencode({"account": account or ""})
        async with browser.get(url, allow_redirects=False) as r:
            assert r.status in (302, 303), (r.status, await r.text())
            url = urljoin(url, r.headers["Location"])
    raise AssertionError("the provider never redirected to the callback")


async def sign_in(browser: ClientSession, api: Api, project: Project, name: str, *,
                  account: str | None, callback_prefix: str,
                  json: bool = True) -> tuple[Response, str]:
    """A whole sign-in: (the callback's answer, the callback's path and query)."""
    r = await start(browser, api, project, name)
    assert r.status == 302, (r.status, r.body)
    callback = await authorize(browser, r.headers["Location"], account=account,
                               callback_prefix=callback_prefix)
    answer = await fetch(browser, api, callback,
                         headers={"Accept": "application/json"} if json else None)
    return answer, callback


def state_of(url: str) -> str:
    return parse_qs(urlsplit(url).query)["state"][0]


def sets_cookie(r: Response) -> bool:
    return bool(r.headers.getall("Set-Cookie", []))


async def peer_account(peer: OidcPeer, email: str | None, verified: bool = True) -> str:
    return await peer.account(email=email, email_verified=verified)
