"""Helpers for identity tests: sign a user in through the public magic-link flow, over HTTP."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.conftest import Api, Project, Response, mailbox_messages

_LINK_RE = re.compile(r"https?://\S+/v1/auth/magic-link/verify\?\S+#token=\S+")


def link_in(text: str) -> str:
    """The magic link inside a message body."""
    m = _LINK_RE.search(text)
    assert m, text
    return m.group(0)


def token_of(link: str) -> str:
    """The token of a magic link: in its fragment, never its query (no server sees it)."""
    parts = urlsplit(link)
    assert "token" not in parse_qs(parts.query), link
    return parse_qs(parts.fragment)["token"][0]


async def latest_link(project: Project, destination: str, *, count: int = 1,
                      also: Sequence[Api] = ()) -> str:
    """The link of the newest message to ``destination`` (waiting for ``count`` messages)."""
    messages = await mailbox_messages(project.api, destination, count=count, also=also)
    return link_in(messages[0]["text"])


async def send_link(api: Api, project: Project, destination: str, **kw: Any) -> Response:
    return await api.post(f"/v1/auth/magic-link/send?project_id={project.id}",
                          {"destination": destination}, key=None, **kw)


async def verify(api: Api, project: Project, token: str, **kw: Any) -> Response:
    return await api.post(f"/v1/auth/magic-link/verify?project_id={project.id}",
                          {"token": token}, key=None, **kw)


@dataclass
class SignedIn:
    body: dict[str, Any]
    response: Response

    @property
    def access_token(self) -> str:
        return str(self.body["access_token"])

    @property
    def refresh_token(self) -> str:
        return str(self.body["refresh_token"])

    @property
    def session_id(self) -> str:
        return str(self.body["session"]["id"])

    @property
    def user_id(self) -> str:
        return str(self.body["user"]["id"])


async def sign_in(project: Project, destination: str, *, api: Api | None = None,
                  count: int = 1) -> SignedIn:
    """Send a sign-in link to ``destination``, read it from the dev mailbox and redeem it
    (``count``: how many messages to that destination exist with this one)."""
    api = api or project.api
    r = await send_link(api, project, destination)
    assert r.status == 200, r.body
    link = await latest_link(project, destination, count=count,
                             also=[api] if api.base_url != project.api.base_url else [])
    r = await verify(api, project, token_of(link))
    assert r.status == 200, r.body
    return SignedIn(r.body, r)


async def session_call(api: Api, method: str, path: str, access_token: str | None,
                       json: Any = None) -> Response:
    headers = {"Authorization": f"Bearer {access_token}"} if access_token else {}
    return await api.request(method, path, json=json, headers=headers, key=None)
