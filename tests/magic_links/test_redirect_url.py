"""Magic links that land on the application's own page (``redirect_url``, as Stytch's
``login_magic_link_url``): sign-in links and step-up links, allowed only on the project's
allowed origins (its ``cors_origins`` and ``webauthn.origins``), the token in the fragment.

The browser side (a page on another origin following such a link and redeeming it with the
module's ``magicLink.verify()``) is in tests/browser/test_module.py."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.fixtures.identity import email, link_in, send_link, token_of, verify
from tests.fixtures.peers import mailbox_messages
from tests.fixtures.service import Api, Project, Response, assert_invalid_field

APP = "https://app.example.com"


async def _allow(project: Project, *origins: str) -> None:
    r = await project.api.request("PATCH", "/v1/projects/me", json={"cors_origins": list(origins)})
    assert r.status == 200, r.body


async def _send(service: Api, project: Project, body: dict[str, Any]) -> Response:
    return await service.post(f"/v1/auth/magic-link/send?project_id={project.id}", body,
                              key=None)


def _app_link(text: str, page: str) -> str:
    """The link in a message that lands on ``page``."""
    m = re.search(re.escape(page) + r"#token=\S+", text)
    assert m, text
    return m.group(0)


async def test_a_sign_in_link_lands_on_the_applications_page(service: Api,
                                                             project: Project) -> None:
    await _allow(project, APP)
    address, page = email(), f"{APP}/auth/callback?next=%2Fdocs"
    r = await _send(service, project, {"destination": address,
                                                         "redirect_url": page})
    assert r.status == 200, r.body
    message = (await mailbox_messages(project.api, address))[0]
    link = _app_link(message["text"], page)
    parts = urlsplit(link)
    assert f"{parts.scheme}://{parts.netloc}{parts.path}?{parts.query}" == page  # kept whole
    assert "/v1/auth/magic-link/verify" not in message["text"]  # not this service's page
    token = token_of(link)
    signed_in = await verify(service, project, token)
    assert signed_in.status == 200, signed_in.body
    assert signed_in.body["user"]["email"] == address
    again = await verify(service, project, token)  # once, as any link
    assert again.status == 410 and again.body["error"]["code"] == "token_consumed", again.body


async def test_without_redirect_url_the_link_lands_on_this_services_page(
        service: Api, project: Project) -> None:
    await _allow(project, APP)
    address = email()
    assert (await send_link(service, project, address)).status == 200
    text = (await mailbox_messages(project.api, address))[0]["text"]
    link = link_in(text)
    assert urlsplit(link).path == "/v1/auth/magic-link/verify"
    assert parse_qs(urlsplit(link).query) == {"project_id": [project.id]}


async def test_a_relying_party_origin_is_allowed_too(service: Api, project: Project) -> None:
    await _allow(project)
    r = await project.api.request("PATCH", "/v1/projects/me", json={"webauthn": {
        "rp_id": "localhost", "rp_name": "Local", "origins": ["http://localhost:5173"]}})
    assert r.status == 200, r.body
    address = email()
    r = await _send(service, project, {
        "destination": address, "redirect_url": "http://localhost:5173/"})
    assert r.status == 200, r.body
    text = (await mailbox_messages(project.api, address))[0]["text"]
    assert token_of(_app_link(text, "http://localhost:5173/"))


@pytest.mark.parametrize(("redirect_url", "why"), [
    ("https://evil.example.com/callback", "its origin https://evil.example.com is not one of"),
    ("https://app.example.com.evil.net/", "its origin https://app.example.com.evil.net is not"),
    ("https://app.example.com:8443/", "its origin https://app.example.com:8443 is not one of"),
])
async def test_an_origin_the_project_does_not_allow_is_refused(
        service: Api, project: Project, redirect_url: str, why: str) -> None:
    """Else anyone could have the project's links land on a page of theirs and read the token.
    Nothing is sent."""
    await _allow(project, APP)
    address = email()
    r = await _send(service, project, {"destination": address, "redirect_url": redirect_url})
    assert_invalid_field(r, "redirect_url")
    assert why in str(r.body["error"]["details"]), r.body
    assert await mailbox_messages(project.api, address, count=0) == []


@pytest.mark.parametrize("redirect_url", [
    f"{APP}/callback#section",            # a fragment: the token goes there
    "http://app.example.com/callback",    # http on a host that is not loopback
    "/auth/callback",                     # not absolute
    "javascript:alert(1)//app.example.com",
    "https://user:pw@app.example.com/",   # user information
    f"{APP}/" + "a" * 2048,               # too long
    "",
])
async def test_a_redirect_url_of_the_wrong_shape_is_invalid_request(
        service: Api, project: Project, redirect_url: str) -> None:
    await _allow(project, APP)
    address = email()
    r = await _send(service, project, {"destination": address, "redirect_url": redirect_url})
    assert_invalid_field(r, "redirect_url")
    assert await mailbox_messages(project.api, address, count=0) == []


async def test_the_allowed_origins_are_read_as_they_are_now(service: Api,
                                                           project: Project) -> None:
    """An origin taken off the project's list is refused at the next send."""
    await _allow(project, APP)
    address = email()
    body: dict[str, Any] = {"destination": address, "redirect_url": f"{APP}/in"}
    assert (await _send(service, project, body)).status == 200
    await _allow(project)
    assert_invalid_field(await _send(service, project, body), "redirect_url")
