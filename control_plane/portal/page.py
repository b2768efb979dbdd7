"""The admin portal's page (``GET /portal``), its refusal page, and the two files they load.

Server-rendered HTML, one script and one style sheet served by the service itself
(``static/portal.js``, ``static/portal.css``; no framework, no build step), so the
Content-Security-Policy allows scripts and styles from this origin only and no inline code at
all (``require-trusted-types-for 'script'`` also keeps the script from ever writing HTML as
text). The page holds no data and no secret: the script reads the portal's state from
``GET /v1/portal/state`` with the session cookie, so the same page serves a link just opened and
a reload.

Accessible: every field has a label; the focus order is the reading order (domain, its button,
then the record's fields and Verify; or Generate, then the token's fields); every control has a
visible 3px focus ring; text keeps a contrast of 7:1 or more; results are spoken by a polite
live region (``#status``); the refusal page is a plain document with a heading and the reason.
"""

from __future__ import annotations

import hashlib
import html
from dataclasses import dataclass
from importlib import resources
from typing import Final

from aiohttp import web

from common.errors import ServiceError


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str


def _asset(name: str, content_type: str) -> Asset:
    return Asset(resources.files("control_plane.portal").joinpath("static", name).read_bytes(),
                 content_type)


SCRIPT: Final = _asset("portal.js", "text/javascript")
STYLE: Final = _asset("portal.css", "text/css")
SCRIPT_PATH: Final = "/portal/static/portal.js"
STYLE_PATH: Final = "/portal/static/portal.css"
_VERSION: Final = hashlib.sha256(SCRIPT.body + STYLE.body).hexdigest()[:12]

CSP: Final = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
              "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; "
              "require-trusted-types-for 'script'")
PAGE_HEADERS: Final = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",  # the page's URL holds the setup token
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
}

_HEAD: Final = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>{{title}}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{STYLE_PATH}?v={_VERSION}">
{{script}}</head>
<body>
<header><p>Admin portal</p></header>
"""

PAGE: Final = _HEAD.format(
    title="Organization setup",
    script=f'<script src="{SCRIPT_PATH}?v={_VERSION}" defer></script>\n') + """<main id="main">
<h1 id="title">Organization setup</h1>
<p id="intro">Loading the setup of your organization…</p>
<div id="status" role="status" aria-live="polite"></div>

<section id="domain-section" aria-labelledby="domain-heading" hidden>
<h2 id="domain-heading">Verify a domain</h2>
<ol class="steps">
<li>Enter a domain your organization uses, such as <code>example.com</code>.</li>
<li>Publish the TXT record shown at your DNS provider.</li>
<li>Press Verify. A new record can take a few minutes to be seen.</li>
</ol>
<form id="domain-form" novalidate>
<label for="domain">Domain</label>
<input id="domain" name="domain" autocomplete="off" autocapitalize="none" spellcheck="false"
       required maxlength="253" aria-describedby="domain-hint">
<p class="hint" id="domain-hint">The domain alone: no https://, path or port.</p>
<div class="actions"><button id="add-domain" type="submit">Get the DNS record</button></div>
</form>
<div id="record" class="panel" hidden>
<h3 id="record-heading">Publish this TXT record</h3>
<label for="record-name">Name (host)</label>
<input id="record-name" readonly>
<label for="record-value">Value</label>
<input id="record-value" readonly>
<p class="hint">Some DNS providers add the domain to the name themselves: then enter only
<code id="record-label">_authio-verification</code>.</p>
<div class="actions"><button id="verify" type="button">Verify</button></div>
</div>
<h3 id="domains-heading">Domains of your organization</h3>
<ul id="domains" class="items" aria-labelledby="domains-heading"></ul>
<p id="no-domains" class="hint">None yet.</p>
</section>

<section id="scim-section" aria-labelledby="scim-heading" hidden>
<h2 id="scim-heading">Connect your directory (SCIM)</h2>
<ol class="steps">
<li>Generate a SCIM token.</li>
<li>In your identity provider's provisioning settings (Microsoft Entra ID, Okta, ...), enter
the base URL and the token as the bearer token.</li>
<li>Start provisioning: users and groups appear in the status below.</li>
</ol>
<div class="actions"><button id="mint" type="button">Generate a SCIM token</button></div>
<p class="hint" id="mint-hint">A new token replaces the previous one at once: a directory still
using the old one is refused until it is given the new one.</p>
<div id="scim-secret" class="panel" hidden>
<h3 id="secret-heading">Your SCIM connection</h3>
<label for="scim-base-url">SCIM base URL</label>
<input id="scim-base-url" readonly>
<label for="scim-token">Bearer token</label>
<input id="scim-token" readonly aria-describedby="token-warning">
<p class="warning" id="token-warning">Copy the token now: it is shown this once and cannot be
shown again.</p>
</div>
<h3>Sync status</h3>
<dl id="scim-status" class="facts"></dl>
<h3 id="changes-heading">Latest changes by your directory</h3>
<p id="no-changes" class="hint">None yet.</p>
<table id="changes" aria-labelledby="changes-heading" hidden>
<thead><tr><th scope="col">When</th><th scope="col">Change</th><th scope="col">Resource</th></tr></thead>
<tbody id="changes-body"></tbody>
</table>
</section>
</main>
</body></html>
"""

_REFUSAL: Final = _HEAD.format(title="{title}", script="") + """<main>
<h1>{title}</h1>
<p>{message}</p>
<p>Ask the application that sent you here for a new setup link.</p>
<p class="error-code">Error code: {code} (request {request_id})</p>
</main>
</body></html>
"""
_TITLES: Final = {
    "token_consumed": "This setup link was already used",
    "token_expired": "This setup link has expired",
    "token_invalid_or_expired": "This setup link is not valid",
}


def portal_page() -> web.Response:
    """The portal page."""
    return web.Response(text=PAGE, content_type="text/html", headers=PAGE_HEADERS)


def refusal_page(err: ServiceError, request_id: str) -> web.Response:
    """A link that cannot be opened, as a page for a browser: ``err``'s status, title, message
    and code."""
    title = _TITLES.get(err.code, "This setup link cannot be opened")
    text = _REFUSAL.format(title=html.escape(title), message=html.escape(err.message),
                           code=html.escape(err.code), request_id=html.escape(request_id))
    return web.Response(text=text, status=err.status, content_type="text/html",
                        headers=PAGE_HEADERS)


def asset_response(asset: Asset) -> web.Response:
    """``asset``, cached for a day: its URL in the page carries its version."""
    return web.Response(body=asset.body, content_type=asset.content_type, charset="utf-8",
                        headers={"Cache-Control": "public, max-age=86400",
                                 "X-Content-Type-Options": "nosniff"})


def prefers_html(request: web.Request) -> bool:
    """Whether the client prefers an HTML page to JSON (a browser navigating): ``text/html`` (or
    ``text/*``) is accepted with a higher quality than ``application/json`` (or
    ``application/*``); ``*/*`` counts for neither, so a client saying nothing gets JSON."""
    html_q = json_q = 0.0
    for part in request.headers.get("Accept", "").split(","):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        media = media.lower()
        if media in ("text/html", "text/*", "application/xhtml+xml"):
            html_q = max(html_q, q)
        elif media in ("application/json", "application/*"):
            json_q = max(json_q, q)
    return html_q > 0 and html_q > json_q
