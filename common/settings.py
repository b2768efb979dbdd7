"""Typed settings, read once from the environment at start.

Variable names are the spec's where it names them (``PORT``, ``DATABASE_URL``, ``REDIS_URL``,
``SERVICE_BOOTSTRAP_TOKEN``, ``SERVICE_AUDIT_*``, ``OTEL_*``) and ``SERVICE_*`` otherwise.
A bad value stops the service at start with a message naming the variable (``SettingsError``).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

_MIN_BOOTSTRAP_TOKEN = 32  # SPEC.md 5.3 and section 8
_HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110 5.6.2)


class SettingsError(Exception):
    """The environment holds a bad value; the message names the variable."""


def _env(name: str) -> AliasChoices:
    return AliasChoices(name)


class Settings(BaseSettings):
    """Process configuration. Units are in the field names (``_seconds``, ``_ms``)."""

    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", frozen=True)

    host: str = Field("127.0.0.1", validation_alias=_env("SERVICE_HOST"))
    port: Annotated[int, Field(ge=1, le=65535)] = Field(8080, validation_alias=_env("PORT"))
    engine_port: Annotated[int, Field(ge=1, le=65535)] = Field(
        8081, validation_alias=_env("SERVICE_ENGINE_PORT")
    )
    base_url: str | None = Field(None, validation_alias=_env("SERVICE_BASE_URL"))
    database_url: str = Field(
        "postgresql://postgres@127.0.0.1:5432/authio", validation_alias=_env("DATABASE_URL")
    )
    redis_url: str = Field("redis://127.0.0.1:6379/0", validation_alias=_env("REDIS_URL"))
    redis_prefix: str = Field("authio:", validation_alias=_env("SERVICE_REDIS_PREFIX"))
    bootstrap_token: SecretStr | None = Field(None, validation_alias=_env("SERVICE_BOOTSTRAP_TOKEN"))
    pg_pool_max: Annotated[int, Field(ge=1, le=1000)] = Field(
        10, validation_alias=_env("SERVICE_PG_POOL_MAX")
    )
    api_key_cache_seconds: Annotated[float, Field(gt=0, le=3600)] = Field(
        1.0, validation_alias=_env("SERVICE_API_KEY_CACHE_SECONDS")
    )
    check_max_depth: Annotated[int, Field(ge=1, le=10_000)] = Field(
        25, validation_alias=_env("SERVICE_CHECK_MAX_DEPTH")
    )
    consistency_timeout_ms: Annotated[int, Field(ge=0, le=60_000)] = Field(
        2000, validation_alias=_env("SERVICE_CONSISTENCY_TIMEOUT_MS")
    )
    engine_poll_seconds: Annotated[float, Field(gt=0, le=3600)] = Field(
        1.0, validation_alias=_env("SERVICE_ENGINE_POLL_SECONDS")
    )
    audit_forward_months: Annotated[int, Field(ge=1, le=120)] = Field(
        3, validation_alias=_env("SERVICE_AUDIT_FORWARD_MONTHS")
    )
    audit_retention_months: Annotated[int, Field(ge=1, le=1200)] = Field(
        3, validation_alias=_env("SERVICE_AUDIT_RETENTION_MONTHS")
    )
    audit_partition_interval_seconds: Annotated[float, Field(gt=0)] = Field(
        86_400.0, validation_alias=_env("SERVICE_AUDIT_PARTITION_INTERVAL_SECONDS")
    )
    max_body_bytes: Annotated[int, Field(ge=1024)] = Field(
        4 * 1024 * 1024, validation_alias=_env("SERVICE_MAX_BODY_BYTES")
    )
    trusted_proxies: str = Field("", validation_alias=_env("SERVICE_TRUSTED_PROXIES"))
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        "INFO", validation_alias=_env("SERVICE_LOG_LEVEL")
    )
    # Telemetry (SPEC.md 1.3): these five variables alone configure tracing (common.telemetry).
    otel_exporter: Literal["stdout", "otlp", "none"] = Field(
        "stdout", validation_alias=_env("OTEL_EXPORTER")
    )
    otel_exporter_otlp_endpoint: str | None = Field(
        None, validation_alias=_env("OTEL_EXPORTER_OTLP_ENDPOINT"), validate_default=True
    )
    otel_exporter_otlp_headers: SecretStr | None = Field(
        None, validation_alias=_env("OTEL_EXPORTER_OTLP_HEADERS")
    )
    otel_service_name: str | None = Field(None, validation_alias=_env("OTEL_SERVICE_NAME"))
    otel_sampler_ratio: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] = Field(
        1.0, validation_alias=_env("OTEL_SAMPLER_RATIO")
    )

    @field_validator("bootstrap_token")
    @classmethod
    def _bootstrap_token_length(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and v.get_secret_value() == "":
            return None
        if v is not None and len(v.get_secret_value()) < _MIN_BOOTSTRAP_TOKEN:
            raise ValueError(
                f"must be at least {_MIN_BOOTSTRAP_TOKEN} characters (SPEC.md 5.3); "
                "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )
        return v

    @field_validator("otel_exporter", mode="before")
    @classmethod
    def _exporter_name(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v

    @field_validator("otel_exporter_otlp_endpoint")
    @classmethod
    def _otlp_endpoint(cls, v: str | None, info: ValidationInfo) -> str | None:
        v = v.strip() if v else None
        if v is None:
            if info.data.get("otel_exporter") == "otlp":
                raise ValueError("required when OTEL_EXPORTER=otlp (the collector's base URL, "
                                 "for example http://127.0.0.1:4318)")
            return None
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL")
        return v

    @field_validator("otel_exporter_otlp_headers")
    @classmethod
    def _otlp_headers(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            parse_otlp_headers(v.get_secret_value())  # raises ValueError; never echoes values
        return v

    @field_validator("otel_service_name")
    @classmethod
    def _service_name(cls, v: str | None) -> str | None:
        if v is None:
            return None
        return v.strip() or None

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, v: str) -> str:
        for part in filter(None, (p.strip() for p in v.split(","))):
            try:
                ipaddress.ip_network(part, strict=False)
            except ValueError:
                raise ValueError(f"{part!r} is not an IP address or CIDR network") from None
        return v

    @property
    def trusted_proxy_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        """``SERVICE_TRUSTED_PROXIES`` parsed: the proxies whose ``X-Forwarded-For`` we believe."""
        return tuple(ipaddress.ip_network(p.strip(), strict=False)
                     for p in self.trusted_proxies.split(",") if p.strip())

    @field_validator("database_url")
    @classmethod
    def _pg_url(cls, v: str) -> str:
        if not v.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL")
        return v

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, v: str) -> str:
        if not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return v

    @property
    def otlp_headers(self) -> dict[str, str]:
        """``OTEL_EXPORTER_OTLP_HEADERS`` parsed (names lowercased, values percent-decoded)."""
        raw = self.otel_exporter_otlp_headers
        return parse_otlp_headers(raw.get_secret_value()) if raw is not None else {}

    @property
    def public_base_url(self) -> str:
        """The ``iss`` and link base: ``SERVICE_BASE_URL`` or ``http://localhost:<PORT>``."""
        return (self.base_url or f"http://localhost:{self.port}").rstrip("/")


