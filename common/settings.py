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
    model_validator,
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
    pg_connect_timeout_seconds: Annotated[float, Field(gt=0, le=300)] = Field(
        5.0, validation_alias=_env("SERVICE_PG_CONNECT_TIMEOUT_SECONDS")
    )
    pg_command_timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = Field(
        30.0, validation_alias=_env("SERVICE_PG_COMMAND_TIMEOUT_SECONDS")
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
    # `authio serve engine`'s processes on its one port (engine.workers); None: one per core
    # this process may run on. `--workers` overrides it.
    engine_workers: Annotated[int, Field(ge=1, le=512)] | None = Field(
        None, validation_alias=_env("SERVICE_ENGINE_WORKERS")
    )
    # Which stores an engine replica holds (docs/sharding.md): "all" loads every store at start;
    # "on_demand" loads a store on its first check and drops it after this many idle seconds.
    engine_stores: Literal["all", "on_demand"] = Field(
        "all", validation_alias=_env("SERVICE_ENGINE_STORES")
    )
    engine_store_idle_seconds: Annotated[float, Field(gt=0, le=30 * 86_400)] = Field(
        3600.0, validation_alias=_env("SERVICE_ENGINE_STORE_IDLE_SECONDS")
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
    # TLS served by the process itself (common.tls; docs/tls.md): both files or neither, PEM;
    # the key's passphrase, when it has one, in a file of its own. Re-read on SIGHUP.
    tls_cert_file: str | None = Field(None, validation_alias=_env("SERVICE_TLS_CERT_FILE"))
    tls_key_file: str | None = Field(None, validation_alias=_env("SERVICE_TLS_KEY_FILE"))
    tls_key_password_file: str | None = Field(
        None, validation_alias=_env("SERVICE_TLS_KEY_PASSWORD_FILE"))
    # Identity (SPEC.md 2, 3 and 8). Lifetimes in seconds.
    kms_key: SecretStr | None = Field(None, validation_alias=_env("SERVICE_KMS_KEY"))
    kms_key_file: str | None = Field(None, validation_alias=_env("SERVICE_KMS_KEY_FILE"))
    access_token_ttl_seconds: Annotated[int, Field(ge=60, le=86_400)] = Field(
        900, validation_alias=_env("SERVICE_ACCESS_TOKEN_TTL_SECONDS")
    )
    session_ttl_seconds: Annotated[int, Field(ge=300, le=366 * 86_400)] = Field(
        30 * 86_400, validation_alias=_env("SERVICE_SESSION_TTL_SECONDS")
    )
    refresh_reuse_grace_seconds: Annotated[float, Field(ge=0, le=300)] = Field(
        30.0, validation_alias=_env("SERVICE_REFRESH_REUSE_GRACE_SECONDS")
    )
    magic_link_ttl_seconds: Annotated[int, Field(ge=60, le=86_400)] = Field(
        900, validation_alias=_env("SERVICE_MAGIC_LINK_TTL_SECONDS")
    )
    descope_api_url: str = Field(
        "https://api.descope.com", validation_alias=_env("SERVICE_DESCOPE_API_URL"))
    """The Descope management API the multi-tenant importer's live mode reads."""
    device_code_ttl_seconds: Annotated[int, Field(ge=60, le=3600)] = Field(
        900, validation_alias=_env("SERVICE_DEVICE_CODE_TTL_SECONDS")
    )
    """How long ``authio login``'s code waits for approval (RFC 8628 ``expires_in``)."""
    device_code_interval_seconds: Annotated[int, Field(ge=1, le=60)] = Field(
        5, validation_alias=_env("SERVICE_DEVICE_CODE_INTERVAL_SECONDS")
    )
    """The polling interval the CLI is given (RFC 8628 ``interval``; 5 s is its default)."""
    webauthn_challenge_ttl_seconds: Annotated[int, Field(ge=30, le=3600)] = Field(
        300, validation_alias=_env("SERVICE_WEBAUTHN_CHALLENGE_TTL_SECONDS")
    )
    invitation_ttl_seconds: Annotated[int, Field(ge=300, le=90 * 86_400)] = Field(
        7 * 86_400, validation_alias=_env("SERVICE_INVITATION_TTL_SECONDS")
    )
    magic_link_rate_per_destination: str = Field(
        "5/15minutes", validation_alias=_env("SERVICE_MAGIC_LINK_RATE_PER_DESTINATION")
    )
    magic_link_rate_per_ip: str = Field(
        "30/minute", validation_alias=_env("SERVICE_MAGIC_LINK_RATE_PER_IP")
    )
    signing_key_rotation_days: Annotated[float, Field(gt=0, le=3650)] = Field(
        30.0, validation_alias=_env("SERVICE_SIGNING_KEY_ROTATION_DAYS")
    )
    signing_key_prepublish_seconds: Annotated[float, Field(ge=0, le=30 * 86_400)] = Field(
        3600.0, validation_alias=_env("SERVICE_SIGNING_KEY_PREPUBLISH_SECONDS")
    )
    signing_key_check_seconds: Annotated[float, Field(gt=0)] = Field(
        300.0, validation_alias=_env("SERVICE_SIGNING_KEY_CHECK_SECONDS")
    )
    # OAuth and OpenID Connect sign-in (issue 11). The fixed providers' endpoints, overridable so
    # a deployment (or a test) can point them elsewhere; issuers as OpenID Connect Discovery
    # 1.0 names them ("{issuer}/.well-known/openid-configuration" is fetched).
    oauth_google_issuer: str = Field(
        "https://accounts.google.com", validation_alias=_env("SERVICE_OAUTH_GOOGLE_ISSUER"))
    oauth_microsoft_issuer: str = Field(
        "https://login.microsoftonline.com/common/v2.0",
        validation_alias=_env("SERVICE_OAUTH_MICROSOFT_ISSUER"))
    oauth_apple_issuer: str = Field(
        "https://appleid.apple.com", validation_alias=_env("SERVICE_OAUTH_APPLE_ISSUER"))
    oauth_github_base_url: str = Field(
        "https://github.com", validation_alias=_env("SERVICE_OAUTH_GITHUB_BASE_URL"))
    oauth_github_api_url: str = Field(
        "https://api.github.com", validation_alias=_env("SERVICE_OAUTH_GITHUB_API_URL"))
    oauth_state_ttl_seconds: Annotated[int, Field(ge=60, le=3600)] = Field(
        600, validation_alias=_env("SERVICE_OAUTH_STATE_TTL_SECONDS"))
    oauth_http_timeout_seconds: Annotated[float, Field(gt=0, le=120)] = Field(
        10.0, validation_alias=_env("SERVICE_OAUTH_HTTP_TIMEOUT_SECONDS"))
    oauth_discovery_cache_seconds: Annotated[float, Field(ge=0, le=86_400)] = Field(
        3600.0, validation_alias=_env("SERVICE_OAUTH_DISCOVERY_CACHE_SECONDS"))
    # The risk engine (issue 19; DESIGN.md "risk"). ``risk_engine=off`` signs in without scoring.
    risk_engine: Literal["on", "off"] = Field("on", validation_alias=_env("SERVICE_RISK_ENGINE"))
    geoip_database: str | None = Field(None, validation_alias=_env("SERVICE_GEOIP_DATABASE"))
    risk_blocked_networks: str = Field("", validation_alias=_env("SERVICE_RISK_BLOCKED_NETWORKS"))
    risk_velocity_window_seconds: Annotated[int, Field(ge=10, le=86_400)] = Field(
        600, validation_alias=_env("SERVICE_RISK_VELOCITY_WINDOW_SECONDS"))
    risk_ip_attempts: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        30, validation_alias=_env("SERVICE_RISK_IP_ATTEMPTS"))
    risk_destination_attempts: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        10, validation_alias=_env("SERVICE_RISK_DESTINATION_ATTEMPTS"))
    risk_failed_attempts: Annotated[int, Field(ge=1, le=1000)] = Field(
        3, validation_alias=_env("SERVICE_RISK_FAILED_ATTEMPTS"))
    risk_failed_window_seconds: Annotated[int, Field(ge=10, le=86_400)] = Field(
        900, validation_alias=_env("SERVICE_RISK_FAILED_WINDOW_SECONDS"))
    risk_travel_max_kmh: Annotated[float, Field(gt=0, le=100_000)] = Field(
        1000.0, validation_alias=_env("SERVICE_RISK_TRAVEL_MAX_KMH"))
    risk_travel_min_km: Annotated[float, Field(ge=0, le=20_100)] = Field(
        500.0, validation_alias=_env("SERVICE_RISK_TRAVEL_MIN_KM"))
    step_up_ttl_seconds: Annotated[int, Field(ge=30, le=3600)] = Field(
        300, validation_alias=_env("SERVICE_STEP_UP_TTL_SECONDS"))
    # Message delivery: the outbox worker and its sinks.
    email_sink: Literal["console", "smtp"] = Field("console", validation_alias=_env("SERVICE_EMAIL_SINK"))
    smtp_host: str | None = Field(None, validation_alias=_env("SERVICE_SMTP_HOST"))
    smtp_port: Annotated[int, Field(ge=1, le=65535)] = Field(587, validation_alias=_env("SERVICE_SMTP_PORT"))
    smtp_tls: Literal["starttls", "tls", "none"] = Field("starttls", validation_alias=_env("SERVICE_SMTP_TLS"))
    smtp_username: str | None = Field(None, validation_alias=_env("SERVICE_SMTP_USERNAME"))
    smtp_password: SecretStr | None = Field(None, validation_alias=_env("SERVICE_SMTP_PASSWORD"))
    smtp_from: str = Field("authio <no-reply@localhost>", validation_alias=_env("SERVICE_SMTP_FROM"))
    smtp_timeout_seconds: Annotated[float, Field(gt=0, le=600)] = Field(
        30.0, validation_alias=_env("SERVICE_SMTP_TIMEOUT_SECONDS")
    )
    sms_sink: Literal["console", "twilio"] = Field("console", validation_alias=_env("SERVICE_SMS_SINK"))
    # GET /v1/dev/mailbox lists what a console sink printed, live sign-in links included. Unset:
    # served only while the base URL is local (make run); true/false force it either way.
    dev_mailbox: bool | None = Field(None, validation_alias=_env("SERVICE_DEV_MAILBOX"))
    twilio_account_sid: str | None = Field(None, validation_alias=_env("SERVICE_TWILIO_ACCOUNT_SID"))
    twilio_auth_token: SecretStr | None = Field(None, validation_alias=_env("SERVICE_TWILIO_AUTH_TOKEN"))
    twilio_from: str | None = Field(None, validation_alias=_env("SERVICE_TWILIO_FROM"))
    twilio_base_url: str = Field("https://api.twilio.com", validation_alias=_env("SERVICE_TWILIO_BASE_URL"))
    outbox_poll_seconds: Annotated[float, Field(gt=0, le=3600)] = Field(
        1.0, validation_alias=_env("SERVICE_OUTBOX_POLL_SECONDS")
    )
    outbox_lease_seconds: Annotated[float, Field(gt=0, le=3600)] = Field(
        60.0, validation_alias=_env("SERVICE_OUTBOX_LEASE_SECONDS")
    )
    outbox_max_attempts: Annotated[int, Field(ge=1, le=100)] = Field(
        10, validation_alias=_env("SERVICE_OUTBOX_MAX_ATTEMPTS")
    )
    outbox_backoff_base_seconds: Annotated[float, Field(gt=0, le=3600)] = Field(
        5.0, validation_alias=_env("SERVICE_OUTBOX_BACKOFF_BASE_SECONDS")
    )
    # Webhooks (DESIGN.md "webhooks"): an attempt's time limit, the delays between attempts
    # (seconds, each +-10% jitter), and whether http and non-public addresses are allowed.
    webhook_timeout_seconds: Annotated[float, Field(gt=0, le=60)] = Field(
        10.0, validation_alias=_env("SERVICE_WEBHOOK_TIMEOUT_SECONDS"))
    webhook_retry_schedule: str = Field(
        "5,300,1800,7200,18000,36000,36000", validation_alias=_env("SERVICE_WEBHOOK_RETRY_SCHEDULE"))
    webhook_allow_private_urls: bool = Field(
        False, validation_alias=_env("SERVICE_WEBHOOK_ALLOW_PRIVATE_URLS"))
    # Audit streams (DESIGN.md "audit streams"): the most events one batch carries.
    stream_batch_size: Annotated[int, Field(ge=1, le=5000)] = Field(
        500, validation_alias=_env("SERVICE_STREAM_BATCH_SIZE"))
    # The admin portal (issue 23): how long a portal session lasts once its setup link was
    # opened, and the DNS servers domain verification asks for TXT records (comma-separated
    # ``address[:port]``, IP addresses; empty: the system's resolver, /etc/resolv.conf).
    portal_session_ttl_seconds: Annotated[int, Field(ge=300, le=86_400)] = Field(
        3600, validation_alias=_env("SERVICE_PORTAL_SESSION_TTL_SECONDS"))
    dns_resolver: str = Field("", validation_alias=_env("SERVICE_DNS_RESOLVER"))
    housekeeping_interval_seconds: Annotated[float, Field(gt=0)] = Field(
        3600.0, validation_alias=_env("SERVICE_HOUSEKEEPING_INTERVAL_SECONDS")
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

    @field_validator("kms_key")
    @classmethod
    def _kms_key(cls, v: SecretStr | None) -> SecretStr | None:
        if v is None or v.get_secret_value() == "":
            return None
        decode_kek(v.get_secret_value())  # raises ValueError; never echoes the key
        return v

    @field_validator("kms_key_file")
    @classmethod
    def _kms_key_file(cls, v: str | None) -> str | None:
        if not v:
            return None
        try:
            text = open(v, encoding="ascii").read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read {v!r}: {exc.__class__.__name__}") from None
        decode_kek(text)
        return v

    @field_validator("oauth_google_issuer", "oauth_microsoft_issuer", "oauth_apple_issuer",
                     "oauth_github_base_url", "oauth_github_api_url", "descope_api_url")
    @classmethod
    def _oauth_url(cls, v: str) -> str:
        problem = provider_url_problem(v)
        if problem:
            raise ValueError(problem)
        return v.rstrip("/")

    @field_validator("magic_link_rate_per_destination", "magic_link_rate_per_ip")
    @classmethod
    def _rate(cls, v: str) -> str:
        from limits import parse_many

        try:
            parse_many(v)
        except ValueError:
            raise ValueError("must be a rate such as '5/15minutes' or '30/minute;300/hour'") from None
        return v

    @model_validator(mode="after")
    def _sinks_configured(self) -> Settings:
        if self.email_sink == "smtp" and not self.smtp_host:
            raise ValueError("SERVICE_SMTP_HOST is required when SERVICE_EMAIL_SINK=smtp")
        if self.sms_sink == "twilio" and not (
            self.twilio_account_sid and self.twilio_auth_token and self.twilio_from
        ):
            raise ValueError("SERVICE_TWILIO_ACCOUNT_SID, SERVICE_TWILIO_AUTH_TOKEN and "
                             "SERVICE_TWILIO_FROM are required when SERVICE_SMS_SINK=twilio")
        return self

    @model_validator(mode="after")
    def _tls_files(self) -> Settings:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("SERVICE_TLS_CERT_FILE and SERVICE_TLS_KEY_FILE are given together "
                             "or not at all")
        if self.tls_key_password_file and not self.tls_key_file:
            raise ValueError("SERVICE_TLS_KEY_PASSWORD_FILE needs SERVICE_TLS_KEY_FILE")
        if self.tls_cert_file and self.tls_key_file:
            from common.tls import server_context

            try:  # the files make a usable pair now, rather than at the first handshake
                server_context(self.tls_cert_file, self.tls_key_file, self.tls_key_password_file)
            except (OSError, ValueError) as exc:
                raise ValueError(f"SERVICE_TLS_CERT_FILE/SERVICE_TLS_KEY_FILE: {exc}") from None
        return self

    @property
    def tls_enabled(self) -> bool:
        """Whether the services serve HTTPS themselves (``SERVICE_TLS_CERT_FILE`` is set)."""
        return bool(self.tls_cert_file)

    def kek(self) -> bytes | None:
        """The KMS key-encryption key (32 bytes) from ``SERVICE_KMS_KEY`` or the file named by
        ``SERVICE_KMS_KEY_FILE`` (base64 text), or None when neither is set."""
        if self.kms_key is not None:
            return decode_kek(self.kms_key.get_secret_value())
        if self.kms_key_file:
            with open(self.kms_key_file, encoding="ascii") as f:
                return decode_kek(f.read())
        return None

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

    @field_validator("geoip_database")
    @classmethod
    def _geoip_database(cls, v: str | None) -> str | None:
        if not v:
            return None
        import maxminddb

        try:
            with maxminddb.open_database(v) as reader:
                kind = reader.metadata().database_type
        except (OSError, ValueError, maxminddb.InvalidDatabaseError) as exc:
            raise ValueError(f"cannot open {v!r} as a MaxMind database: {exc}") from None
        if "City" not in kind:
            raise ValueError(f"{v!r} is a {kind!r} database; the geo signals need a City database "
                             "(GeoLite2-City, GeoIP2-City or one of that layout)")
        return v

    @field_validator("trusted_proxies", "risk_blocked_networks")
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
        return _network_list(self.trusted_proxies)

    @property
    def risk_blocked_network_list(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        """``SERVICE_RISK_BLOCKED_NETWORKS`` parsed: the known-bad networks of the risk engine."""
        return _network_list(self.risk_blocked_networks)

    @field_validator("webhook_retry_schedule")
    @classmethod
    def _schedule(cls, value: str) -> str:
        _delays(value)
        return value

    @property
    def webhook_retry_delays(self) -> tuple[float, ...]:
        """``SERVICE_WEBHOOK_RETRY_SCHEDULE`` parsed: the seconds before each retry."""
        return _delays(self.webhook_retry_schedule)

    @field_validator("dns_resolver")
    @classmethod
    def _dns_resolver(cls, v: str) -> str:
        _nameservers(v)
        return v

    @property
    def dns_nameservers(self) -> tuple[tuple[str, int], ...]:
        """``SERVICE_DNS_RESOLVER`` parsed: ``(address, port)`` of each DNS server to ask, or
        none (the system's resolver)."""
        return _nameservers(self.dns_resolver)

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
        """The ``iss`` and link base: ``SERVICE_BASE_URL`` or ``http://localhost:<PORT>``
        (``https://`` when the service serves TLS itself: the port answers nothing else)."""
        scheme = "https" if self.tls_enabled else "http"
        return (self.base_url or f"{scheme}://localhost:{self.port}").rstrip("/")

    @property
    def base_url_is_local(self) -> bool:
        """Whether ``public_base_url`` names this machine: ``localhost``, ``*.localhost``
        (RFC 6761 6.3) or a loopback address. Local development, not a deployment."""
        return is_loopback_host(urlsplit(self.public_base_url).hostname)

    @property
    def serves_dev_mailbox(self) -> bool:
        """``GET /v1/dev/mailbox`` is served: a console sink is configured and either
        ``SERVICE_DEV_MAILBOX=true`` or, unset, the base URL is local."""
        console = self.email_sink == "console" or self.sms_sink == "console"
        return console and (self.dev_mailbox if self.dev_mailbox is not None else self.base_url_is_local)


def _delays(text: str) -> tuple[float, ...]:
    """Comma-separated delays in seconds, each 0 to 7 days (an empty text: no retry). Raises
    ValueError."""
    try:
        delays = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError("must be comma-separated numbers of seconds, e.g. 5,300,1800") from None
    if any(not 0 <= d <= 7 * 86_400 for d in delays) or len(delays) > 50:
        raise ValueError("each delay is 0 to 604800 seconds, at most 50 of them")
    return delays


def _nameservers(text: str) -> tuple[tuple[str, int], ...]:
    """Comma-separated DNS servers, each an IP address with an optional port (``10.0.0.2``,
    ``127.0.0.1:5353``, ``[::1]:53``; 53 when left out). Raises ValueError."""
    found = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        host, port = part, "53"
        if part.startswith("["):
            host, _, rest = part[1:].partition("]")
            if rest:
                if not rest.startswith(":"):
                    raise ValueError(f"{part!r} is not address[:port]")
                port = rest[1:]
        elif part.count(":") == 1:
            host, port = part.split(":")
        try:
            address = str(ipaddress.ip_address(host))
        except ValueError:
            raise ValueError(f"{part!r}: a DNS server is an IP address with an optional port, "
                             "such as 127.0.0.1:5353 or [::1]:53") from None
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"{part!r}: the port must be 1 to 65535")
        found.append((address, int(port)))
    return tuple(found)


def _network_list(text: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """Comma-separated IPs and CIDRs (validated at start) as networks."""
    return tuple(ipaddress.ip_network(p.strip(), strict=False) for p in text.split(",") if p.strip())


def decode_kek(text: str) -> bytes:
    """A key-encryption key written as base64 (standard or URL-safe) of exactly 32 bytes.

    Raises ValueError without echoing the value. Make one with
    ``python -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())'``.
    """
    import base64
    import binascii

    raw = text.strip()
    try:
        key = base64.b64decode(raw.replace("-", "+").replace("_", "/") + "=" * (-len(raw) % 4),
                               validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("must be base64 of 32 random bytes") from None
    if len(key) != 32:
        raise ValueError(f"must decode to 32 bytes (AES-256), not {len(key)}")
    return key


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
            msg = str(err["msg"]).removeprefix("Value error, ")
            if err["loc"]:
                loc = str(err["loc"][0])
                lines.append(f"{_FIELD_ENV.get(loc, loc)}: {msg}")
            else:  # a rule across variables names them in its message
                lines.append(msg)
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(lines)) from None


def is_loopback_host(host: str | None) -> bool:
    """Whether ``host`` names this machine: ``localhost``, ``*.localhost`` (RFC 6761 6.3) or a
    loopback address."""
    host = (host or "").lower().strip("[]")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_internal_host(host: str | None) -> bool:
    """Whether ``host``, as written, names this machine or a link-local address (cloud metadata
    services live at 169.254.169.254): where a provider configured by a project must not send
    the service in a deployment. Names are judged as written, not resolved."""
    if is_loopback_host(host):
        return True
    try:
        address = ipaddress.ip_address((host or "").strip("[]"))
    except ValueError:
        return False
    return address.is_link_local or address.is_unspecified


def provider_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be an OAuth provider's issuer or base URL, or None: it must be an
    absolute https URL with a host, no query or fragment; http only for a loopback host (a
    provider on this machine, in development and tests)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError:
        return "must be a URL"
    if not parts.hostname or parts.query or parts.fragment or parts.username or parts.password:
        return "must be an absolute URL with a host and no query, fragment or credentials"
    if parts.scheme == "https" or (parts.scheme == "http" and is_loopback_host(parts.hostname)):
        return None
    return "must use https (http only for a loopback host)"
