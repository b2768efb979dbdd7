"""The session cookie (SPEC.md 2): ``service_session``, whose value is the access JWT itself."""

from __future__ import annotations

from aiohttp import web

from common.access_tokens import SESSION_COOKIE
from common.settings import Settings

__all__ = ["SESSION_COOKIE", "clear_session_cookie", "secure_cookies", "set_session_cookie"]



def set_session_cookie(response: web.StreamResponse, token: str, *, max_age: int,
                       settings: Settings) -> None:
    """Set ``service_session`` to the access ``token``: HttpOnly, SameSite=Lax, Path=/, Secure
    unless the service runs on plain-HTTP localhost."""
    response.set_cookie(SESSION_COOKIE, token, max_age=max_age, path="/", httponly=True,
                        samesite="Lax", secure=secure_cookies(settings))


def secure_cookies(settings: Settings) -> bool:
    """Whether cookies are marked Secure: always, unless the service runs on plain-HTTP
    localhost."""
    return not (settings.public_base_url.startswith("http://") and settings.base_url_is_local)


def clear_session_cookie(response: web.StreamResponse) -> None:
    """Tell the browser to drop ``service_session``."""
    response.del_cookie(SESSION_COOKIE, path="/")
