"""Tenancy bodies: bootstrap, projects and API keys."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, Field, StringConstraints, WithJsonSchema, field_validator

from common.access_tokens import Alg
from common.auth import SCOPES
from common.http import OMIT_IF_NONE
from common.schemas import DisplayName, RequestModel
from control_plane.passkeys.schemas import WebAuthnConfig, WebAuthnSettings
from control_plane.web.schemas import Email

MAX_DOMAINS: Final = 100
_LABEL_RE: Final = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
ONE_TIME_WARNING: Final = (
    "Store this secret now: it is shown only once and cannot be retrieved again."
)
KeyPrefix = Literal["sk_live_", "sk_test_"]
Scope = Annotated[str, WithJsonSchema({"type": "string", "enum": sorted(SCOPES)})]
"""A scope name (``common.auth.SCOPES``); another is refused by the key's validator."""


# --- API keys ----------------------------------------------------------------------------------


def known_scopes(v: list[str]) -> list[str]:
    """``v`` sorted without repeats; raises ValueError naming a scope not in DESIGN.md's list."""
    unknown = sorted(set(v) - SCOPES)
    if unknown:
        raise ValueError(f"unknown scopes {unknown}; allowed: {sorted(SCOPES)}")
    return sorted(set(v))


class CreateApiKey(RequestModel):
    """A new key: ``sk_live_`` or ``sk_test_``, a name, and its scopes (empty: full access; never
    more access than the creating key's)."""

    prefix: KeyPrefix
    name: DisplayName
    scopes: Annotated[list[Scope], AfterValidator(known_scopes), Field(
        description="Scopes of DESIGN.md's list; an empty list means full access.")]


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An API key; its secret is never shown again (``last_four`` helps tell keys apart)."""

    id: str
    name: str
    prefix: KeyPrefix
    last_four: str
    scopes: list[str]
    created_at: datetime
    revoked_at: datetime | None
    created_by_key_id: str | None


@dataclass(frozen=True, slots=True)
class NewApiKey(ApiKey):
    """A key just created, with its ``secret``: shown this once."""

    secret: str = ""
    warning: str = ONE_TIME_WARNING


# --- projects ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Project:
    """The calling key's project: its token settings (``signing_alg``), the ``domains`` that
    name it on public endpoints, sorted, the ``cors_origins`` whose pages may call its public
    endpoints besides ``webauthn.origins`` (sorted; DESIGN.md "the browser (CORS)"), and its
    passkey relying party (``webauthn``; null while passkeys are not configured)."""

    id: str
    name: str
    environment: str
    tenant_id: str
    created_at: datetime
    signing_alg: Alg
    domains: list[str]
    cors_origins: list[str]
    webauthn: WebAuthnSettings | None


def normalize_domain(value: str) -> str:
    """A host name as matched against the request's host: lower-cased, trailing dot dropped,
    internationalized names in their ASCII (IDNA ``xn--``) form; LDH labels of 1 to 63
    characters, at most 253 in all; no IP address, port, scheme or path. Raises ValueError."""
    text = value.strip().lower().removesuffix(".")
    if not text.isascii():
        try:
            text = text.encode("idna").decode("ascii")
        except UnicodeError:
            raise ValueError(f"{value!r} is not a valid host name") from None
    labels = text.split(".")
    if (
        not text or len(text) > 253 or not all(_LABEL_RE.fullmatch(label) for label in labels)
        or labels[-1].isdigit()
    ):
        raise ValueError(f"{value!r} is not a host name such as auth.example.com (no scheme, port, "
                         "path or IP address)")
    return text


_SPACE: Final = (r"\u0009-\u000d\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029"
                 r"\u202f\u205f\u3000")  # what str.strip() trims
_LABEL: Final = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
Domain = Annotated[str, WithJsonSchema({
    "anyOf": [
        # ASCII: exactly what normalize_domain takes, but for a last label starting with a digit
        # (the pattern holds no lookahead to refuse an all-digit one instead).
        {"type": "string", "maxLength": 253,
         "pattern": f"^[{_SPACE}]*(?:{_LABEL}\\.)*[A-Za-z](?:[A-Za-z0-9-]{{0,61}}[A-Za-z0-9])?"
                    f"\\.?[{_SPACE}]*$"},
        {"type": "string", "pattern": "^[^\\u0000]*[^\\u0000-\\u007f][^\\u0000]*$",
         "description": "An internationalized name, stored in its ASCII (IDNA) form; refused "
                        "when it has none."},
    ],
    "description": "A host name such as auth.example.com: no scheme, port, path or IP address; "
                   "case and a trailing dot do not matter."})]


# --- CORS origins (DESIGN.md "the browser (CORS)") ---------------------------------------------

MAX_CORS_ORIGINS: Final = 50
_HOST_LABEL: Final = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME: Final = f"{_HOST_LABEL}(?:\\.{_HOST_LABEL})*"
_OCTET: Final = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_LOOPBACK: Final = f"(?:localhost|{_HOST_NAME}\\.localhost|127(?:\\.{_OCTET}){{3}}|\\[::1\\])"
_ORIGIN_PORT: Final = ("(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}"
                       "|655[0-2][0-9]|6553[0-5])")
CORS_ORIGIN_PATTERN: Final = (f"^(?:https://(?:{_HOST_NAME}|\\[::1\\])|http://{_LOOPBACK})"
                              f"(?::{_ORIGIN_PORT})?/?$")
"""An origin as a browser sends it in ``Origin``: ``https://host[:port]``, or ``http://`` for a
loopback host only (``localhost``, a ``*.localhost`` name, ``127.x.x.x``, ``[::1]``), which
browsers treat as secure contexts (W3C Secure Contexts 3.1). No wildcard, user, path (a lone
trailing ``/`` is dropped), query or fragment; a host name's case does not matter."""
_DEFAULT_PORTS: Final = {"https": ":443", "http": ":80"}


