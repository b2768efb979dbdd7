"""Passkey bodies: a project's relying party, the options and verify bodies of the two
ceremonies (WebAuthn Level 3's JSON forms, ``PublicKeyCredentialCreationOptionsJSON`` and
``PublicKeyCredentialRequestOptionsJSON`` out, a browser's ``PublicKeyCredential.toJSON()`` in),
and a stored passkey."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Final, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)

from common.http import OMIT_IF_NONE
from common.schemas import RequestModel, integral, name_pattern, printable
from control_plane.web.schemas import Email, Metadata

MAX_ORIGINS: Final = 20
UserVerification = Literal["preferred", "required"]
"""Whether the authenticator must verify the user (PIN, biometrics): ``required`` refuses a
response without the UV flag; ``preferred`` asks for it and accepts its absence."""

Base64Url = Annotated[str, StringConstraints(min_length=1, max_length=65_536,
                                             pattern=r"^[A-Za-z0-9_-]+={0,2}$")]
"""Bytes in base64url (RFC 4648 section 5), as WebAuthn's JSON forms write them."""


_LABELS: Final = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*"
_PORT: Final = (r"([0-9]{1,4}|0[0-9]{4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]"
                r"|6553[0-5])")
RP_ID_PATTERN: Final = f"^{_LABELS}$"
ORIGIN_PATTERN: Final = f"^(https://{_LABELS}|http://(localhost|{_LABELS}\\.localhost))(:{_PORT})?/?$"
"""An origin as browsers write it in ``clientDataJSON``, lower case: ``https://host[:port]``, or
``http://localhost[:port]`` (and its subdomains), which browsers treat as secure; a trailing
``/`` is dropped."""

PasskeyName = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100),
    AfterValidator(printable),
    WithJsonSchema({"type": "string", "pattern": name_pattern(100, required=True),
                    "description": "1 to 100 characters after trimming whitespace, none of them "
                                   "a control character."}),
]
Origin = Annotated[str, StringConstraints(max_length=300, pattern=ORIGIN_PATTERN)]


class WebAuthnConfig(RequestModel):
    """A project's relying party (``PATCH /v1/projects/me`` ``webauthn``): ``rp_id`` the
    registrable domain credentials are scoped to (``example.com`` serves ``app.example.com``
    too), ``rp_name`` what authenticators show, ``origins`` every origin a ceremony may run on
    (each on ``rp_id`` or a subdomain of it), ``user_verification``."""

    rp_id: Annotated[str, StringConstraints(max_length=253, pattern=RP_ID_PATTERN)]
    rp_name: PasskeyName
    origins: Annotated[list[Origin], Field(min_length=1, max_length=MAX_ORIGINS)]
    user_verification: UserVerification = "preferred"

    @field_validator("origins")
    @classmethod
    def _origins(cls, v: list[str], info: ValidationInfo) -> list[str]:
        origins = sorted({o.removesuffix("/") for o in v})
        rp_id = info.data.get("rp_id")
        if rp_id:
            for origin in origins:
                host = urlsplit(origin).hostname or ""
                if host != rp_id and not host.endswith("." + rp_id):
                    raise ValueError(f"{origin} is not on {rp_id} or a subdomain of it")
        return origins


@dataclass(frozen=True, slots=True)
class WebAuthnSettings:
    """A project's relying party as stored (origins sorted)."""

    rp_id: str
    rp_name: str
    origins: list[str]
    user_verification: UserVerification


# --- options ------------------------------------------------------------------------------------


class RegistrationOptionsBody(RequestModel):
    """``name``: what the user calls this passkey (stored with it; default ``Passkey``)."""

    name: PasskeyName | None = None


class AuthenticationOptionsBody(RequestModel):
    """Without ``email``: any discoverable credential of the project (usernameless, passkey
    autofill); with it, that user's credentials are listed in ``allowCredentials``."""

    email: Email | None = None


@dataclass(frozen=True, slots=True)
class RelyingParty:
    name: str
    id: str


@dataclass(frozen=True, slots=True)
class UserEntity:
    """``id`` is the user handle (base64url) the authenticator stores with the credential."""

    id: str
    name: str
    displayName: str


@dataclass(frozen=True, slots=True)
class CredentialParameters:
    type: Literal["public-key"]
    alg: int


