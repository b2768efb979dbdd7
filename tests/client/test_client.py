"""The Python client against the running service: management calls, errors by code, tuple
writes with their Idempotency-Key, checks at a write's revision, check coalescing, and the audit
log's pages. The sync client runs in a worker thread (``asyncio.to_thread``) while the service
answers on the test's event loop."""

from __future__ import annotations

import asyncio
import inspect
import json
import secrets
import time
from typing import Any

import authio_client
import httpx
import pytest
from aiohttp import ClientSession, web
from authio_client import AsyncAuthioClient, AuthioClient, Revision
from authio_client.errors import (
    AuthioError,
    IdempotencyKeyReused,
    InvalidApiKey,
    InvalidRequest,
    MembershipNotFound,
    RevisionAhead,
    SlugInUse,
    StoreNotFound,
    Timeout,
    UserNotFound,
)

from tests.client.helpers import Sent, async_client, ingress, sync_client
from tests.fixtures.service import Project


def slug() -> str:
    return f"org-{secrets.token_hex(4)}"


def mail() -> str:
    return f"client-{secrets.token_hex(5)}@example.com"


async def test_both_clients_have_the_same_methods() -> None:
    """One core, two faces: every public method of the sync client exists on the async one with
    the same parameters (coroutines there, async iterators for ``iter_*``)."""
    def methods(cls: type) -> dict[str, inspect.Signature]:
        return {n: inspect.signature(getattr(cls, n)) for n in dir(cls)
                if not n.startswith("_") and callable(getattr(cls, n))}
    sync, async_ = methods(AuthioClient), methods(AsyncAuthioClient)
    assert set(sync) - {"close"} == set(async_) - {"aclose"}, set(sync) ^ set(async_)
    for name, sig in sync.items():
        if name in ("close", "check"):
            continue
        assert list(sig.parameters) == list(async_[name].parameters), name
    # The async check adds its per-call timeout, and nothing else.
    assert [*inspect.signature(AuthioClient.check).parameters, "timeout"] == list(
        inspect.signature(AsyncAuthioClient.check).parameters)
    assert inspect.iscoroutinefunction(AsyncAuthioClient.create_user)
    assert inspect.isasyncgenfunction(AsyncAuthioClient.iter_audit_events)


async def test_users_organizations_memberships_and_keys_with_the_sync_client(project: Project) -> None:
    sent = Sent()

    def flow() -> dict[str, Any]:
        with sync_client(project.api.base_url, project.key, sent) as c:
            address = mail()
            user = c.create_user(address, name="Anne", metadata={"plan": "pro"})
            again = c.create_user(address.upper(), name="Other")
            assert (user.created, again.created, again.id, again.name) == (True, False, user.id, "Anne")
            assert c.get_user(user.id).metadata == {"plan": "pro"}
            changed = c.update_user(user.id, name="Anne B.", phone_number=None)
            assert (changed.name, changed.email) == ("Anne B.", address)
            assert [u.id for u in c.list_users(email=address).data] == [user.id]

            org = c.create_organization("Acme", slug())
            with pytest.raises(SlugInUse) as clash:
                c.create_organization("Acme again", org.slug)
            assert (clash.value.status, clash.value.code) == (409, "slug_in_use")
            assert clash.value.request_id and clash.value.request_id.startswith("req_")
            assert c.update_organization(org.id, name="Acme Inc").name == "Acme Inc"
            assert c.get_organization(org.id).slug == org.slug

            member = c.add_membership(org.id, user.id, role="admin")
            assert (member.role, member.status) == ("admin", "active")
            assert [m.id for m in c.iter_memberships(org.id)] == [member.id]
            assert c.update_membership(org.id, member.id, status="suspended").status == "suspended"
            mine = c.list_user_memberships(user.id).data
            assert [(m.organization_id, m.organization_slug) for m in mine] == [(org.id, org.slug)]
            assert c.remove_membership(org.id, member.id).deleted
            with pytest.raises(MembershipNotFound):
                c.get_membership(org.id, member.id)

            key = c.create_api_key("reader", scopes=["users:read"], prefix="sk_test_")
            assert key.secret and key.secret.startswith("sk_test_") and key.scopes == ["users:read"]
            assert key.id in [k.id for k in c.list_api_keys(limit=1000).data]
            with sync_client(project.api.base_url, key.secret, sent) as narrow:
                assert narrow.get_user(user.id).id == user.id
                assert c.revoke_api_key(key.id).revoked_at is not None
                with pytest.raises(InvalidApiKey) as refused:
                    narrow.get_user(user.id)
                assert (refused.value.status, refused.value.code) == (401, "invalid_api_key")

            assert c.delete_user(user.id).deleted
            with pytest.raises(UserNotFound) as gone:
                c.get_user(user.id)
            assert isinstance(gone.value, authio_client.NotFound) and gone.value.status == 404
            assert c.delete_organization(org.id).deleted
            return {"project": c.get_project().id}

    done = await asyncio.to_thread(flow)
    assert done["project"] == project.id
    # Every request said who is calling and with what.
    assert all(h["authorization"].startswith("Bearer sk_") for h in sent.headers)
    assert all(h["user-agent"].startswith("authio-client-python/") for h in sent.headers)


