"""The browser module (docs/browser.md): ``GET /v1/browser/authio.js``, an ES module wrapping the
public endpoints for a page on the application's own origin, and the helper it imports beside it,
``GET /v1/browser/simplewebauthn-browser.umd.min.js`` (``@simplewebauthn/browser``
:data:`SIMPLEWEBAUTHN_VERSION`, MIT, vendored from npm: ``static/`` holds its licence; the
service needs no npm at run time).

Both are public files any page may load (``Access-Control-Allow-Origin: *``, without
credentials: a module script is fetched in CORS mode). They read no cookie and name no project:
what the module calls answers CORS only to the origins the project allows
(``control_plane.tenancy.cors``).
"""

from __future__ import annotations

from importlib import resources
from typing import Final

from aiohttp import web

from common.routing import Reply, RouteTable
from control_plane.web import auth
from control_plane.web.actor import Call
from control_plane.web.endpoint import endpoint

SIMPLEWEBAUTHN_VERSION: Final = "13.2.2"
"""The vendored ``@simplewebauthn/browser`` (``npm pack @simplewebauthn/browser@13.2.2``, its
``dist/bundle/index.umd.min.js``; the tarball's sha512 integrity
``FNW1oLQpTJyqG5kkDg5ZsotvWgmBaC6jCHR7Ej0qUNep36Wl9tj2eZu7J5rP+uhXgHaLk+QQ3lqcw2vS5MX1IA==``)."""
MODULE_PATH: Final = "/v1/browser/authio.js"
HELPER_PATH: Final = "/v1/browser/simplewebauthn-browser.umd.min.js"

routes = RouteTable("browser", "The browser module: sign-in from a page on another origin.")


def _script(name: str) -> bytes:
    return resources.files("control_plane.web").joinpath("static", name).read_bytes()


MODULE: Final = _script("authio.js")
HELPER: Final = _script("simplewebauthn-browser.umd.min.js")
_HEADERS: Final = {
    "Cache-Control": "public, max-age=300",
    "X-Content-Type-Options": "nosniff",
    "Access-Control-Allow-Origin": "*",
    "Cross-Origin-Resource-Policy": "cross-origin",
}


def _served(script: bytes) -> web.Response:
    return web.Response(body=script, content_type="text/javascript", charset="utf-8",
                        headers=_HEADERS)


@endpoint(routes, "GET", MODULE_PATH, auth=auth.Anonymous(),
          replies=[Reply(200, "The browser module (an ES module).", content_type="text/javascript")])
async def get_browser_module(call: Call) -> web.Response:
    """The browser module: an ES module wrapping passkey and magic-link sign-in, refresh,
    sign-out and ``/v1/sessions/me`` for a page on another origin (docs/browser.md).

    ``import { createClient } from "<base>/v1/browser/authio.js"``; ``createClient({projectId})``.
    Any page may load it (``Access-Control-Allow-Origin: *``); its calls work from the origins
    the project allows only."""
    return _served(MODULE)


@endpoint(routes, "GET", HELPER_PATH, auth=auth.Anonymous(),
          replies=[Reply(200, "@simplewebauthn/browser 13.2.2 (MIT), its UMD bundle.",
                         content_type="text/javascript")])
async def get_browser_webauthn_helper(call: Call) -> web.Response:
    """The WebAuthn helper the browser module imports: ``@simplewebauthn/browser`` 13.2.2
    (MIT), vendored from npm (its UMD bundle, which sets ``globalThis.SimpleWebAuthnBrowser``)."""
    return _served(HELPER)
