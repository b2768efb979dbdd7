"""The answers of the service as typed, immutable dataclasses.

Each ``from_json`` reads the fields documented in ``docs/openapi.json`` and ignores any other
(a newer service may add fields); timestamps are RFC 3339 strings turned into aware
:class:`datetime.datetime` objects (UTC).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar, Union

__all__ = [
    "ApiKey",
    "AuditEvent",
    "CheckResult",
    "DataSubjectRequest",
    "Deleted",
    "Fulfilment",
    "Invitation",
    "Membership",
    "OAuthProvider",
    "Organization",
    "Page",
    "Passkey",
    "PortalLink",
    "Project",
    "Revision",
    "RiskDecision",
    "RiskPolicy",
    "ScimToken",
    "Session",
    "SignalPolicy",
    "SignalResult",
    "SigningKey",
    "Store",
    "StoredTuple",
    "TupleKey",
    "TupleLike",
    "User",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookEndpoint",
    "WriteResult",
    "tuple_key",
]

T = TypeVar("T")


def _time(value: Any) -> datetime:
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _opt_time(value: Any) -> datetime | None:
    return None if value is None else _time(value)


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One keyset page of a listing: ``data`` in the listing's order, ``next_cursor`` to pass as
    ``cursor`` for the next page (None on the last), ``has_more``."""

    data: list[T]
    next_cursor: str | None
    has_more: bool
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class Project:
    id: str
    name: str
    environment: str
    tenant_id: str
    signing_alg: str
    domains: list[str]
    created_at: datetime

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Project:
        return cls(d["id"], d["name"], d["environment"], d["tenant_id"], d["signing_alg"],
                   list(d.get("domains") or []), _time(d["created_at"]))


@dataclass(frozen=True, slots=True)
class User:
    """A user of the project. ``created`` is set by ``create_user`` only: True when this call
    created the user, False when one with that e-mail existed (the call is idempotent)."""

    id: str
    email: str | None
    email_verified: bool
    phone_number: str | None
    phone_verified: bool
    name: str
    metadata: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    last_sign_in_at: datetime | None
    created: bool | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any], created: bool | None = None) -> User:
        return cls(d["id"], d.get("email"), bool(d.get("email_verified")), d.get("phone_number"),
                   bool(d.get("phone_verified")), d.get("name") or "", dict(d.get("metadata") or {}),
                   _time(d["created_at"]), _time(d["updated_at"]), _opt_time(d.get("last_sign_in_at")),
                   created)


@dataclass(frozen=True, slots=True)
class Organization:
    id: str
    name: str
    slug: str
    metadata: dict[str, Any]
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Organization:
        return cls(d["id"], d["name"], d["slug"], dict(d.get("metadata") or {}),
                   _time(d["created_at"]), _time(d["updated_at"]))


@dataclass(frozen=True, slots=True)
class Membership:
    """A user's membership in an organization (``status`` ``active`` or ``suspended``); the
    organization's name and slug are filled when listed from the user's side."""

    id: str
    organization_id: str
    user_id: str
    role: str
    status: str
    created_at: datetime
    updated_at: datetime
    organization_name: str | None = None
    organization_slug: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Membership:
        return cls(d["id"], d["organization_id"], d["user_id"], d["role"], d["status"],
                   _time(d["created_at"]), _time(d["updated_at"]), d.get("organization_name"),
                   d.get("organization_slug"))


@dataclass(frozen=True, slots=True)
class Invitation:
    """An invitation to an organization (``inv_``), sent by e-mail with a sign-in link that
    accepts it. ``status`` ``pending``, ``accepted``, ``revoked`` or ``expired`` (a pending one
    past ``expires_at``)."""

    id: str
    organization_id: str
    email: str
    role: str
    status: str
    expires_at: datetime
    created_at: datetime
    accepted_at: datetime | None
    revoked_at: datetime | None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Invitation:
        return cls(d["id"], d["organization_id"], d["email"], d["role"], d["status"],
                   _time(d["expires_at"]), _time(d["created_at"]), _opt_time(d.get("accepted_at")),
                   _opt_time(d.get("revoked_at")))