def parse_otlp_headers(raw: str) -> dict[str, str]:
    """``k=v,k2=v2`` as the OpenTelemetry spec defines ``OTEL_EXPORTER_OTLP_HEADERS``: entries
    separated by commas, whitespace around names and values ignored, values percent-encoded
    (``Bearer%20xyz``), empty entries skipped.

    Raises ValueError naming the bad entry by position only: header values are credentials.
    """
    headers: dict[str, str] = {}
    for n, entry in enumerate(raw.split(","), start=1):
        if not entry.strip():
            continue
        name, sep, value = entry.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"entry {n} is not of the form name=value")
        if not _HEADER_NAME_RE.match(name):
            raise ValueError(f"entry {n}: the header name is not a valid HTTP header name")
        decoded = unquote(value.strip())
        if any(c in decoded for c in "\r\n\x00"):
            raise ValueError(f"entry {n}: the value holds a line break or NUL")
        headers[name.lower()] = decoded
    return headers


_FIELD_ENV = {
    name: str(f.validation_alias.choices[0])
    for name, f in Settings.model_fields.items()
    if isinstance(f.validation_alias, AliasChoices)
}


def load_settings(**overrides: object) -> Settings:
    """Read the environment (plus ``overrides`` by field name, used by tests and the CLI).

    Raises SettingsError naming each bad variable.
    """
    try:
        return Settings.model_validate({_FIELD_ENV.get(k, k): v for k, v in overrides.items()})
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = str(err["loc"][0]) if err["loc"] else "?"
            lines.append(f"{_FIELD_ENV.get(loc, loc)}: {err['msg']}")
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(lines)) from None
