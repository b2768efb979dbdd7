"""Audit events of authorization changes (issue 10, item 7; docs/audit.md, "Reading the
audit log").

The spec names no ``authz`` action; a store created and permissions granted or taken away are what
a security review looks for, so they are recorded: ``authz.store.created``, and one
``authz.tuples.written`` per effective write, committed with it.
"""

from __future__ import annotations

from typing import Any

from tests.authz.test_stores_tuples import new_store, ok_write, t
from tests.fixtures.service import Project


async def events_of(project: Project, store_id: str) -> list[dict[str, Any]]:
    """The store's authz events, oldest first."""
    r = await project.api.get("/v1/audit/events?type=authz.store.created,authz.tuples.written"
                              "&limit=100")
    assert r.status == 200, r.body
    return [e for e in reversed(r.body["data"]) if e["target_id"] == store_id]


async def test_store_creation_and_each_effective_write_are_audited(project: Project) -> None:
    store = await new_store(project, "audited")
    await ok_write(project, store, [t("doc:1", "viewer", "user:ann"),
                                    t("doc:1", "editor", "user:bob")])
    await ok_write(project, store, [t("doc:1", "viewer", "user:ann")])  # no change: no event
    await ok_write(project, store, deletes=[t("doc:9", "viewer", "user:ann")])  # neither
    await ok_write(project, store, [t("doc:2", "owner", "user:cy")],
                   deletes=[t("doc:1", "editor", "user:bob")])

    created, first, second = await events_of(project, store)
    assert created["action"] == "authz.store.created"
    assert (created["actor_type"], created["actor_id"]) == ("api_key", project.key_id)
    assert created["target_type"] == "store" and created["metadata"]["name"] == "audited"

    assert first["action"] == second["action"] == "authz.tuples.written"
    meta = first["metadata"]
    assert (meta["revision"], meta["written"], meta["deleted"]) == (1, 2, 0)
    assert meta["changes"] == [
        {"operation": "write", "object": "doc:1", "relation": "viewer", "user": "user:ann"},
        {"operation": "write", "object": "doc:1", "relation": "editor", "user": "user:bob"}]
    assert meta["changes_truncated"] is False and "idempotency_key" not in meta
    meta = second["metadata"]
    assert (meta["revision"], meta["written"], meta["deleted"]) == (2, 1, 1)
    assert [c["operation"] for c in meta["changes"]] == ["delete", "write"]


async def test_a_replayed_write_is_audited_once_and_a_bulk_one_lists_its_first_changes(
        project: Project) -> None:
    store = await new_store(project)
    body = {"writes": [t(f"doc:{n}", "viewer", "user:ann") for n in range(150)]}
    for _ in range(2):
        r = await project.api.post(f"/v1/stores/{store}/write", body,
                                   headers={"Idempotency-Key": "bulk-1"})
        assert r.status == 200, r.body
    assert r.headers["Idempotent-Replayed"] == "true"
    (_, written) = await events_of(project, store)
    meta = written["metadata"]
    assert (meta["written"], meta["idempotency_key"]) == (150, "bulk-1")
    assert len(meta["changes"]) == 100 and meta["changes_truncated"] is True
    assert meta["changes"][0]["object"] == "doc:0"