@dataclass(frozen=True, slots=True)
class PortalLink:
    """A one-time setup link to the admin portal (``plk_``) for an organization's IT
    administrator: ``link`` (shown in this answer only) opens the portal once, until
    ``expires_at``, for ``intent`` (``scim`` or ``domain_verification``). Redirect the
    administrator to it at once rather than e-mailing it (mail scanners open links)."""

    id: str
    organization_id: str
    intent: str
    expires_at: datetime
    created_at: datetime
    link: str = field(repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PortalLink:
        return cls(d["id"], d["organization_id"], d["intent"], _time(d["expires_at"]),
                   _time(d["created_at"]), d["link"])


@dataclass(frozen=True, slots=True)
class ScimToken:
    """An organization's new SCIM token (shown in this answer only; it replaced the previous
    one at once): configure the directory (Entra ID's Tenant URL and Secret Token, Okta's base
    URL and bearer token) with ``base_url`` and ``token``. ``store_id`` is the store its groups
    write tuples to, or None."""

    base_url: str
    store_id: str | None
    token: str = field(repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ScimToken:
        return cls(d["base_url"], d.get("store_id"), d["token"])


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An API key; ``secret`` is set only in the answer that created it (shown once)."""

    id: str
    name: str
    prefix: str
    last_four: str
    scopes: list[str]
    created_at: datetime
    revoked_at: datetime | None
    created_by_key_id: str | None
    secret: str | None = field(default=None, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ApiKey:
        return cls(d["id"], d["name"], d["prefix"], d["last_four"], list(d.get("scopes") or []),
                   _time(d["created_at"]), _opt_time(d.get("revoked_at")),
                   d.get("created_by_key_id"), d.get("secret") or None)


@dataclass(frozen=True, slots=True)
class Store:
    """A tuple store; ``revision`` is its latest committed revision."""

    id: str
    name: str
    revision: int
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Store:
        return cls(d["id"], d["name"], int(d["revision"]), _time(d["created_at"]),
                   _time(d["updated_at"]))


@dataclass(frozen=True, slots=True)
class Deleted:
    id: str
    deleted: bool = True

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Deleted:
        return cls(d["id"], bool(d.get("deleted", True)))


@dataclass(frozen=True, slots=True)
class TupleKey:
    """A relationship tuple: ``object`` and ``user`` as ``type:id`` (``user`` may be a userset,
    ``type:id#relation``), ``relation`` a relation name (SPEC.md 2 "Authorization tuple")."""

    object: str
    relation: str
    user: str

    def to_json(self) -> dict[str, str]:
        return {"object": self.object, "relation": self.relation, "user": self.user}


TupleLike = Union[TupleKey, tuple[str, str, str], Mapping[str, str]]  # noqa: UP007
"""A tuple as :class:`TupleKey`, as ``(object, relation, user)`` or as a mapping with those keys."""


def tuple_key(value: TupleLike) -> TupleKey:
    """``value`` as a :class:`TupleKey` (TypeError for anything else)."""
    if isinstance(value, TupleKey):
        return value
    if isinstance(value, tuple) and len(value) == 3:
        return TupleKey(*value)
    if isinstance(value, Mapping):
        return TupleKey(value["object"], value["relation"], value["user"])
    raise TypeError(f"not a tuple: {value!r}")


@dataclass(frozen=True, slots=True)
class StoredTuple:
    object: str
    relation: str
    user: str
    revision: int
    created_at: datetime

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StoredTuple:
        return cls(d["object"], d["relation"], d["user"], int(d["revision"]), _time(d["created_at"]))


@dataclass(frozen=True, slots=True)
class Revision:
    """A store's revision, as a write answered it (a zookie in Zanzibar's words): pass it as
    ``at_least_revision`` to a check so the check sees that write (read-your-writes). Carries
    its store so it cannot be used with another one by mistake."""

    store_id: str
    value: int

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What a tuple write changed, and the :class:`Revision` to check at. ``replayed`` is True
    when the answer is the recorded one of an earlier try with the same ``Idempotency-Key``."""

    written: int
    deleted: int
    revision: Revision
    idempotency_key: str
    replayed: bool = False
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class CheckResult:
    """A check's answer: ``allowed``, ``resolution`` (``direct``, ``userset`` or ``none``),
    ``resolution_path`` (the proof's steps), the ``revision`` it was answered at, the work it
    took (``dispatch_count``, ``depth``), and ``stale`` (True while the engine cannot follow the
    change log and answers from memory)."""

    allowed: bool
    resolution: str
    resolution_path: list[str]
    revision: int
    dispatch_count: int = 0
    depth: int = 0
    stale: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any], stale: bool = False) -> CheckResult:
        return cls(bool(d["allowed"]), d["resolution"], list(d.get("resolution_path") or []),
                   int(d["revision"]), int(d.get("dispatch_count", 0)), int(d.get("depth", 0)),
                   bool(d.get("stale")) or stale)


@dataclass(frozen=True, slots=True)
class AuditEvent:
    id: str
    created_at: datetime
    action: str
    actor_type: str
    actor_id: str | None
    user_id: str | None
    project_id: str | None
    target_type: str | None
    target_id: str | None
    ip: str | None
    user_agent: str | None
    description: str | None
    metadata: dict[str, Any]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> AuditEvent:
        return cls(d["id"], _time(d["created_at"]), d["action"], d["actor_type"], d.get("actor_id"),
                   d.get("user_id"), d.get("project_id"), d.get("target_type"), d.get("target_id"),
                   d.get("ip"), d.get("user_agent"), d.get("description"),
                   dict(d.get("metadata") or {}))


@dataclass(frozen=True, slots=True)
class WebhookEndpoint:
    """A webhook endpoint (``whep_``): where the project's events go (``events`` action names,
    or ``["*"]``). ``status`` ``active`` or ``disabled`` (``disabled_reason`` ``gone`` after a
    410, ``failing`` after five days of failures, None when disabled by an update).
    ``secret`` (``whsec_...``, what :func:`~authio_client.verify_webhook` takes) is set only in
    the answers of create and rotate-secret."""

    id: str
    url: str
    events: list[str]
    description: str | None
    status: str
    disabled_reason: str | None
    created_at: datetime
    secret: str | None = field(default=None, repr=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> WebhookEndpoint:
        return cls(d["id"], d["url"], list(d.get("events") or []), d.get("description"), d["status"],
                   d.get("disabled_reason"), _time(d["created_at"]), d.get("secret") or None)


@dataclass(frozen=True, slots=True)
class WebhookAttempt:
    """One attempt of a delivery: when, the receiver's HTTP status (None when none came), how
    long it took in milliseconds, and what went wrong (None on success)."""

    at: datetime
    status_code: int | None
    duration_ms: int
    error: str | None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> WebhookAttempt:
        return cls(_time(d["at"]), d.get("status_code"), int(d.get("duration_ms") or 0), d.get("error"))


@dataclass(frozen=True, slots=True)
class WebhookDelivery:
    """One event sent to one endpoint (``dlv_``): ``status`` ``pending`` until it succeeds
    (``succeeded``) or its retries run out (``failed``); every attempt, oldest first;
    ``next_attempt_at`` None once it succeeded or failed."""

    id: str
    event_id: str
    event_type: str
    status: str
    attempts: list[WebhookAttempt]
    next_attempt_at: datetime | None
    created_at: datetime

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> WebhookDelivery:
        return cls(d["id"], d["event_id"], d["event_type"], d["status"],
                   [WebhookAttempt.from_json(a) for a in d.get("attempts") or []],
                   _opt_time(d.get("next_attempt_at")), _time(d["created_at"]))


@dataclass(frozen=True, slots=True)
class DataSubjectRequest:
    """A data-subject request (``dsr_``): the ``deletion`` or ``export`` of what the project
    holds about ``user_email``, due ``due_days`` days after its creation (``due_at``).
    ``status`` ``pending``, ``in_progress`` (a deletion between its hard delete and its last
    anonymization batch) or ``fulfilled``; ``overdue`` when past ``due_at`` and not fulfilled;
    ``result`` what the fulfilment answered (a deletion's counts, an export's ``sha256``), None
    before."""

    dsr_id: str
    request_type: str
    user_email: str
    notes: str | None
    due_days: int
    status: str
    overdue: bool
    created_at: datetime
    due_at: datetime
    fulfilled_at: datetime | None
    output_artifact_url: str | None
    result: dict[str, Any] | None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DataSubjectRequest:
        result = d.get("result")
        return cls(d["dsr_id"], d["request_type"], d["user_email"], d.get("notes"), int(d["due_days"]),
                   d["status"], bool(d.get("overdue")), _time(d["created_at"]), _time(d["due_at"]),
                   _opt_time(d.get("fulfilled_at")), d.get("output_artifact_url"),
                   dict(result) if result is not None else None)


@dataclass(frozen=True, slots=True)
class Fulfilment:
    """What fulfilling a data-subject request answered: the request as it now stands
    (``dsr``); for a deletion the rows ``deleted`` and the history rows ``anonymized``, by
    table; for an export the JSON ``document`` and its ``sha256`` (hex, of the document as the
    service serializes it: UTF-8 JSON, keys sorted, no whitespace). ``user_found`` is False
    when the project held no user with that e-mail. ``finishing`` is True when another process
    is still finishing the deletion (the service answered 202): ask again later."""

    dsr: DataSubjectRequest
    user_found: bool
    deleted: dict[str, int] | None = None
    anonymized: dict[str, int] | None = None
    document: dict[str, Any] | None = None
    sha256: str | None = None
    finishing: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any], finishing: bool = False) -> Fulfilment:
        def counts(value: Any) -> dict[str, int] | None:
            return None if value is None else {str(k): int(v) for k, v in value.items()}
        document = d.get("document")
        return cls(DataSubjectRequest.from_json(d["dsr"]), bool(d["user_found"]), counts(d.get("deleted")),
                   counts(d.get("anonymized")), dict(document) if document is not None else None,
                   d.get("sha256"), finishing)


@dataclass(frozen=True, slots=True)
class SignalPolicy:
    """One risk signal as the policy sets it: ``enabled``, its ``weight`` (points added to the
    score when it fires) and what it looks at."""

    enabled: bool
    weight: int
    description: str

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SignalPolicy:
        return cls(bool(d["enabled"]), int(d["weight"]), d.get("description") or "")


@dataclass(frozen=True, slots=True)
class RiskPolicy:
    """The project's risk policy: a sign-in scoring at or above ``threshold_block`` (0 to 100)
    is blocked, at or above ``threshold_challenge`` needs a step-up; ``signals`` by name.
    ``default`` is True while the project never set one; ``updated_at`` the last replace."""

    threshold_challenge: int
    threshold_block: int
    signals: dict[str, SignalPolicy]
    default: bool
    updated_at: datetime | None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RiskPolicy:
        return cls(int(d["threshold_challenge"]), int(d["threshold_block"]),
                   {str(k): SignalPolicy.from_json(v) for k, v in (d.get("signals") or {}).items()},
                   bool(d.get("default")), _opt_time(d.get("updated_at")))


@dataclass(frozen=True, slots=True)
class SignalResult:
    """One signal's result in a risk decision: whether it ``fired``, the points it added
    (``contribution``) and why (``reason``)."""

    name: str
    fired: bool
    contribution: int
    reason: str

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SignalResult:
        return cls(d["name"], bool(d["fired"]), int(d["contribution"]), d.get("reason") or "")


@dataclass(frozen=True, slots=True)
class RiskDecision:
    """A scored sign-in (``rd_``): ``score`` 0 to 100, ``decision`` ``allow``, ``challenge``
    (a step-up was required) or ``block``, every enabled signal's result, the ``reasons`` of
    those that fired, the ``inputs`` they saw (``ip``, ``user_agent``, ``device``, ``place``,
    counts), the sign-in ``method``, the session it started and the step-up challenge a
    ``challenge`` created."""

    id: str
    user_id: str | None
    session_id: str | None
    method: str
    score: int
    decision: str
    signals: list[SignalResult]
    reasons: list[str]
    inputs: dict[str, Any]
    step_up_challenge_id: str | None
    created_at: datetime

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RiskDecision:
        return cls(d["id"], d.get("user_id"), d.get("session_id"), d["method"], int(d["score"]),
                   d["decision"], [SignalResult.from_json(x) for x in d.get("signals") or []],
                   list(d.get("reasons") or []), dict(d.get("inputs") or {}),
                   d.get("step_up_challenge_id"), _time(d["created_at"]))


@dataclass(frozen=True, slots=True)
class Passkey:
    """One of a user's passkeys (``pk_``, a WebAuthn credential): its ``name``, the
    authenticator model (``aaguid``), ``sign_count``, ``transports``, whether it can be synced
    (``backup_eligible``) and is (``backup_state``), and when it was last used."""

    id: str
    user_id: str
    credential_id: str
    name: str
    aaguid: str
    sign_count: int
    transports: list[str]
    backup_eligible: bool
    backup_state: bool
    created_at: datetime
    last_used_at: datetime | None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Passkey:
        return cls(d["id"], d["user_id"], d["credential_id"], d.get("name") or "", d.get("aaguid") or "",
                   int(d.get("sign_count") or 0), list(d.get("transports") or []),
                   bool(d.get("backup_eligible")), bool(d.get("backup_state")), _time(d["created_at"]),
                   _opt_time(d.get("last_used_at")))


@dataclass(frozen=True, slots=True)
class OAuthProvider:
    """A sign-in provider's configuration in the project (never its client secret):
    ``provider`` its name (``google``, ``github``, ``microsoft``, ``apple``, or any other name
    for a generic OpenID Connect provider with its ``issuer``), ``kind``, ``client_id``,
    ``scopes``, the application pages a sign-in may return to (``redirect_uris``), and
    ``callback_url``, to register at the provider as its redirect URI."""

    provider: str
    kind: str
    client_id: str
    issuer: str | None
    scopes: list[str]
    redirect_uris: list[str]
    callback_url: str
    created_at: datetime
    updated_at: datetime
    created: bool | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any], created: bool | None = None) -> OAuthProvider:
        return cls(d["provider"], d["kind"], d["client_id"], d.get("issuer"), list(d.get("scopes") or []),
                   list(d.get("redirect_uris") or []), d["callback_url"], _time(d["created_at"]),
                   _time(d["updated_at"]), created)


@dataclass(frozen=True, slots=True)
class SigningKey:
    kid: str
    alg: str
    status: str
    created_at: datetime
    activated_at: datetime | None
    retired_at: datetime | None
    publish_until: datetime | None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SigningKey:
        return cls(d["kid"], d["alg"], d["status"], _time(d["created_at"]),
                   _opt_time(d.get("activated_at")), _opt_time(d.get("retired_at")),
                   _opt_time(d.get("publish_until")))


@dataclass(frozen=True, slots=True)
class Session:
    """A verified end-user session (an access token that held): the user, the session, the
    project, the selected organization and role (None when none is selected), when the token was
    issued and expires (Unix seconds), the key that signed it, and every claim."""

    user_id: str
    session_id: str
    project_id: str
    org_id: str | None
    org_role: str | None
    issued_at: int
    expires_at: int
    kid: str
    claims: dict[str, Any] = field(repr=False)
    token: str = field(repr=False)

    @property
    def subject(self) -> str:
        """The tuple subject of the session's user: ``user:<user_id>``."""
        return f"user:{self.user_id}"
