"""Housekeeping deletes identity records past their use, and nothing still in use: each domain's
purge (sessions, magic links, messages), run by its worker."""

from __future__ import annotations

import secrets

import asyncpg

from control_plane.magic_links import tasks as magic_links
from control_plane.messages import tasks as messages
from control_plane.sessions import tasks as sessions
from control_plane.sessions.repository import KEEP_GENERATIONS
from tests.fixtures.identity import latest_link, send_link, sign_in
from tests.fixtures.service import Api, Project


async def purge(db: asyncpg.Pool) -> dict[str, int]:
    """One pass of every purge: rows deleted by table."""
    return {**await sessions.purge(db), **await magic_links.purge(db), **await messages.purge(db)}


def email() -> str:
    return f"keep-{secrets.token_hex(6)}@example.com"


async def test_purge_removes_what_is_past_its_use(service: Api, project: Project,
                                                  db: asyncpg.Pool) -> None:
    live, ended, revoked = [await sign_in(project, email(), api=service) for _ in range(3)]
    # Time travel: one session ended two days ago; one was revoked and its tokens lapsed.
    await db.execute("UPDATE sessions SET expires_at = now() - interval '2 days' WHERE id = $1",
                     ended.session_id)
    await db.execute(
        """UPDATE sessions SET status = 'revoked', revoked_at = now() - interval '2 days',
                  access_expires_at = now() - interval '2 days' WHERE id = $1""", revoked.session_id)
    old_link, fresh_link = email(), email()
    for to in (old_link, fresh_link):
        await send_link(service, project, to)
        await latest_link(project, to)
    await db.execute(
        """UPDATE magic_link_tokens SET expires_at = now() - interval '25 hours'
           WHERE project_id = $1 AND destination = $2""", project.id, old_link)
    await db.execute(
        """UPDATE messages SET sent_at = now() - interval '8 days'
           WHERE project_id = $1 AND destination = $2""", project.id, old_link)

    deleted = await purge(db)

    assert deleted["sessions"] >= 2 and deleted["magic_link_tokens"] >= 1 and deleted["messages"] >= 1
    sessions = {r["id"] for r in await db.fetch(
        "SELECT id FROM sessions WHERE id = ANY($1)", [live.session_id, ended.session_id, revoked.session_id])}
    assert sessions == {live.session_id}
    assert await db.fetchval("SELECT count(*) FROM refresh_tokens WHERE session_id = $1",
                             ended.session_id) == 0
    tokens = {r["destination"] for r in await db.fetch(
        "SELECT destination FROM magic_link_tokens WHERE project_id = $1 AND destination = ANY($2)",
        project.id, [old_link, fresh_link])}
    assert tokens == {fresh_link}
    messages = {r["destination"] for r in await db.fetch(
        "SELECT destination FROM messages WHERE project_id = $1 AND destination = ANY($2)",
        project.id, [old_link, fresh_link])}
    assert messages == {fresh_link}


async def test_purge_keeps_the_newest_refresh_generations(service: Api, project: Project,
                                                          db: asyncpg.Pool) -> None:
    s = await sign_in(project, email(), api=service)
    # A long-lived session: as if refreshed KEEP_GENERATIONS + 20 times.
    await db.execute(
        """INSERT INTO refresh_tokens (token_hash, session_id, generation, rotated_at, used_at)
           SELECT sha256(convert_to($1 || g::text, 'UTF8')), $1, g, now(), now()
           FROM generate_series(2, $2) g""", s.session_id, KEEP_GENERATIONS + 21)
    await purge(db)
    generations = [r["generation"] for r in await db.fetch(
        "SELECT generation FROM refresh_tokens WHERE session_id = $1 ORDER BY generation", s.session_id)]
    assert generations == list(range(22, KEEP_GENERATIONS + 22))