@dataclass(frozen=True, slots=True)
class CredentialDescriptor:
    """A credential by its id (base64url), with the transports it was registered over."""

    type: Literal["public-key"]
    id: str
    transports: list[str] | None = field(default=None, metadata={OMIT_IF_NONE: True})


@dataclass(frozen=True, slots=True)
class AuthenticatorSelection:
    residentKey: Literal["discouraged", "preferred", "required"] | None = field(
        default=None, metadata={OMIT_IF_NONE: True})
    requireResidentKey: bool | None = field(default=None, metadata={OMIT_IF_NONE: True})
    userVerification: Literal["discouraged", "preferred", "required"] | None = field(
        default=None, metadata={OMIT_IF_NONE: True})
    authenticatorAttachment: Literal["platform", "cross-platform"] | None = field(
        default=None, metadata={OMIT_IF_NONE: True})


@dataclass(frozen=True, slots=True)
class CreationOptions:
    """``PublicKeyCredentialCreationOptionsJSON``: pass to
    ``PublicKeyCredential.parseCreationOptionsFromJSON`` and ``navigator.credentials.create``.
    ``timeout`` in milliseconds."""

    rp: RelyingParty
    user: UserEntity
    challenge: str
    pubKeyCredParams: list[CredentialParameters]
    timeout: int
    excludeCredentials: list[CredentialDescriptor]
    authenticatorSelection: AuthenticatorSelection
    attestation: Literal["none", "indirect", "direct", "enterprise"]
    hints: list[str] | None = field(default=None, metadata={OMIT_IF_NONE: True})


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """``PublicKeyCredentialRequestOptionsJSON``: pass to
    ``PublicKeyCredential.parseRequestOptionsFromJSON`` and ``navigator.credentials.get``
    (``mediation: "conditional"`` for passkey autofill). ``timeout`` in milliseconds; an empty
    ``allowCredentials`` lets the user pick any passkey of the site."""

    challenge: str
    timeout: int
    rpId: str
    allowCredentials: list[CredentialDescriptor]
    userVerification: Literal["discouraged", "preferred", "required"]


# --- verify bodies ------------------------------------------------------------------------------


class _CredentialJSON(RequestModel):
    id: Base64Url
    rawId: Base64Url
    type: Literal["public-key"]
    authenticatorAttachment: Literal["platform", "cross-platform"] | None = None
    clientExtensionResults: Metadata = Field(default_factory=dict)


class AttestationResponse(RequestModel):
    """``AuthenticatorAttestationResponseJSON``."""

    clientDataJSON: Base64Url
    attestationObject: Base64Url
    authenticatorData: Base64Url | None = None
    transports: list[Annotated[str, StringConstraints(max_length=32)]] | None = Field(
        default=None, max_length=16)
    publicKey: Base64Url | None = None
    publicKeyAlgorithm: Annotated[int | None, BeforeValidator(integral)] = None


class RegistrationResponseBody(_CredentialJSON):
    """``RegistrationResponseJSON``: what ``PublicKeyCredential.toJSON()`` gives after
    ``navigator.credentials.create``."""

    response: AttestationResponse


class AssertionResponse(RequestModel):
    """``AuthenticatorAssertionResponseJSON``."""

    clientDataJSON: Base64Url
    authenticatorData: Base64Url
    signature: Base64Url
    userHandle: Base64Url | None = None


class AuthenticationResponseBody(_CredentialJSON):
    """``AuthenticationResponseJSON``: what ``PublicKeyCredential.toJSON()`` gives after
    ``navigator.credentials.get``."""

    response: AssertionResponse


# --- passkeys -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Passkey:
    """A registered credential. ``credential_id`` is base64url; ``sign_count`` stays 0 for
    authenticators that do not count (synced passkeys); ``backup_eligible`` and
    ``backup_state`` are the BE and BS flags (a synced passkey is both); ``aaguid`` names the
    authenticator's model (all zeros when it does not say)."""

    id: str
    user_id: str
    credential_id: str
    name: str
    transports: list[str]
    aaguid: str
    sign_count: int
    backup_eligible: bool
    backup_state: bool
    created_at: datetime
    last_used_at: datetime | None


@dataclass(frozen=True, slots=True)
class PasskeyList:
    """A user's passkeys, oldest first."""

    data: list[Passkey]