async def test_invalid_input_is_an_invalid_request_with_its_fields(authio: AsyncAuthioClient) -> None:
    with pytest.raises(InvalidRequest) as bad:
        await authio.list_users(limit=5000)
    assert bad.value.code == "invalid_request" and bad.value.details["fields"]
    with pytest.raises(StoreNotFound):
        await authio.get_store("store_" + "0" * 26)


async def test_a_write_then_a_check_at_its_revision(authio: AsyncAuthioClient, sent: Sent) -> None:
    store = await authio.create_store("main")
    written = await authio.write_tuples(store.id, writes=[
        ("group:eng", "member", "user:anne"),
        {"object": "document:roadmap", "relation": "viewer", "user": "group:eng#member"}])
    assert (written.written, written.deleted, written.replayed) == (2, 0, False)
    assert written.revision == Revision(store.id, 1)
    result = await authio.check(store.id, "document:roadmap", "viewer", "user:anne",
                                at_least_revision=written.revision)
    assert (result.allowed, result.resolution, result.revision) == (True, "userset", 1)
    assert result.resolution_path == ["document:roadmap#viewer@group:eng#member",
                                      "group:eng#member@user:anne"]

    removed = await authio.write_tuples(store.id, deletes=[("group:eng", "member", "user:anne")])
    after = await authio.check(store.id, "document:roadmap", "viewer", "user:anne",
                               at_least_revision=removed.revision)
    assert (after.allowed, after.revision) == (False, 2)

    with pytest.raises(RevisionAhead) as ahead:
        await authio.check(store.id, "document:roadmap", "viewer", "user:anne", at_least_revision=99)
    assert ahead.value.details == {"requested": 99, "current": 2}
    other = await authio.create_store("other")
    with pytest.raises(ValueError, match="revision of store"):
        await authio.check(other.id, "document:roadmap", "viewer", "user:anne",
                           at_least_revision=removed.revision)
    # Every write carried an Idempotency-Key of its own.
    keys = [h.get("idempotency-key") for (m, p), h in zip(sent.requests, sent.headers, strict=True)
            if p.endswith("/write")]
    assert len(keys) == 2 and all(keys) and keys[0] != keys[1]

    batch = await authio.batch_check(store.id, [("group:eng", "member", "user:anne"),
                                                ("document:roadmap", "viewer", "group:eng#member"),
                                                ("bad object", "viewer", "user:anne")])
    assert isinstance(batch[0], authio_client.CheckResult) and not batch[0].allowed
    assert isinstance(batch[1], authio_client.CheckResult) and batch[1].allowed
    assert isinstance(batch[2], InvalidRequest) and batch[2].code == "invalid_request"


