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
    retry_after: ClassVar[int | None] = None
    """When set, every answer of this error carries ``Retry-After`` with this many seconds (and
    the OpenAPI document says so)."""

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
        if self.retry_after is not None:
            self.headers.setdefault("Retry-After", str(self.retry_after))
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


class RevisionAhead(ServiceError):
    """``consistency.at_least_revision`` is beyond the store's committed head in PostgreSQL: no
    wait makes it true (SpiceDB's FailedPrecondition for a revision in the future).
    ``details.requested`` is the revision asked for, ``details.current`` the store's head."""

    code, status, default_message = (
        "revision_ahead", 400,
        "The requested revision is beyond the store's latest revision; ask for one a write "
        "returned.")


class RevisionNotReached(ServiceError):
    """``consistency.at_least_revision`` is committed (or could not be told apart from one, with
    PostgreSQL unreachable) but this engine had not followed it when its wait
    (``SERVICE_CONSISTENCY_TIMEOUT_MS``) ended; ``details.requested`` and ``details.current``
    (the revision this engine has). Retry: another attempt, or another engine, will have it."""

    code, status, default_message = (
        "revision_not_reached", 503,
        "The requested revision is committed but not followed by this engine yet; retry.")
    retry_after = 1  # the follower applies a write within milliseconds; a trailing one soon after


class IdempotencyKeyReused(ServiceError):
    """An ``Idempotency-Key`` sent again with a different request than the first time."""

    code, status, default_message = (
        "idempotency_key_reused", 422,
        "This Idempotency-Key was used for a different request; use a new key for a new request.")


class RateLimited(ServiceError):
    """Too many requests; ``Retry-After`` says when to retry."""

    code, status, default_message = "rate_limited", 429, "Too many requests."


class InternalError(ServiceError):
    """An unexpected failure; detail goes to the logs only."""


class DbUnavailable(ServiceError):
    """PostgreSQL could not be reached, or the connection to it was lost (SPEC.md 7);
    ``details.outcome`` is ``unknown`` when it was lost while a tuple write was committing and
    did not come back in time to tell whether the write took effect."""

    code, status, default_message = "db_unavailable", 503, "The database is unavailable."
    retry_after = 1  # a restart or failover takes seconds; a client's retry should not wait long


class ServiceUnavailable(ServiceError):
    """A store the request needs (Redis) cannot be reached; ``Retry-After`` says when to retry."""

    code, status, default_message = "service_unavailable", 503, "The service is unavailable; retry shortly."


class NotReady(ServiceError):
    """The service is still starting (stores loading, log not followed yet)."""

    code, status, default_message = "not_ready", 503, "The service is not ready yet."


# --- Identity (SPEC.md 7; codes the spec leaves open are ours, named for what went wrong) ------


class ProjectNotFound(ServiceError):
    """A public endpoint named a project (``project_id``, ``Service-Project`` or the host) that
    does not exist."""

    code, status, default_message = "project_not_found", 404, "No such project."


class UserNotFound(ServiceError):
    code, status, default_message = "user_not_found", 404, "No user with that id in this project."


class OrganizationNotFound(ServiceError):
    code, status, default_message = (
        "organization_not_found", 404, "No organization with that id in this project.")


class MembershipNotFound(ServiceError):
    code, status, default_message = (
        "membership_not_found", 404, "No such membership in this organization.")


class InvitationNotFound(ServiceError):
    code, status, default_message = (
        "invitation_not_found", 404, "No such invitation in this organization.")


class InvalidEmail(ServiceError):
    """The email failed validation (SPEC.md 7: magic-link send, invitations, users)."""

    code, status, default_message = "invalid_email", 422, "The email address is not valid."


class InvalidDestination(ServiceError):
    """The destination is neither an email nor an E.164 phone number (SPEC.md 7)."""

    code, status, default_message = (
        "invalid_destination", 400,
        "The destination must be an email address or an E.164 phone number such as +14155550100.")


class InvalidSlug(ServiceError):
    code, status, default_message = (
        "invalid_slug", 422, "The slug must be lowercase letters, digits and single hyphens.")


class SlugInUse(ServiceError):
    code, status, default_message = (
        "slug_in_use", 409, "Another organization in this project has that slug.")


