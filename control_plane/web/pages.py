"""HTML pages the service serves itself (the magic-link landing page, the operator console): no
cache, no referrer, and a Content-Security-Policy that lets only the page's own inline script and
style run."""

from __future__ import annotations

import secrets
from collections.abc import Callable

from aiohttp import web


def page(render: Callable[[str], str], *, forms: bool = False) -> web.Response:
    """The response of the page ``render(nonce)`` returns, where ``nonce`` (fresh each time)
    must be the ``nonce`` attribute of its ``<script>`` and ``<style>`` elements. With
    ``forms``, its forms may submit to this origin (a filter form); otherwise to nowhere."""
    nonce = secrets.token_urlsafe(16)
    form_action = "'self'" if forms else "'none'"
    return web.Response(
        text=render(nonce), content_type="text/html",
        headers={
            "Cache-Control": "no-store",
            "Referrer-Policy": "no-referrer",  # the URL may hold a token
            "Content-Security-Policy": (
                f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
                f"connect-src 'self'; base-uri 'none'; form-action {form_action}; "
                "frame-ancestors 'none'"
            ),
            "X-Content-Type-Options": "nosniff",
        },
    )
