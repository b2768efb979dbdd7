"""Configuration: typed settings read once at start; bad config fails at start, naming the
variable (DESIGN.md "config"); the ``authio serve`` process start and graceful stop."""

from __future__ import annotations

import asyncio
import os
import re
import socket

import pytest
from aiohttp import ClientSession, ClientTimeout

from common.settings import SettingsError, load_settings
from tests.fixtures.service import AUTHIO, ROOT, free_ports, serve_process, stop_gracefully

ENV_VARS = (
    "PORT", "SERVICE_HOST", "SERVICE_ENGINE_PORT", "DATABASE_URL", "REDIS_URL",
    "SERVICE_BOOTSTRAP_TOKEN", "SERVICE_CHECK_MAX_DEPTH", "SERVICE_PG_POOL_MAX",
    "SERVICE_MAX_BODY_BYTES", "SERVICE_REDIS_PREFIX", "SERVICE_AUDIT_RETENTION_MONTHS",
    "SERVICE_LOG_LEVEL", "SERVICE_TRUSTED_PROXIES", "OTEL_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_SERVICE_NAME", "OTEL_SAMPLER_RATIO",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# --- load_settings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PORT", "abc"),
        ("PORT", "0"),
        ("PORT", "70000"),
        ("SERVICE_CHECK_MAX_DEPTH", "0"),
        ("SERVICE_CHECK_MAX_DEPTH", "deep"),
        ("DATABASE_URL", "mysql://root@127.0.0.1:3306/authio"),
        ("REDIS_URL", "http://127.0.0.1:6379"),
        ("SERVICE_PG_POOL_MAX", "0"),
        ("SERVICE_BOOTSTRAP_TOKEN", "too-short-token"),
        ("SERVICE_LOG_LEVEL", "verbose"),
        ("SERVICE_TRUSTED_PROXIES", "10.0.0.0/8,not-an-ip"),
        ("OTEL_EXPORTER", "jaeger"),
        ("OTEL_SAMPLER_RATIO", "1.5"),
        ("OTEL_SAMPLER_RATIO", "-0.1"),
        ("OTEL_SAMPLER_RATIO", "half"),
        ("OTEL_SAMPLER_RATIO", "nan"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "=value"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "bad name=value"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-a=line%0Abreak"),
    ],
)
def test_bad_value_is_rejected_naming_the_variable(
    clean_env: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    clean_env.setenv(variable, value)
    with pytest.raises(SettingsError) as exc:
        load_settings()
    message = str(exc.value)
    assert variable in message, message
    if variable == "SERVICE_BOOTSTRAP_TOKEN":
        assert value not in message, "the secret must not be echoed"
        assert "32" in message, message


def test_only_the_bad_variables_are_named(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("PORT", "abc")
    clean_env.setenv("SERVICE_CHECK_MAX_DEPTH", "0")
    clean_env.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    with pytest.raises(SettingsError) as exc:
        load_settings()
    message = str(exc.value)
    assert "PORT" in message and "SERVICE_CHECK_MAX_DEPTH" in message
    assert "REDIS_URL" not in message


def test_good_values_are_read_typed(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("PORT", "9091")
    clean_env.setenv("SERVICE_CHECK_MAX_DEPTH", "7")
    clean_env.setenv("DATABASE_URL", "postgres://u@db.example:5432/x")
    clean_env.setenv("SERVICE_BOOTSTRAP_TOKEN", "b" * 32)
    s = load_settings()
    assert s.port == 9091 and isinstance(s.port, int)
    assert s.check_max_depth == 7
    assert s.database_url == "postgres://u@db.example:5432/x"
    assert s.bootstrap_token is not None and s.bootstrap_token.get_secret_value() == "b" * 32
    assert "b" * 32 not in repr(s), "the bootstrap token must not show in reprs or logs"


def test_bootstrap_token_length_boundary(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("SERVICE_BOOTSTRAP_TOKEN", "t" * 31)
    with pytest.raises(SettingsError, match="SERVICE_BOOTSTRAP_TOKEN"):
        load_settings()
    clean_env.setenv("SERVICE_BOOTSTRAP_TOKEN", "t" * 32)
    token = load_settings().bootstrap_token
    assert token is not None and token.get_secret_value() == "t" * 32


def test_defaults_without_environment(clean_env: pytest.MonkeyPatch) -> None:
    s = load_settings()
    assert s.port == 8080
    assert s.check_max_depth == 25
    assert s.bootstrap_token is None  # bootstrap disabled, not an error
    assert s.audit_retention_months == 3 and s.audit_forward_months == 3


def test_overrides_by_field_name_are_validated_too(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(SettingsError, match="SERVICE_CHECK_MAX_DEPTH"):
        load_settings(check_max_depth=0)
    assert load_settings(port=1234).port == 1234


# --- the process ------------------------------------------------------------------------------


def _env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env.update(values)
    return env


async def test_short_bootstrap_token_stops_the_service_at_start(database_url: str,
                                                                redis_url: str) -> None:
    port = free_ports(1)[0]
    proc = await asyncio.create_subprocess_exec(
        AUTHIO, "serve", cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=_env(SERVICE_BOOTSTRAP_TOKEN="short", PORT=str(port), DATABASE_URL=database_url,
                 REDIS_URL=redis_url),
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=20)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail("authio serve kept running with a 5-character bootstrap token")
    assert proc.returncode not in (0, None), (proc.returncode, out, err)
    stderr = err.decode()
    assert "SERVICE_BOOTSTRAP_TOKEN" in stderr, stderr
    assert "32" in stderr, stderr
    assert "Traceback" not in stderr, "a clear message, not a crash dump: " + stderr
    # It never listened.
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


async def test_bad_port_stops_the_service_at_start() -> None:
    proc = await asyncio.create_subprocess_exec(
        AUTHIO, "serve", cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=_env(PORT="abc"),
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=20)
    assert proc.returncode not in (0, None)
    assert "PORT" in err.decode() and "Traceback" not in err.decode(), err


async def test_generated_bootstrap_token_is_printed_once_works_and_sigterm_exits_cleanly(
    database_url: str, redis_url: str, redis_prefix: str
) -> None:
    env = _env(DATABASE_URL=database_url, REDIS_URL=redis_url, SERVICE_REDIS_PREFIX=redis_prefix)
    async with ClientSession(timeout=ClientTimeout(total=20)) as http, \
            serve_process(http, env, "all", "--generate-bootstrap-token") as served:
        stdout = "".join(served.stdout)
        found = re.findall(r"SERVICE_BOOTSTRAP_TOKEN[^:\n]*:\s*(\S+)", stdout)
        assert len(found) == 1, stdout
        token = found[0]
        assert len(token) >= 32, token
        assert stdout.count(token) == 1, "the token is shown exactly once"
        assert token not in "".join(served.stderr), "the token must not go to the logs"

        body = {"tenant_name": "gen", "project_name": "gen", "environment": "development"}
        async with http.post(served.api.base_url + "/v1/bootstrap", json=body,
                             headers={"x-service-bootstrap-token": token + "x"}) as r:
            assert r.status == 401, await r.text()
        async with http.post(served.api.base_url + "/v1/bootstrap", json=body,
                             headers={"x-service-bootstrap-token": token}) as r:
            assert r.status == 201, await r.text()
            created = await r.json()
        async with http.get(served.api.base_url + "/v1/projects/me", headers={
                "Authorization": f"Bearer {created['api_key']['secret']}"}) as r:
            assert r.status == 200 and (await r.json())["id"] == created["project"]["id"]

        code = await stop_gracefully(served)
        assert code == 0, (code, "".join(served.stderr))
        assert "Traceback" not in "".join(served.stderr), "".join(served.stderr)


async def test_configured_token_is_used_and_none_is_generated(
    database_url: str, redis_url: str, redis_prefix: str
) -> None:
    configured = "c" * 40
    env = _env(DATABASE_URL=database_url, REDIS_URL=redis_url, SERVICE_REDIS_PREFIX=redis_prefix,
               SERVICE_BOOTSTRAP_TOKEN=configured)
    async with ClientSession(timeout=ClientTimeout(total=20)) as http, \
            serve_process(http, env, "all", "--generate-bootstrap-token") as served:
        out = "".join(served.stdout) + "".join(served.stderr)
        assert "shown once" not in out and configured not in out, out
        async with http.post(served.api.base_url + "/v1/bootstrap",
                             json={"tenant_name": "c", "project_name": "c", "environment": "dev"},
                             headers={"x-service-bootstrap-token": configured}) as r:
            assert r.status == 201, await r.text()
        assert await stop_gracefully(served) == 0