class EmailInUse(ServiceError):
    code, status, default_message = (
        "email_in_use", 409, "Another user in this project has that email address.")


class PhoneInUse(ServiceError):
    code, status, default_message = (
        "phone_in_use", 409, "Another user in this project has that phone number.")


class AlreadyAMember(ServiceError):
    code, status, default_message = (
        "already_a_member", 409, "The user is already a member of this organization.")


class InvitationPending(ServiceError):
    code, status, default_message = (
        "invitation_pending", 409, "A pending invitation for that email already exists.")


class InvitationNotPending(ServiceError):
    code, status, default_message = (
        "invitation_not_pending", 409, "The invitation was already accepted, revoked or expired.")


class RecoveryRequestNotFound(ServiceError):
    code, status, default_message = (
        "recovery_request_not_found", 404, "No recovery request with that id in this project.")


class RecoveryRequestPending(ServiceError):
    code, status, default_message = (
        "recovery_request_pending", 409,
        "The user has a pending recovery request; approve or deny it first.")


class RecoveryRequestNotPending(ServiceError):
    code, status, default_message = (
        "recovery_request_not_pending", 409, "The recovery request was already approved or denied.")


class OperatorNotFound(ServiceError):
    """No dashboard operator with that id in the caller's tenant."""

    code, status, default_message = (
        "operator_not_found", 404, "No operator with that id in this tenant.")


class OperatorExists(ServiceError):
    """The e-mail address is already an operator of the tenant (``details.operator_id``)."""

    code, status, default_message = (
        "operator_exists", 409, "That e-mail address is already an operator of this tenant.")


class Forbidden(ServiceError):
    """The caller is known but this request is refused (DESIGN.md: ``forbidden`` 403, edge
    validation's denied check; here also a cross-origin cookie request, ``web.auth``)."""

    code, status, default_message = "forbidden", 403, "Forbidden."


class NotAMember(ServiceError):
    """SPEC.md 3: select-org and switch-org need an active membership in the organization."""

    code, status, default_message = (
        "not_a_member", 403, "The user has no active membership in that organization.")


class NoSession(ServiceError):
    """SPEC.md 3 and 7: no active session cookie or Bearer access token (or refresh token)."""

    code, status, default_message = "no_session", 401, "No active session."


class InvalidSession(ServiceError):
    """DESIGN.md "edge validation": a session token was presented and does not hold;
    ``details.reason`` is ``expired``, ``revoked``, ``signature`` or ``project``."""

    code, status, default_message = "invalid_session", 401, "The session is not valid."


class OrgAlreadySelected(ServiceError):
    """SPEC.md 3: select-org happens once per session; switch-org changes the organization."""

    code, status, default_message = (
        "org_already_selected", 409,
        "This session already has an organization selected; use POST /v1/sessions/switch-org.")


class NoOrgSelected(ServiceError):
    code, status, default_message = (
        "no_org_selected", 409,
        "This session has no organization selected yet; use POST /v1/sessions/select-org.")


class TokenConsumed(ServiceError):
    """A single-use token was already used (SPEC.md 7)."""

    code, status, default_message = "token_consumed", 410, "This link was already used."


class TokenExpired(ServiceError):
    code, status, default_message = "token_expired", 410, "This link has expired."


class TokenInvalidOrExpired(ServiceError):
    code, status, default_message = (
        "token_invalid_or_expired", 410, "This link is not valid or has expired.")


class DomainInUse(ServiceError):
    """``PATCH /v1/projects/me``: a domain resolves public endpoints to one project only."""

    code, status, default_message = (
        "domain_in_use", 409, "Another project already uses that domain.")


class UnknownOrExpiredChallenge(ServiceError):
    """A WebAuthn verify whose challenge (found by its value in ``clientDataJSON``) is unknown,
    already spent, expired, of the other ceremony or of another user."""

    code, status, default_message = (
        "unknown_or_expired_challenge", 400,
        "The challenge is unknown, already used or expired; ask for new options.")


