"""Choosing the trigrams a ``q`` search asks the index for (``service.rare_trigrams``), and the
statistics they are chosen by: made by ANALYZE of the partitioned log (migration 0012), which
the audit workers run when the last one is a day old."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
import pytest_asyncio

from common.ids import new_id
from control_plane.audit import repository
from control_plane.audit.service import MAX_INDEX_TRIGRAMS, RARE_TRIGRAM, rare_trigrams
from control_plane.audit.tasks import STATISTICS_MAX_AGE, statistics_pass
from tests.fixtures.database import database_pool, migrated_database

COMMON = RARE_TRIGRAM * 10
LISTED = RARE_TRIGRAM / 2  # listed, and still rare


def test_no_statistics_gives_no_trigrams() -> None:
    assert rare_trigrams("alice@example.com", {}) == ()


def test_unlisted_trigrams_are_the_rarest_and_common_ones_are_left_out() -> None:
    frequencies = {"ali": LISTED, "lic": COMMON, "ice": COMMON, "exa": COMMON, "xam": COMMON,
                   "amp": COMMON, "mpl": COMMON, "ple": COMMON, "com": COMMON}
    # Unlisted ("xyz"), then listed below the bound, never a common one.
    assert rare_trigrams("Alice.Xyz@example.com", frequencies) == ("xyz", "ali")


def test_at_most_three_rarest_first() -> None:
    frequencies = {"abc": LISTED * 0.9, "bcd": LISTED * 0.1, "cde": LISTED * 0.5, "def": LISTED}
    assert rare_trigrams("abcdef", frequencies) == ("bcd", "cde", "abc")
    assert len(rare_trigrams("abcdefghijk", frequencies)) == MAX_INDEX_TRIGRAMS


def test_only_runs_of_three_ascii_letters_or_digits_count() -> None:
    frequencies = {"zzz": COMMON}
    assert rare_trigrams("a_b-c d", frequencies) == ()  # no run of three
    assert rare_trigrams("o_k 0%", frequencies) == ()
    # "Zürich": the ASCII runs are "Z" and "rich"; a lone non-ASCII letter is never a candidate.
    assert set(rare_trigrams("Zürich", frequencies)) == {"ric", "ich"}
    assert rare_trigrams("ÄÖÜäöü", frequencies) == ()
    assert rare_trigrams("USER_42x", frequencies) == ("42x", "ser", "use")


def test_all_common_gives_nothing() -> None:
    assert rare_trigrams("session", {t: COMMON for t in ("ses", "ess", "ssi", "sio", "ion")}) == ()


@pytest.fixture
def fresh_database(database_url: str) -> Iterator[str]:
    """A database of its own, migrated, with no ANALYZE of the log yet."""
    with migrated_database(database_url, "audit_stats") as url:
        yield url


@pytest_asyncio.fixture
async def fresh_log(fresh_database: str) -> AsyncIterator[asyncpg.Pool]:
    async with database_pool(fresh_database) as pool:
        yield pool


async def test_statistics_pass_analyzes_a_stale_log_once(fresh_log: asyncpg.Pool) -> None:
    project = new_id("proj")
    now = datetime.now(UTC)
    rows = [(new_id("evt"), now - timedelta(seconds=i), "user.created" if i % 2 else "session.created",
             "api_key", "key_1", project, f"user {i} quokka" if i < 3 else f"user {i}")
            for i in range(400)]
    await fresh_log.executemany(
        "INSERT INTO audit_events (id, created_at, action, actor_type, actor_id, project_id, metadata)"
        " VALUES ($1, $2, $3, $4, $5, $6, jsonb_build_object('description', $7::text))", rows)
    async with fresh_log.acquire() as conn:
        assert await repository.search_trigram_frequencies(conn) == {}
    assert await statistics_pass(fresh_log) is True
    assert await statistics_pass(fresh_log) is False  # analyzed less than a day ago
    async with fresh_log.acquire() as conn:
        frequencies = await repository.search_trigram_frequencies(conn)
        # Every event holds "use" and "ser"; one in two "ses" (session.created); three "quo".
        assert frequencies["use"] == 1.0 and frequencies["ser"] == 1.0
        assert abs(frequencies["ses"] - 0.5) < 0.01
        assert rare_trigrams("Quokka", frequencies)[0] in {"quo", "uok", "okk", "kka"}
        assert not await repository.analyze_if_older(conn, max_age=STATISTICS_MAX_AGE)
        assert await repository.analyze_if_older(conn, max_age=timedelta(0))
