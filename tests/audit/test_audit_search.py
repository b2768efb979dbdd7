"""The ``q`` search through its rare trigrams (``service.rare_trigrams``), end to end.

A log of its own (database and service): which trigrams are rare depends on everything else in
the log, and the suite's shared one holds whatever the other tests wrote. It holds the filter
catalog of ``test_audit_read`` and 5,000 everyday events of another project, analyzed as the
audit workers' statistics pass does (migration 0012), so the catalog's words are as rare as in a
real log. Every ``q`` case of the catalog is then checked against the same model of SPEC.md 4's
substring rule, listed and exported.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import ClientSession

from common.ids import new_id
from common.settings import Settings
from control_plane.audit.repository import search_trigram_frequencies
from control_plane.audit.service import rare_trigrams
from tests.audit.helpers import (
    FILTER_CASES,
    Fixture,
    event,
    get_ok,
    insert,
    jsonl,
    make_catalog,
    model,
    resolve,
)
from tests.fixtures.database import database_pool, migrated_database
from tests.fixtures.service import bootstrap_project, combined_app, serving

Q_CASES = [case for case in FILTER_CASES if "q" in case[0]]


@dataclass
class Searched:
    catalog: Fixture
    frequencies: dict[str, float]


@pytest.fixture(scope="module")
def search_database_url(database_url: str) -> Iterator[str]:
    with migrated_database(database_url, "audit_search") as url:
        yield url


@pytest_asyncio.fixture(scope="module")
async def searched(search_database_url: str, settings_factory: Callable[..., Settings],
                   http: ClientSession) -> AsyncIterator[Searched]:
    async with database_pool(search_database_url) as db, \
            serving(http, combined_app(settings_factory(database_url=search_database_url))) as api:
        catalog = await make_catalog(await bootstrap_project(api, "search"), db)
        everyday, base = new_id("proj"), datetime.now(UTC) - timedelta(days=1)
        await insert(db, (event(everyday, base - timedelta(seconds=i), "session.refreshed",
                                description=f"Refreshed session {i % 97} for user {i % 31}")
                          for i in range(5000)))
        await db.execute("ANALYZE audit_events")
        async with db.acquire() as conn:
            frequencies = await search_trigram_frequencies(conn)
        yield Searched(catalog, frequencies)


async def test_the_cases_take_the_rare_trigram_path(searched: Searched) -> None:
    """The checks below are not vacuous: these ``q`` go through the rare-trigram path; words
    most events hold do not, nor a ``q`` without a run of three letters or digits."""
    assert searched.frequencies["ses"] > 0.9
    for q in ("created", "operator_x", "tgt_mixed", "Quarterly", "ZEBRA", "go_kart", "100% of",
              "no such text anywhere", "'deploy'", "kart", "renamed"):
        assert rare_trigrams(q, searched.frequencies), q
    for q in ("Refreshed session", "o_k", "0%", "x"):
        assert rare_trigrams(q, searched.frequencies) == (), q


@pytest.mark.parametrize(("query", "args"), Q_CASES)
async def test_q_through_rare_trigrams_matches_the_rule(searched: Searched, query: dict[str, str],
                                                        args: dict[str, Any]) -> None:
    catalog = searched.catalog
    qs, a = resolve(catalog, query, args)
    expected = model(catalog.rows, **a)
    r = await get_ok(catalog.api, "/v1/audit/events?limit=1000&" + qs)
    assert [e["id"] for e in r.body["data"]] == expected, qs
    exported = await get_ok(catalog.api, "/v1/audit/events.jsonl?" + qs)
    assert [e["id"] for e in jsonl(exported.raw)] == expected, qs


async def test_a_match_across_words_and_cases(searched: Searched) -> None:
    """``q`` spanning a word boundary, in another case, matches through its rare trigrams as
    through the whole pattern; a near miss (one letter off) matches nothing."""
    catalog = searched.catalog
    for q, hits in (("the QUARTERLY rep", 1), ("ebra", 1), ("Quarterlx", 0), ("laps", 1)):
        assert rare_trigrams(q, searched.frequencies), q
        r = await get_ok(catalog.api, "/v1/audit/events?limit=1000&q=" + q.replace(" ", "%20"))
        assert [e["id"] for e in r.body["data"]] == model(catalog.rows, q=q), q
        assert len(r.body["data"]) == hits, q