class LoseFirstAnswer(httpx.AsyncBaseTransport):
    """A transport that sends the first request whose path ends with ``suffix`` to the service
    and then loses its answer (a connection broken after the server acted): the write is
    applied and the client does not know."""

    def __init__(self, suffix: str) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.suffix, self.lost = suffix, 0
        self.keys: list[str | None] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith(self.suffix):
            self.keys.append(request.headers.get("idempotency-key"))
            if not self.lost:
                self.lost += 1
                await response.aread()
                await response.aclose()
                raise httpx.ReadError("connection reset after the request was sent", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_write_whose_answer_was_lost_is_retried_under_the_same_key(project: Project) -> None:
    transport = LoseFirstAnswer("/write")
    async with httpx.AsyncClient(transport=transport) as http:
        client = AsyncAuthioClient(project.api.base_url, project.key, http=http,
                                   retry=authio_client.RetryPolicy(backoff=0.01, max_backoff=0.05))
        store = await client.create_store("retried")
        written = await client.write_tuples(store.id, writes=[("doc:1", "viewer", "user:anne"),
                                                              ("doc:2", "viewer", "user:anne")])
        # The second try carried the first one's key, so it was answered with the first outcome
        # (2 written at revision 1), not applied again (which would answer 0 written at 1).
        assert transport.lost == 1 and len(transport.keys) == 2
        assert transport.keys[0] == transport.keys[1] == written.idempotency_key
        assert (written.written, written.revision.value, written.replayed) == (2, 1, True)
        assert (await client.get_store(store.id)).revision == 1
        tuples = [(t.object, t.user) async for t in client.iter_tuples(store.id, limit=1)]
        assert tuples == [("doc:1", "user:anne"), ("doc:2", "user:anne")]
        with pytest.raises(IdempotencyKeyReused):
            await client.write_tuples(store.id, writes=[("doc:3", "viewer", "user:anne")],
                                      idempotency_key=written.idempotency_key)
        await client.aclose()


async def test_concurrent_checks_go_as_one_batch_request(project: Project, sent: Sent) -> None:
    client = async_client(project.api.base_url, project.key, sent)
    store = await client.create_store("coalesced")
    w = await client.write_tuples(store.id, writes=[(f"doc:{i}", "viewer", "user:anne")
                                                    for i in range(0, 40, 2)])
    sent.clear()
    results = await asyncio.gather(*(client.check(store.id, f"doc:{i}", "viewer", "user:anne",
                                                  at_least_revision=w.revision) for i in range(40)),
                                   client.check(store.id, "doc:0", "viewer", "user:anne",  # a twin
                                                at_least_revision=w.revision),
                                   client.check(store.id, "not a tuple", "viewer", "user:anne"),
                                   return_exceptions=True)
    assert sent.requests == [("POST", f"/v1/stores/{store.id}/batch-check")]
    assert [r.allowed for r in results[:41]] == [i % 2 == 0 for i in range(40)] + [True]  # type: ignore[union-attr]
    assert isinstance(results[41], InvalidRequest)  # that caller alone
    assert (client.coalescer.batches, client.coalescer.items) == (1, 41)  # the twin folded in

    # More than one batch's worth goes as several requests of at most max_batch items.
    small = async_client(project.api.base_url, project.key, sent, max_batch=10)
    sent.clear()
    answers = await asyncio.gather(*(small.check(store.id, f"doc:{i}", "viewer", "user:anne")
                                     for i in range(25)))
    assert sent.count("POST", "/batch-check") == 3 and len(sent.requests) == 3
    assert [a.allowed for a in answers] == [i % 2 == 0 for i in range(25)]

    # A caller's own timeout ends its wait, not its neighbours'.
    sent.clear()
    late, on_time = await asyncio.gather(
        client.check(store.id, "doc:0", "viewer", "user:anne", timeout=0),
        client.check(store.id, "doc:2", "viewer", "user:anne"), return_exceptions=True)
    assert isinstance(late, Timeout) and isinstance(late, TimeoutError)
    assert on_time.allowed  # type: ignore[union-attr]

    # A whole batch refused fails each of its callers with that error.
    with pytest.raises(StoreNotFound):
        await asyncio.gather(*(client.check("store_" + "0" * 26, "doc:0", "viewer", "user:anne")
                               for _ in range(3)))

    # coalesce=False: one request per check.
    alone = async_client(project.api.base_url, project.key, sent, coalesce=False)
    sent.clear()
    await asyncio.gather(*(alone.check(store.id, f"doc:{i}", "viewer", "user:anne") for i in range(8)))
    assert sent.count("POST", "/check") == 8 and len(sent.requests) == 8
    for c in (client, small, alone):
        await c.aclose()


async def test_the_audit_log_iterates_over_keyset_pages(authio: AsyncAuthioClient, sent: Sent) -> None:
    made = [await authio.create_user(mail()) for _ in range(12)]
    sent.clear()
    seen = [e async for e in authio.iter_audit_events(type="user.created", limit=5)]
    assert sent.count("GET", "/v1/audit/events") == 3  # 5 + 5 + 2
    assert [e.target_id for e in seen] == [u.id for u in reversed(made)]  # newest first
    assert all(e.action == "user.created" and e.created_at.tzinfo is not None for e in seen)
    page = await authio.list_audit_events(type=["user.created"], limit=10)
    assert len(page.data) == 10 and page.has_more and page.next_cursor


async def test_errors_carry_the_envelope(authio: AsyncAuthioClient) -> None:
    with pytest.raises(AuthioError) as err:
        await authio.get_user("user_" + "0" * 26)
    e = err.value
    assert (type(e), e.code, e.status) == (UserNotFound, "user_not_found", 404)
    assert e.message and isinstance(e.details, dict) and e.request_id
    assert "user_not_found (404)" in str(e)


async def test_without_batch_check_the_coalescer_sends_single_checks(project: Project, sent: Sent,
                                                                     http: ClientSession) -> None:
    """An ingress in front of the engine that routes single checks but not ``batch-check``
    (404 ``not_found``): the client notices once and sends each check alone from then on."""
    async def refuse_batches(path: str, body: bytes) -> web.Response | None:
        if path.endswith("/batch-check"):
            return web.json_response({"error": {"code": "not_found", "message": "Not found.", "details": {}},
                                      "request_id": "req_ingress"}, status=404)
        return None

    async with ingress(http, project.api.base_url, refuse_batches) as engine_url:
        client = async_client(project.api.base_url, project.key, sent, engine_url=engine_url)
        store = await client.create_store("no-batch")
        w = await client.write_tuples(store.id, writes=[("doc:0", "viewer", "user:anne")])
        sent.clear()
        first = await asyncio.gather(*(client.check(store.id, f"doc:{i}", "viewer", "user:anne",
                                                    at_least_revision=w.revision) for i in range(6)))
        assert [r.allowed for r in first] == [True] + [False] * 5
        assert (sent.count("POST", "/batch-check"), sent.count("POST", "/check")) == (1, 6)
        assert not client.coalescer.batch_supported
        sent.clear()
        await asyncio.gather(*(client.check(store.id, f"doc:{i}", "viewer", "user:anne") for i in range(4)))
        assert (sent.count("POST", "/batch-check"), sent.count("POST", "/check")) == (0, 4)
        await client.aclose()


async def test_an_item_whose_revision_was_not_reached_goes_into_a_later_batch(
        project: Project, sent: Sent, http: ClientSession) -> None:
    """An engine whose wait for an item's revision ended first answers that item
    ``revision_not_reached`` (503, retry after 1 s): the client sends it again in a later batch
    and its caller gets the answer, as a single check's 503 would be retried. The engine's
    answer is rewritten by an ingress for the first batch only (the moment cannot be had on
    purpose from an engine that follows its change log within milliseconds)."""
    batches: list[int] = []

    async def pass_through(path: str, answer: bytes) -> web.Response | None:
        return None

    async def rewrite(path: str, body: bytes) -> bytes:
        data = json.loads(body)
        if path.endswith("/batch-check"):
            batches.append(len(data["results"]))
            if len(batches) == 1:
                data["results"][1] = {"error": {"code": "revision_not_reached", "message": "Retry.",
                                                "details": {"requested": 1, "current": 0}}}
        return json.dumps(data).encode()

    async with ingress(http, project.api.base_url, pass_through, rewrite) as engine_url:
        client = async_client(project.api.base_url, project.key, sent, engine_url=engine_url)
        store = await client.create_store("late")
        w = await client.write_tuples(store.id, writes=[("doc:1", "viewer", "user:anne")])
        started = time.monotonic()
        answers = await asyncio.gather(*(client.check(store.id, f"doc:{i}", "viewer", "user:anne",
                                                      at_least_revision=w.revision) for i in range(3)))
        assert [a.allowed for a in answers] == [False, True, False]
        assert batches == [3, 1] and time.monotonic() - started >= 1.0  # Retry-After: 1
        await client.aclose()