def normalize_origin(value: str) -> str:
    """``value`` (matching :data:`CORS_ORIGIN_PATTERN`) as browsers serialize an origin (HTML
    "ASCII serialization of an origin"): lower case, no trailing ``/``, no default port."""
    text = value.lower().removesuffix("/")
    scheme = text.partition(":")[0]
    return text.removesuffix(_DEFAULT_PORTS[scheme])


CorsOrigin = Annotated[
    str, StringConstraints(max_length=300, pattern=CORS_ORIGIN_PATTERN),
    AfterValidator(normalize_origin),
    WithJsonSchema({"type": "string", "maxLength": 300, "pattern": CORS_ORIGIN_PATTERN,
                    "description": "An origin, exactly scheme://host[:port]: https, or http for a "
                                   "loopback host (localhost, *.localhost, 127.0.0.0/8, [::1]); "
                                   "no wildcard, path, query or fragment."})]


class PatchProject(RequestModel):
    """``signing_alg`` (a change rotates to a key of that algorithm at once), ``domains``
    (host names; replaces the set; a domain belongs to one project only), ``cors_origins``
    (origins whose pages may call the public endpoints with credentials, besides
    ``webauthn.origins``; replaces the set; DESIGN.md "the browser (CORS)") and ``webauthn``
    (the passkey relying party; replaces it; ``null`` turns passkeys off)."""

    signing_alg: Alg | None = None
    domains: Annotated[list[Domain], Field(max_length=MAX_DOMAINS)] | None = None
    cors_origins: Annotated[list[CorsOrigin], Field(max_length=MAX_CORS_ORIGINS)] | None = None
    webauthn: WebAuthnConfig | None = None

    @field_validator("cors_origins")
    @classmethod
    def _cors_origins(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else sorted(set(v))

    @field_validator("domains")
    @classmethod
    def _domains(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return None
        if len(v) > MAX_DOMAINS:
            raise ValueError(f"at most {MAX_DOMAINS} domains")
        return sorted({normalize_domain(d) for d in v})


# --- bootstrap ---------------------------------------------------------------------------------


class BootstrapBody(RequestModel):
    """The first tenant and project; with ``operator_email``, the tenant's first dashboard
    operator too (who signs in to the operator console at ``/console``)."""

    tenant_name: DisplayName
    project_name: DisplayName
    environment: DisplayName
    operator_email: Annotated[Email | None, Field(description=(
        "The e-mail address of the tenant's first dashboard operator, made in the same "
        "transaction; an invitation to the console is sent there."))] = None


@dataclass(frozen=True, slots=True)
class TenantRef:
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ProjectRef:
    id: str
    name: str
    environment: str


@dataclass(frozen=True, slots=True)
class OperatorRef:
    """A dashboard operator made with the bootstrap."""

    id: str
    email: str


@dataclass(frozen=True, slots=True)
class Bootstrapped:
    """The tenant, project and full-access ``sk_live_`` key bootstrap made (SPEC.md 5.3), and
    the tenant's first dashboard operator when ``operator_email`` was given (absent otherwise)."""

    tenant: TenantRef
    project: ProjectRef
    api_key: NewApiKey
    operator: OperatorRef | None = field(default=None, metadata={OMIT_IF_NONE: True})
