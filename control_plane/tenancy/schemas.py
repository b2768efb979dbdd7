"""Tenancy bodies: bootstrap, projects and API keys."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, Field, field_validator

from common.access_tokens import Alg
from common.auth import SCOPES
from common.schemas import DisplayName, RequestModel

MAX_DOMAINS: Final = 100
_LABEL_RE: Final = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
ONE_TIME_WARNING: Final = (
    "Store this secret now: it is shown only once and cannot be retrieved again."
)
KeyPrefix = Literal["sk_live_", "sk_test_"]


# --- API keys ----------------------------------------------------------------------------------


def _known_scopes(v: list[str]) -> list[str]:
    unknown = sorted(set(v) - SCOPES)
    if unknown:
        raise ValueError(f"unknown scopes {unknown}; allowed: {sorted(SCOPES)}")
    return sorted(set(v))


class CreateApiKey(RequestModel):
    """A new key: ``sk_live_`` or ``sk_test_``, a name, and its scopes (empty: full access; never
    more access than the creating key's)."""

    prefix: KeyPrefix
    name: DisplayName
    scopes: Annotated[list[str], AfterValidator(_known_scopes), Field(
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
    """The calling key's project: its token settings (``signing_alg``) and the ``domains`` that
    name it on public endpoints, sorted."""

    id: str
    name: str
    environment: str
    tenant_id: str
    created_at: datetime
    signing_alg: Alg
    domains: list[str]


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


class PatchProject(RequestModel):
    """``signing_alg`` (a change rotates to a key of that algorithm at once) and ``domains``
    (host names; replaces the set; a domain belongs to one project only)."""

    signing_alg: Alg | None = None
    domains: list[str] | None = None

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
    """The first tenant and project."""

    tenant_name: DisplayName
    project_name: DisplayName
    environment: DisplayName


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
class Bootstrapped:
    """The tenant, project and full-access ``sk_live_`` key bootstrap made (SPEC.md 5.3)."""

    tenant: TenantRef
    project: ProjectRef
    api_key: NewApiKey
