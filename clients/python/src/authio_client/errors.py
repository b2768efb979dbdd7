"""Errors by the service's error code.

Every error answer of authio is the envelope of its DESIGN.md::

    {"error": {"code": "<code>", "message": "<human text>", "details": {...}},
     "request_id": "req_..."}

and clients branch on ``code``, never on the message (SPEC.md 7). :func:`error_from` turns such
an answer into an exception: the class registered for its code when there is one
(:data:`CODES`), else the class of its HTTP status family, else :class:`AuthioError`. So
``except NotFound`` catches ``user_not_found`` and ``store_not_found`` alike, and
``except UserNotFound`` only the first.

Failures that never reached an answer are :class:`ConnectionFailed` (``code``
``connection_error``, ``status`` 0) and :class:`Timeout` (``code`` ``timeout``, ``status`` 0;
also a :class:`TimeoutError`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = [
    "CODES",
    "AlreadyAMember",
    "AuthenticationError",
    "AuthioError",
    "Conflict",
    "ConnectionFailed",
    "DbUnavailable",
    "Forbidden",
    "IdempotencyKeyReused",
    "InsufficientScope",
    "InvalidApiKey",
    "InvalidRequest",
    "InvalidSession",
    "InvitationNotFound",
    "InvitationNotPending",
    "InvitationPending",
    "MembershipNotFound",
    "MissingApiKey",
    "NoSession",
    "NotFound",
    "OrganizationNotFound",
    "RateLimited",
    "ResolutionTooComplex",
    "RevisionAhead",
    "RevisionNotReached",
    "ServerError",
    "SlugInUse",
    "StoreNotFound",
    "Timeout",
    "Unavailable",
    "UnknownProvider",
    "UserNotFound",
    "error_from",
]


class AuthioError(Exception):
    """An error answer of the service (or a failure to get one).

    ``code`` the envelope's stable code, ``status`` the HTTP status (0 when no answer came),
    ``message`` the human text, ``details`` the envelope's ``details`` object, ``request_id``
    the ``req_`` id to quote to support (None when no answer came), ``retry_after`` the
    ``Retry-After`` header in seconds when the answer had one.
    """

    default_code: ClassVar[str] = "error"

    def __init__(self, message: str, *, code: str | None = None, status: int = 0,
                 details: Mapping[str, Any] | None = None, request_id: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.code = code or self.default_code
        self.status = status
        self.message = message
        self.details: dict[str, Any] = dict(details or {})
        self.request_id = request_id
        self.retry_after = retry_after

    def __str__(self) -> str:
        rid = f", request_id={self.request_id}" if self.request_id else ""
        return f"{self.code} ({self.status}): {self.message}{rid}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status}, message={self.message!r})"


# -- families, by HTTP status ------------------------------------------------------------------

class InvalidRequest(AuthioError):
    """400 or 422: the request was refused as it stands (``invalid_request`` carries
    ``details.fields``: each bad field's dotted path and what is wrong with it)."""

    default_code = "invalid_request"


class AuthenticationError(AuthioError):
    """401: no credentials, or ones that do not hold (an API key or a session token)."""

    default_code = "unauthorized"


class Forbidden(AuthioError):
    """403: authenticated, but not allowed (``insufficient_scope``, ``forbidden``...)."""

    default_code = "forbidden"


class NotFound(AuthioError):
    """404: no such resource in this project."""

    default_code = "not_found"


class Conflict(AuthioError):
    """409: the change collides with what exists (``slug_in_use``, ``already_a_member``...)."""

    default_code = "conflict"


class RateLimited(AuthioError):
    """429 ``rate_limited``: ``retry_after`` says when to try again."""

    default_code = "rate_limited"


class ServerError(AuthioError):
    """500 and other 5xx but 503: ``internal_error``; quote ``request_id``."""

    default_code = "internal_error"


class Unavailable(AuthioError):
    """503: ``db_unavailable``, ``service_unavailable``, ``not_ready``,
    ``revision_not_reached``: retried by the client within its bounds, raised after them."""

    default_code = "service_unavailable"


class ConnectionFailed(AuthioError):
    """No answer: the connection could not be opened, or broke (after the client's retries)."""

    default_code = "connection_error"


class Timeout(AuthioError, TimeoutError):
    """No answer in time: a check's per-call timeout, or the transport's."""

    default_code = "timeout"


# -- codes the applications branch on ------------------------------------------------------------

class MissingApiKey(AuthenticationError):
    default_code = "missing_api_key"


class InvalidApiKey(AuthenticationError):
    default_code = "invalid_api_key"


class NoSession(AuthenticationError):
    """401 ``no_session``: no access token was presented."""

    default_code = "no_session"


class InvalidSession(AuthenticationError):
    """401 ``invalid_session``: ``details["reason"]`` is ``signature`` (malformed, unknown key,
    bad signature or claims), ``expired``, ``project`` (another project's token) or
    ``revoked``: the engine's reasons (DESIGN.md "edge validation")."""

    default_code = "invalid_session"

    @property
    def reason(self) -> str | None:
        value = self.details.get("reason")
        return value if isinstance(value, str) else None


class InsufficientScope(Forbidden):
    default_code = "insufficient_scope"


class UserNotFound(NotFound):
    default_code = "user_not_found"


class OrganizationNotFound(NotFound):
    default_code = "organization_not_found"


class MembershipNotFound(NotFound):
    default_code = "membership_not_found"


class InvitationNotFound(NotFound):
    default_code = "invitation_not_found"


class UnknownProvider(NotFound):
    """404 ``unknown_provider``: the project has no configuration for that sign-in provider."""

    default_code = "unknown_provider"


class StoreNotFound(NotFound):
    default_code = "store_not_found"


class SlugInUse(Conflict):
    default_code = "slug_in_use"


class AlreadyAMember(Conflict):
    default_code = "already_a_member"


class InvitationPending(Conflict):
    """409 ``invitation_pending``: a pending invitation for that e-mail exists already."""

    default_code = "invitation_pending"


class InvitationNotPending(Conflict):
    """409 ``invitation_not_pending``: the invitation was accepted, revoked or expired."""

    default_code = "invitation_not_pending"


class RevisionAhead(InvalidRequest):
    """400 ``revision_ahead``: ``at_least_revision`` is beyond the store's latest revision
    (``details.requested``, ``details.current``); no wait makes it true."""

    default_code = "revision_ahead"


class ResolutionTooComplex(InvalidRequest):
    """422 ``resolution_too_complex``: the check hit the depth cap (``details.max_depth``)."""

    default_code = "resolution_too_complex"


class IdempotencyKeyReused(InvalidRequest):
    """422 ``idempotency_key_reused``: the same ``Idempotency-Key`` with another body."""

    default_code = "idempotency_key_reused"


class DbUnavailable(Unavailable):
    """503 ``db_unavailable``: PostgreSQL could not be reached; nothing was written unless
    ``details["outcome"] == "unknown"``."""

    default_code = "db_unavailable"


class RevisionNotReached(Unavailable):
    """503 ``revision_not_reached``: the engine had not followed ``at_least_revision`` when its
    wait ended."""

    default_code = "revision_not_reached"


CODES: dict[str, type[AuthioError]] = {
    cls.default_code: cls
    for cls in (MissingApiKey, InvalidApiKey, NoSession, InvalidSession, InsufficientScope,
                UserNotFound, OrganizationNotFound, MembershipNotFound, StoreNotFound, SlugInUse,
                AlreadyAMember, InvitationNotFound, InvitationPending, InvitationNotPending,
                UnknownProvider, RevisionAhead, ResolutionTooComplex, IdempotencyKeyReused,
                DbUnavailable, RevisionNotReached, RateLimited, Forbidden, NotFound,
                InvalidRequest)
}
"""Error code -> exception class, for the codes with a class of their own."""

_FAMILIES: dict[int, type[AuthioError]] = {
    400: InvalidRequest, 401: AuthenticationError, 403: Forbidden, 404: NotFound,
    409: Conflict, 410: InvalidRequest, 422: InvalidRequest, 429: RateLimited,
    503: Unavailable,
}


def error_class(code: str, status: int) -> type[AuthioError]:
    """The class for ``code`` (answered with ``status``)."""
    found = CODES.get(code)
    if found is not None:
        return found
    family = _FAMILIES.get(status)
    if family is not None:
        return family
    return ServerError if status >= 500 else AuthioError


def error_from(status: int, body: Any, *, request_id: str | None = None,
               retry_after: float | None = None) -> AuthioError:
    """The exception for an error answer: ``body`` the decoded JSON (the envelope, or anything
    else a proxy in between may have answered: then ``code`` is ``http_<status>``)."""
    info = body.get("error") if isinstance(body, dict) else None
    if isinstance(info, dict) and isinstance(info.get("code"), str):
        code = info["code"]
        message = str(info.get("message") or code)
        details = info.get("details") if isinstance(info.get("details"), dict) else {}
    else:
        code, message, details = f"http_{status}", f"HTTP {status} without the error envelope", {}
    if request_id is None and isinstance(body, dict) and isinstance(body.get("request_id"), str):
        request_id = body["request_id"]
    cls = error_class(code, status)
    return cls(message, code=code, status=status, details=details, request_id=request_id,
               retry_after=retry_after)
