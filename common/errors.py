"""The error table: one exception class per stable error code.

Domain code raises these; the envelope middleware (``common.http``) is the only place that turns
them into a status and the body ``{"error": {"code", "message", "details"}, "request_id"}``
(DESIGN.md "Conventions"). Codes and statuses come from SPEC.md section 7; codes the spec leaves
open come from DESIGN.md.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ServiceError(Exception):
    """Base of every error a client may see; ``code`` and ``status`` are class attributes."""

    code: ClassVar[str] = "internal_error"
    status: ClassVar[int] = 500
    default_message: ClassVar[str] = "Internal error."

    def __init__(
        self,
        message: str | None = None,
        *,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.message = message or self.default_message
        self.details = details or {}
        self.headers = headers or {}
        super().__init__(self.message)


class InvalidRequest(ServiceError):
    """The request failed validation; ``details.fields`` names what is wrong."""

    code, status, default_message = "invalid_request", 400, "The request is invalid."

    @classmethod
    def field(cls, field: str, message: str) -> InvalidRequest:
        """One invalid field: ``details.fields = [{"field": field, "message": message}]``."""
        return cls(f"{field}: {message}", details={"fields": [{"field": field, "message": message}]})


class NotFound(ServiceError):
    """No such route or resource."""

    code, status, default_message = "not_found", 404, "Not found."


class StoreNotFound(ServiceError):
    """No store with that id in the caller's project."""

    code, status, default_message = "store_not_found", 404, "No store with that id in this project."


class MethodNotAllowed(ServiceError):
    """The route exists but not for this method."""

    code, status, default_message = "method_not_allowed", 405, "Method not allowed."


class PayloadTooLarge(ServiceError):
    """The request body exceeds the server's limit."""

    code, status, default_message = "payload_too_large", 413, "Request body too large."


class MissingApiKey(ServiceError):
    """No ``Authorization: Bearer`` API key (SPEC.md 5.1)."""

    code, status, default_message = "missing_api_key", 401, "Missing API key: send Authorization: Bearer <key>."


class InvalidApiKey(ServiceError):
    """The API key is unknown or revoked (SPEC.md 5.1)."""

    code, status, default_message = "invalid_api_key", 401, "The API key is unknown or revoked."


class InsufficientScope(ServiceError):
    """The API key lacks the scope this endpoint requires."""

    code, status, default_message = "insufficient_scope", 403, "The API key lacks the required scope."


class MissingBootstrapToken(ServiceError):
    """The ``x-service-bootstrap-token`` header is missing or wrong (SPEC.md 4 rule 1)."""

    code, status, default_message = "missing_bootstrap_token", 401, "Missing or wrong bootstrap token."


class BootstrapDisabled(ServiceError):
    """``SERVICE_BOOTSTRAP_TOKEN`` is not configured (SPEC.md 4 rule 1)."""

    code, status = "bootstrap_disabled", 503
    default_message = "Bootstrap is disabled: SERVICE_BOOTSTRAP_TOKEN is not set."


class ResolutionTooComplex(ServiceError):
    """A check hit the depth cap before finding an answer; never reported as a deny."""

    code, status, default_message = "resolution_too_complex", 422, "The check exceeded the resolution depth limit."


class RevisionNotReached(ServiceError):
    """``consistency.at_least_revision`` was not reached within the wait bound."""

    code, status, default_message = "revision_not_reached", 503, "The requested revision is not available yet."


class RateLimited(ServiceError):
    """Too many requests; ``Retry-After`` says when to retry."""

    code, status, default_message = "rate_limited", 429, "Too many requests."


class InternalError(ServiceError):
    """An unexpected failure; detail goes to the logs only."""


class DbUnavailable(ServiceError):
    """PostgreSQL could not be reached (SPEC.md 7)."""

    code, status, default_message = "db_unavailable", 503, "The database is unavailable."


class NotReady(ServiceError):
    """The service is still starting (stores loading, log not followed yet)."""

    code, status, default_message = "not_ready", 503, "The service is not ready yet."
