"""The fresh-machine path of ``devtools``, for real (no mocks).

Every run forces private PostgreSQL and Redis instances on free ports of their own in a fresh
temporary directory, so the path a machine with nothing running takes is proven on every CI run,
not only the "already running" one. The temporary directory is created ``0700`` by root on CI,
like a home the unprivileged PostgreSQL user cannot enter: the cluster must run without any
directory outside the run directory and the cluster's own home changing its mode.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from devtools import DevServicesError, ServiceUrls, ensure_services, remove_private, stop_private
from devtools.services import STATE_DIR, TEMP_STATE_DIR
from tests.fixtures.service import free_ports


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


async def _pg_facts(url: str) -> tuple[int, str, bool]:
    """``SELECT 1``, the current database, and whether database ``authio`` exists."""
    conn = await asyncpg.connect(url, timeout=10)
    try:
        one = await conn.fetchval("SELECT 1")
        current = await conn.fetchval("SELECT current_database()")
        exists = await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", "authio")
        return one, current, exists
    finally:
        await conn.close()


async def _redis_ping(url: str) -> bool:
    client = aioredis.Redis.from_url(url, socket_connect_timeout=5)
    try:
        return bool(await client.ping())
    finally:
        await client.aclose()


def _postmaster_pid(run_dir: Path) -> int:
    return int((run_dir / "pg" / "postmaster.pid").read_text().splitlines()[0])


def _modes(paths: list[Path]) -> dict[Path, int]:
    return {p: stat.S_IMODE(p.stat().st_mode) for p in paths if p.exists()}


@pytest.fixture
def run_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="authio-devservices-"))  # mode 0700, like a fresh home
    run = base / "run"
    try:
        yield run
    finally:
        remove_private(run, log=lambda _: None)  # as root, the cluster's home is outside base
        shutil.rmtree(base, ignore_errors=True)


def test_private_instances_start_answer_are_reused_and_stop(run_dir: Path, tmp_path: Path) -> None:
    pg_port, redis_port = free_ports(2)
    expected_db = f"postgresql://postgres@127.0.0.1:{pg_port}/authio"
    expected_redis = f"redis://127.0.0.1:{redis_port}/0"

    def ensure(messages: list[str], **overrides: object) -> ServiceUrls:
        options: dict[str, object] = {
            "run_dir": run_dir,
            "database_url": None,
            "redis_url": None,
            "force_private": True,
            "private_pg_port": pg_port,
            "private_redis_port": redis_port,
            "log": messages.append,
        }
        options.update(overrides)
        return ensure_services(**options)  # type: ignore[arg-type]

    # First call: initdb + start both, as on a fresh machine.
    outside = [run_dir.parent, *run_dir.parent.parents, *STATE_DIR.parents, *TEMP_STATE_DIR.parents]
    modes_before = _modes(outside)
    first_log: list[str] = []
    began = time.monotonic()
    first = ensure(first_log)
    assert time.monotonic() - began < 45, first_log
    assert first == ServiceUrls(expected_db, expected_redis, ("postgres", "redis"))
    assert any("initdb" in line for line in first_log), first_log
    assert asyncio.run(_pg_facts(first.database_url)) == (1, "authio", True)
    assert asyncio.run(_redis_ping(first.redis_url))
    # No directory outside the run directory and the cluster's home changed its mode (the
    # base directory is 0700, closed to the PostgreSQL user), and the cluster lives in one or
    # the other.
    assert _modes(outside) == modes_before, first_log
    data_dir = (run_dir / "pg").resolve()
    assert data_dir.is_relative_to(run_dir.resolve()) or data_dir.parent.parent in (STATE_DIR, TEMP_STATE_DIR)
    if os.geteuid() == 0:  # PostgreSQL refuses root: the cluster belongs to an unprivileged user
        assert (run_dir / "pg").stat().st_uid != 0
    pid = _postmaster_pid(run_dir)

    # Second call: reuses the running instances, no second initdb, no restart.
    second_log: list[str] = []
    assert ensure(second_log) == ServiceUrls(expected_db, expected_redis, ())
    assert not any("initdb" in line for line in second_log), second_log
    assert _postmaster_pid(run_dir) == pid

    # Without force_private, servers answering on the default ports are used as they are
    # (nothing is created under run_dir).
    elsewhere = tmp_path / "unused-run-dir"
    answering = ensure(
        [],
        run_dir=elsewhere,
        force_private=False,
        pg_port=pg_port,
        redis_port=redis_port,
        private_pg_port=1,
        private_redis_port=1,
    )
    assert answering == ServiceUrls(expected_db, expected_redis, ())
    # ... and configured URLs win over everything.
    configured = ensure(
        [],
        run_dir=elsewhere,
        force_private=False,
        database_url=expected_db,
        redis_url=expected_redis,
        pg_port=1,
        redis_port=1,
    )
    assert configured == ServiceUrls(expected_db, expected_redis, ())
    assert not elsewhere.exists()

    # Stop: both ports close.
    stop_private(run_dir, log=lambda _: None)
    assert not _port_open(pg_port)
    assert not _port_open(redis_port)

    # Start again after a stop: the data directory is kept, so no new initdb.
    again_log: list[str] = []
    assert ensure(again_log) == ServiceUrls(expected_db, expected_redis, ("postgres", "redis"))
    assert not any("initdb" in line for line in again_log), again_log
    assert asyncio.run(_pg_facts(expected_db)) == (1, "authio", True)
    stop_private(run_dir, log=lambda _: None)
    assert not _port_open(pg_port)
    assert not _port_open(redis_port)


def test_configured_urls_that_do_not_answer_are_errors(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    with pytest.raises(DevServicesError, match=r"DATABASE_URL=.* does not answer"):
        ensure_services(
            run_dir=tmp_path,
            database_url=f"postgresql://postgres@127.0.0.1:{port}/x",
            redis_url=None,
            log=lambda _: None,
            connect_timeout=1.0,
        )
    with pytest.raises(DevServicesError, match=r"REDIS_URL=.* does not answer"):
        ensure_services(
            run_dir=tmp_path,
            database_url=None,
            redis_url=f"redis://127.0.0.1:{port}/0",
            log=lambda _: None,
            connect_timeout=1.0,
            pg_port=1,
        )
