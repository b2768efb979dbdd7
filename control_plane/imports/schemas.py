"""Bodies of the device authorization grant behind ``authio login`` (RFC 8628; DESIGN.md "CLI
login and import") and of the multi-tenant importer's live-mode credentials."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, Field, StringConstraints, WithJsonSchema

from common.auth import SCOPES
from common.schemas import RequestModel
from control_plane.tenancy.schemas import Scope, known_scopes

GRANT_TYPE: Final = "urn:ietf:params:oauth:grant-type:device_code"
"""RFC 8628 section 3.4."""
USER_CODE_ALPHABET: Final = "BCDFGHJKLMNPQRSTVWXZ"
"""RFC 8628 section 6.1: consonants only, no vowels (no words), no digits (no 0/O, 1/I)."""
USER_CODE_PATTERN: Final = f"^[{USER_CODE_ALPHABET}{USER_CODE_ALPHABET.lower()}]{{4}}-?" \
                           f"[{USER_CODE_ALPHABET}{USER_CODE_ALPHABET.lower()}]{{4}}$"
IMPORT_SCOPES: Final = ("organizations:write", "users:read", "users:write")
"""What a CLI key gets unless the approver says otherwise: what ``authio import`` calls."""
Scopes = Annotated[list[Scope], AfterValidator(known_scopes), Field(
    min_length=1, description="Scopes of the CLI's new key (never empty: a device never gets "
                              "full access).")]
_SCOPE: Final = "(?:" + "|".join(sorted(SCOPES)) + ")"
SCOPE_PATTERN: Final = f"^(?:{_SCOPE}(?: {_SCOPE})*)?$"
"""Space-separated scope names (RFC 6749 3.3), each of DESIGN.md's list."""
DeviceError = Literal["authorization_pending", "slow_down", "expired_token", "access_denied",
                      "invalid_grant", "invalid_request", "unsupported_grant_type"]


class DeviceCodeBody(RequestModel):
    """``POST /v1/cli/device/code`` (form or JSON): who asks, and for what (RFC 8628 3.1)."""

    client_id: Annotated[str, StringConstraints(min_length=1, max_length=100,
                                                pattern=r"^[!-~]+$")] = "authio-cli"
    scope: Annotated[str, StringConstraints(max_length=500, pattern=SCOPE_PATTERN), Field(
        description="Space-separated scopes asked for (default: what an import needs); the "
                    "approver decides.")] | None = None


@dataclass(frozen=True, slots=True)
class DeviceCode:
    """RFC 8628 section 3.2's answer."""

    device_code: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str
    expires_in: int
    interval: int


class DeviceTokenBody(RequestModel):
    """``POST /v1/cli/device/token`` (form or JSON; RFC 8628 3.4)."""

    grant_type: Annotated[str, StringConstraints(max_length=200), WithJsonSchema(
        {"type": "string", "enum": [GRANT_TYPE]})]
    device_code: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    client_id: Annotated[str, StringConstraints(max_length=100)] | None = None


@dataclass(frozen=True, slots=True)
class DeviceToken:
    """The access token of an approved device: a new ``sk_live_`` key of the approver's project,
    shown this once."""

    access_token: str
    token_type: Literal["Bearer"]
    project_id: str
    key_id: str
    scope: str


@dataclass(frozen=True, slots=True)
class DeviceTokenError:
    """An OAuth 2.0 error body (RFC 6749 5.2, RFC 8628 3.5), answered with 400."""

    error: DeviceError
    error_description: str


class ApproveBody(RequestModel):
    """``POST /v1/cli/device/approve``: the code the CLI shows, and what its key may do."""

    user_code: Annotated[str, StringConstraints(pattern=USER_CODE_PATTERN), Field(
        description="The code the CLI printed (XXXX-XXXX; any case, hyphen optional).")]
    scopes: Scopes | None = None
    decision: Annotated[Literal["approve", "deny"], Field(
        description="`deny` refuses the device: its poll answers `access_denied`.")] = "approve"


@dataclass(frozen=True, slots=True)
class Approval:
    """What was decided for a device."""

    user_code: str
    status: Literal["approved", "denied"]
    project_id: str
    scopes: list[str]
    client_id: str
    expires_in: int


class CredentialBody(RequestModel):
    """``POST /v1/imports/credentials``: a management token of an origin's project, for the
    multi-tenant importer's live mode (sealed at once, never shown again)."""

    provider: Annotated[Literal["descope"], Field(description="The origin provider.")]
    source_project_id: Annotated[str, StringConstraints(min_length=1, max_length=200,
                                                        pattern=r"^[!-~]+$"), Field(
        description="The origin's project id (Descope's `P...`).")]
    token: Annotated[str, StringConstraints(min_length=1, max_length=4096, pattern=r"^[!-~]+$"),
                     Field(description="The origin's management key; stored sealed, deleted "
                                       "within 24 hours.")]


@dataclass(frozen=True, slots=True)
class ImportCredential:
    """A live-mode credential as the API shows it (never its token)."""

    id: str
    provider: str
    source_project_id: str
    created_at: datetime
    expires_at: datetime