class VerificationFailed(ServiceError):
    """A sign-in proof that does not verify (SPEC.md 7). Passkeys: signature, origin,
    relying-party id, user verification, type, an unknown or deleted credential, or a sign count
    that went backwards. OAuth: an ID token that fails validation, a provider that answered
    ``error``, a code the provider would not exchange."""

    code, status, default_message = "verification_failed", 400, "The sign-in could not be verified."


class UnknownProvider(ServiceError):
    """OAuth: the provider name is not configured in the project (SPEC.md 7)."""

    code, status, default_message = (
        "unknown_provider", 404, "No OAuth provider of that name is configured in this project.")


class MissingEmail(ServiceError):
    """OAuth callback: the provider gave no e-mail address (SPEC.md 7)."""

    code, status, default_message = "missing_email", 400, "The provider returned no e-mail address."


class IdentityConflict(ServiceError):
    """OAuth callback: the provider's e-mail is not verified and belongs to an existing user, so
    the identity is never linked to that user (DESIGN.md "identity_conflict")."""

    code, status, default_message = (
        "identity_conflict", 409,
        "A user with this e-mail exists, and the provider does not say the address is verified.")


class BlockedByRiskPolicy(ServiceError):
    """A sign-in whose risk score is at or above the project's ``threshold_block`` (SPEC.md 5.5):
    no session, no cookie. ``details.decision_id`` names the decision an operator reads
    (``GET /v1/risk/decisions/{id}``)."""

    code, status, default_message = (
        "blocked_by_risk_policy", 403, "This sign-in was blocked by the project's risk policy.")


class StepUpRequired(ServiceError):
    """A sign-in whose risk score is at or above ``threshold_challenge``: no session until a
    step-up satisfies ``details.challenge_id`` (a fresh passkey assertion or a step-up magic
    link of the same user, within ``details.expires_in`` seconds; ``details.methods`` lists the
    step-ups this user can take)."""

    code, status, default_message = (
        "step_up_required", 401, "This sign-in needs a step-up: confirm it with a passkey or a link.")


# --- SCIM 2.0 (RFC 7644 3.12): written in RFC 7644's error shape, never the envelope ----------


class ScimError(ServiceError):
    """A refusal of a SCIM route: ``scim_type`` is its RFC 7644 3.12 ``scimType`` keyword
    (``invalidFilter``, ``invalidValue``, ``uniqueness``, ...) or None. The SCIM routes' error
    renderer (``control_plane.scim``) writes every error under ``/scim/v2`` in RFC 7644's
    shape; ``code`` names the case in logs and the document only."""

    code, status, default_message = "scim_bad_request", 400, "The SCIM request is not valid."

    def __init__(self, message: str | None = None, *, scim_type: str | None = None,
                 details: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message, details=details, headers=headers)
        self.scim_type = scim_type


class ScimBadRequest(ScimError):
    """400: a filter, path, value or syntax the SCIM service refuses (``scim_type`` says which:
    ``invalidFilter``, ``invalidPath``, ``invalidValue``, ``invalidSyntax``, ``noTarget``,
    ``mutability``, ``tooMany``)."""


class ScimUnauthorized(ScimError):
    """401: no SCIM bearer token, or not the organization's current one."""

    code, status, default_message = (
        "scim_unauthorized", 401,
        "Send the organization's SCIM token as Authorization: Bearer scim_...; a token is "
        "replaced by the next one minted.")


class ScimNotFound(ScimError):
    """404: no such resource in the organization's SCIM view."""

    code, status, default_message = "scim_not_found", 404, "No such resource in this directory."


class ScimConflict(ScimError):
    """409 ``uniqueness``: a ``userName``, e-mail address or group ``displayName`` taken."""

    code, status, default_message = (
        "scim_uniqueness", 409, "A unique attribute of the resource is taken.")


class ScimPreconditionFailed(ScimError):
    """412: ``If-Match`` names a version the resource no longer has."""

    code, status, default_message = (
        "scim_precondition_failed", 412, "The resource has changed since that version.")


class ScimNotImplemented(ScimError):
    """501: an operation of RFC 7644 this service provider does not offer (a search across
    resource types, ``POST /scim/v2/.search``)."""

    code, status, default_message = (
        "scim_not_implemented", 501, "This SCIM operation is not offered by this service.")
