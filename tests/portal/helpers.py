"""Helpers of the portal tests: links made and opened over HTTP, and the portal's calls with the
session cookie sent by hand (the suite's client keeps no cookie of a 127.0.0.1 host)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fixtures.identity import make_org
from tests.fixtures.service import Api, Project, Response

COOKIE = "service_portal_session"
BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


def token_of(link: str) -> str:
    return parse_qs(urlsplit(link).query)["token"][0]


def page_path(link: str) -> str:
    """The link's path and query, to open it on the service under test."""
    parts = urlsplit(link)
    return f"{parts.path}?{parts.query}"


async def make_link(project: Project, org_id: str, intent: str = "domain_verification",
                    **body: Any) -> dict[str, Any]:
    r = await project.api.post("/v1/portal/links",
                               {"organization_id": org_id, "intent": intent, **body})
    assert r.status == 201, r.body
    return dict(r.body)


async def open_link(api: Api, link: str, *, accept: str | None = None) -> Response:
    """``GET`` the link's page (``accept``: the request's ``Accept``)."""
    headers = {"Accept": accept} if accept is not None else {}
    return await api.get(page_path(link), key=None, headers=headers)


def session_cookie(r: Response) -> str:
    """The portal session the answer set, checking the cookie's attributes."""
    cookies = SimpleCookie()
    for header in r.headers.getall("Set-Cookie", []):
        cookies.load(header)
    morsel = cookies[COOKIE]
    assert morsel["httponly"] is True and morsel["samesite"] == "Strict", morsel.OutputString()
    assert morsel["path"] == "/v1/portal", morsel.OutputString()
    return morsel.value


async def portal_call(api: Api, method: str, path: str, cookie: str | None, *,
                      json: Any = None, headers: dict[str, str] | None = None) -> Response:
    """A call of the portal's page: the session cookie, no API key."""
    hdrs = dict(headers or {})
    if cookie is not None:
        hdrs["Cookie"] = f"{COOKIE}={cookie}"
    return await api.request(method, path, json=json, headers=hdrs, key=None)


@dataclass
class Opened:
    """A link made for an organization and opened: its answer, and the portal session."""

    link: dict[str, Any]
    org: dict[str, Any]
    cookie: str


async def opened(api: Api, project: Project, intent: str = "domain_verification", *,
                 org: dict[str, Any] | None = None) -> Opened:
    org = org or await make_org(project, f"portal-{secrets.token_hex(4)}")
    link = await make_link(project, org["id"], intent)
    r = await open_link(api, link["link"])
    assert r.status == 200, r.raw[:500]
    return Opened(link, org, session_cookie(r))


def domain() -> str:
    """A new domain name, under the .test TLD (RFC 2606)."""
    return f"corp-{secrets.token_hex(4)}.example.test"
