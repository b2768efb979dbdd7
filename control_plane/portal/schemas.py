"""Admin portal bodies: the setup link, the portal's state, domains and their verification."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema

from common.ids import id_pattern, is_id
from common.schemas import QueryModel, RequestModel, integral
from control_plane.tenancy.schemas import normalize_domain

Intent = Literal["scim", "domain_verification"]
TXT_PREFIX: Final = "_authio-verification"
"""The label under which an organization publishes its challenge: ``_authio-verification.<domain>``
(an underscore label, RFC 8552, as ``_dmarc`` and ``_acme-challenge`` are)."""
MAX_DOMAIN: Final = 253 - len(TXT_PREFIX) - 1
"""The longest domain whose record name still fits DNS's 253 characters."""
DEFAULT_TTL: Final = 300
MIN_TTL: Final = 60
MAX_TTL: Final = 86_400


def _org_id(value: str) -> str:
    if not is_id(value, "org"):
        raise ValueError("must be an organization id (org_...)")
    return value


OrganizationId = Annotated[str, AfterValidator(_org_id), WithJsonSchema(
    {"type": "string", "pattern": id_pattern("org"), "description": "An organization id."})]
TtlSeconds = Annotated[int, Field(ge=MIN_TTL, le=MAX_TTL, description=(
    "How long the link can be opened, in seconds: 300 (5 minutes) by default, 60 to 86,400.")),
    BeforeValidator(integral)]


class CreateLink(RequestModel):
    """``POST /v1/portal/links``: the organization the portal sets up, what for, and how long the
    link stays usable."""

    organization_id: OrganizationId
    intent: Annotated[Intent, Field(description=(
        "What the portal lets the organization's IT administrator do: `domain_verification` "
        "(prove control of a domain by a DNS TXT record) or `scim` (connect a directory: the "
        "SCIM base URL and bearer token, sync status)."))]
    ttl_seconds: TtlSeconds = DEFAULT_TTL


@dataclass(frozen=True, slots=True)
class PortalLink:
    """A one-time setup link (``plk_``). ``link`` is shown this once: only its token's SHA-256
    is kept. It opens the portal once, until ``expires_at``; hand it to the organization's IT
    administrator at once (redirect them to it), rather than by e-mail, whose scanners open
    links."""

    id: str
    link: str
    organization_id: str
    intent: Intent
    expires_at: datetime
    created_at: datetime


class PortalQuery(QueryModel):
    """``GET /portal``: the setup link's ``token``."""

    token: Annotated[str | None, Field(max_length=512, description=(
        "The setup token of a link from `POST /v1/portal/links` (`ptk_...`). Opening the page "
        "with it uses it up and starts the portal session; without it, the page resumes the "
        "session its cookie carries."))] = None


# --- domains -----------------------------------------------------------------------------------


def _portal_domain(value: str) -> str:
    domain = normalize_domain(value)
    if "." not in domain:
        raise ValueError(f"{value!r} is not a domain such as example.com")
    if len(domain) > MAX_DOMAIN:
        raise ValueError(f"at most {MAX_DOMAIN} characters")
    return domain


_SPACE: Final = r"\u0009-\u000d\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_LABEL: Final = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
Domain = Annotated[str, AfterValidator(_portal_domain), WithJsonSchema({
    "anyOf": [
        {"type": "string", "maxLength": MAX_DOMAIN,
         "pattern": f"^[{_SPACE}]*(?:{_LABEL}\\.)+[A-Za-z](?:[A-Za-z0-9-]{{0,61}}[A-Za-z0-9])?"
                    f"\\.?[{_SPACE}]*$"},
        {"type": "string", "pattern": "^[^\\u0000]*[^\\u0000-\\u007f][^\\u0000]*$",
         "description": "An internationalized name, kept in its ASCII (IDNA) form; refused "
                        "when it has none."},
    ],
    "description": "A domain of the organization, such as example.com: two labels or more, no "
                   "scheme, port, path or IP address; case and a trailing dot do not matter."})]


class DomainBody(RequestModel):
    """A domain of the link's organization."""

    domain: Domain


DomainStatus = Literal["pending", "verified"]


@dataclass(frozen=True, slots=True)
class TxtRecord:
    """The DNS record proving control of the domain: publish a TXT record at ``name`` whose
    value is ``value``."""

    type: Literal["TXT"]
    name: str
    value: str


@dataclass(frozen=True, slots=True)
class OrganizationDomain:
    """A domain the organization claimed: ``pending`` until its TXT record was found, then
    ``verified`` (``verified_at``). ``checked_at``: the last verification attempt."""

    domain: str
    status: DomainStatus
    txt_record: TxtRecord
    verified_at: datetime | None
    checked_at: datetime | None
    created_at: datetime


VerificationOutcome = Literal["verified", "record_missing", "record_mismatch", "lookup_failed"]


@dataclass(frozen=True, slots=True)
class DomainVerification:
    """A verification attempt: ``verified`` and the domain as it now is; otherwise
    ``outcome`` says why not (``record_missing``: no TXT record at the name;
    ``record_mismatch``: TXT records there, none with the value, listed in ``found``;
    ``lookup_failed``: DNS did not answer, try again) and ``message`` says it in words."""

    verified: bool
    outcome: VerificationOutcome
    message: str
    found: list[str]
    domain: OrganizationDomain


# --- the portal's state ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PortalOrganization:
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ScimChange:
    """A change the directory made through SCIM, as the audit log recorded it: when, the
    ``action`` (``scim.user.synced``, ``scim.group.synced``), the ``change`` (``created``,
    ``updated``, ``deactivated``, ``reactivated``, ``deleted``) and the resource changed."""

    at: datetime
    action: str
    change: str | None
    resource_type: str | None
    resource_id: str | None


@dataclass(frozen=True, slots=True)
class ScimSetup:
    """The organization's directory sync as the portal shows it: the SCIM ``base_url``; when its
    token was minted (null: none yet; the token itself is shown once, by the mint); once there
    is one, how many ``users`` and ``groups`` the directory's view holds; when the directory
    last changed something (``last_synced_at``) and its latest changes (``recent_changes``,
    newest first, at most 10). SCIM reads and refused requests change nothing and are not
    recorded, so they are not listed."""

    base_url: str
    token_minted_at: datetime | None
    users: int | None
    groups: int | None
    last_synced_at: datetime | None
    recent_changes: list[ScimChange]


class ScimTokenBody(RequestModel):
    """``POST /v1/portal/scim/token``: an empty object (the organization is the link's)."""


@dataclass(frozen=True, slots=True)
class PortalScimToken:
    """The organization's new SCIM token, shown this once (it replaced the previous one): a
    directory is configured with ``base_url`` and ``token`` as its bearer token."""

    token: str
    base_url: str


@dataclass(frozen=True, slots=True)
class PortalState:
    """What the portal session may see: the ``organization``, the link's ``intent``, when the
    session ends, and the intent's state: ``domains`` (``domain_verification``) or ``scim``
    (``scim``); the other is null."""

    organization: PortalOrganization
    intent: Intent
    session_expires_at: datetime
    domains: list[OrganizationDomain] | None
    scim: ScimSetup | None


# --- refusals of GET /portal -------------------------------------------------------------------


LinkRefusalCode = Literal["token_consumed", "token_expired", "token_invalid_or_expired"]


@dataclass(frozen=True, slots=True)
class LinkRefusalError:
    code: LinkRefusalCode
    message: str
    details: dict[str, Any]


@dataclass(frozen=True, slots=True)
class LinkRefusal:
    """The error envelope of a setup link that cannot be opened (410)."""

    error: LinkRefusalError
