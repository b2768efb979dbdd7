"""The asynchronous client (``httpx.AsyncClient``), with check coalescing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from authio_client import _operations as ops
from authio_client._coalesce import Coalescer
from authio_client._core import (
    DEFAULT_TIMEOUT,
    LIMITS,
    Attempts,
    Call,
    Config,
    RetryPolicy,
    build_request,
    interpret,
    transport_error,
    user_agent,
)
from authio_client._sessions import (
    JWKS_TTL_SECONDS,
    LEEWAY_SECONDS,
    REFETCH_INTERVAL_SECONDS,
    JwksCache,
    header_of,
    refused,
    verify_with,
)
from authio_client._sync import describe
from authio_client.errors import AuthioError, Timeout
from authio_client.models import CheckResult, Page, Revision, Session, TupleKey, TupleLike

__all__ = ["AsyncAuthioClient"]

P = ParamSpec("P")
T = TypeVar("T")


def _op(op: Callable[P, Call[T]]) -> Callable[Concatenate[AsyncAuthioClient, P], Coroutine[Any, Any, T]]:
    async def method(self: AsyncAuthioClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._run(op(*args, **kwargs))
    describe(method, op)
    return method


def _pages(op: Callable[P, Call[Page[T]]]) -> Callable[Concatenate[AsyncAuthioClient, P], AsyncIterator[T]]:
    async def method(self: AsyncAuthioClient, /, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[T]:
        more: dict[str, Any] = dict(kwargs)
        while True:
            page = await self._run(op(*args, **more))
            for item in page.data:
                yield item
            if not page.has_more or not page.next_cursor:
                return
            more["cursor"] = page.next_cursor
    describe(method, op, "AsyncIterator")
    method.__name__ = method.__qualname__ = "iter_" + op.__name__.removeprefix("list_")
    method.__doc__ = (f"Every item of :meth:`{op.__name__}`, page after page, as an async iterator "
                      "(``async for``; ``limit`` is the page size).")
    return method


class AsyncAuthioClient:
    """The asynchronous twin of :class:`~authio_client.AuthioClient`: the same methods and
    parameters, as coroutines (``iter_*`` as async iterators), plus:

    * ``coalesce`` (True): concurrent :meth:`check` calls of one event-loop tick go as one
      ``batch-check`` request (``authio_client._coalesce`` says how, and what happens when it
      fails); False sends each check alone;
    * ``check_timeout``: the default per-call timeout of :meth:`check`, in seconds (None: only
      the HTTP timeout and retry bounds apply).

    ``http`` may be an ``httpx.AsyncClient`` of your own (event hooks, transport); it is not
    closed by :meth:`aclose`. Use one client per event loop.
    """

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
                 retry: RetryPolicy | None = None, engine_url: str | None = None,
                 project_id: str | None = None, issuer: str | None = None, check_revocation: bool = False,
                 coalesce: bool = True, check_timeout: float | None = None, max_batch: int = ops.MAX_BATCH,
                 jwks_ttl: float = JWKS_TTL_SECONDS, jwks_refetch_interval: float = REFETCH_INTERVAL_SECONDS,
                 leeway: float = LEEWAY_SECONDS, http: httpx.AsyncClient | None = None,
                 event_hooks: Mapping[str, list[Callable[..., Any]]] | None = None) -> None:
        if not 1 <= max_batch <= ops.MAX_BATCH:
            raise ValueError(f"max_batch must be 1 to {ops.MAX_BATCH}")
        self.config = Config(base_url.rstrip("/"), (engine_url or base_url).rstrip("/"), api_key,
                             retry or RetryPolicy())
        self._own_http = http is None
        self.http = http or httpx.AsyncClient(timeout=timeout, headers={"User-Agent": user_agent()}, limits=LIMITS,
                                             event_hooks=dict(event_hooks or {}))
        self.project_id = project_id
        self.issuer = (issuer or base_url).rstrip("/")
        self.check_revocation = check_revocation
        self.leeway = leeway
        self.coalesce = coalesce
        self.check_timeout = check_timeout
        self.coalescer = Coalescer(self._run, self.config.retry, max_batch)
        self.jwks = JwksCache(ttl=jwks_ttl, refetch_interval=jwks_refetch_interval)
        self._jwks_lock: asyncio.Lock | None = None

    async def aclose(self) -> None:
        await self.coalescer.aclose()
        if self._own_http:
            await self.http.aclose()

    async def __aenter__(self) -> AsyncAuthioClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self, call: Call[T]) -> T:
        """Send ``call``, retrying as :mod:`authio_client._core` says; its parsed value."""
        request = build_request(self.http, self.config, call)
        attempts = Attempts(self.config.retry, call)
        while True:
            try:
                response = await self.http.send(request)
            except httpx.TransportError as exc:
                delay = attempts.after_transport(exc)
                if delay is None:
                    raise transport_error(exc, call) from exc
            else:
                try:
                    return call.parse(interpret(response))
                except AuthioError as err:
                    delay = attempts.after_error(err)
                    if delay is None:
                        raise
            await asyncio.sleep(delay)

    # -- operations (docstrings in authio_client._operations) ------------------------------------

    get_project = _op(ops.get_project)
    create_user = _op(ops.create_user)
    get_user = _op(ops.get_user)
    list_users = _op(ops.list_users)
    iter_users = _pages(ops.list_users)
    update_user = _op(ops.update_user)
    delete_user = _op(ops.delete_user)
    list_user_memberships = _op(ops.list_user_memberships)
    list_user_passkeys = _op(ops.list_user_passkeys)
    delete_user_passkey = _op(ops.delete_user_passkey)
    create_organization = _op(ops.create_organization)
    get_organization = _op(ops.get_organization)
    list_organizations = _op(ops.list_organizations)
    iter_organizations = _pages(ops.list_organizations)
    update_organization = _op(ops.update_organization)
    delete_organization = _op(ops.delete_organization)
    add_membership = _op(ops.add_membership)
    get_membership = _op(ops.get_membership)
    list_memberships = _op(ops.list_memberships)
    iter_memberships = _pages(ops.list_memberships)
    update_membership = _op(ops.update_membership)
    remove_membership = _op(ops.remove_membership)
    create_invitation = _op(ops.create_invitation)
    get_invitation = _op(ops.get_invitation)
    list_invitations = _op(ops.list_invitations)
    iter_invitations = _pages(ops.list_invitations)
    revoke_invitation = _op(ops.revoke_invitation)
    create_portal_link = _op(ops.create_portal_link)
    create_organization_scim_token = _op(ops.create_organization_scim_token)
    create_api_key = _op(ops.create_api_key)
    list_api_keys = _op(ops.list_api_keys)
    revoke_api_key = _op(ops.revoke_api_key)
    create_store = _op(ops.create_store)
    get_store = _op(ops.get_store)
    list_stores = _op(ops.list_stores)
    write_tuples = _op(ops.write_tuples)
    list_tuples = _op(ops.list_tuples)
    iter_tuples = _pages(ops.list_tuples)
    list_audit_events = _op(ops.list_audit_events)
    iter_audit_events = _pages(ops.list_audit_events)
    create_webhook_endpoint = _op(ops.create_webhook_endpoint)
    get_webhook_endpoint = _op(ops.get_webhook_endpoint)
    list_webhook_endpoints = _op(ops.list_webhook_endpoints)
    iter_webhook_endpoints = _pages(ops.list_webhook_endpoints)
    update_webhook_endpoint = _op(ops.update_webhook_endpoint)
    delete_webhook_endpoint = _op(ops.delete_webhook_endpoint)
    rotate_webhook_endpoint_secret = _op(ops.rotate_webhook_endpoint_secret)
    recover_webhook_endpoint = _op(ops.recover_webhook_endpoint)
    list_webhook_deliveries = _op(ops.list_webhook_deliveries)
    iter_webhook_deliveries = _pages(ops.list_webhook_deliveries)
    replay_webhook_delivery = _op(ops.replay_webhook_delivery)
    create_dsr = _op(ops.create_dsr)
    get_dsr = _op(ops.get_dsr)
    list_dsrs = _op(ops.list_dsrs)
    iter_dsrs = _pages(ops.list_dsrs)
    fulfill_dsr = _op(ops.fulfill_dsr)
    get_risk_policy = _op(ops.get_risk_policy)
    replace_risk_policy = _op(ops.replace_risk_policy)
    get_risk_decision = _op(ops.get_risk_decision)
    list_risk_decisions = _op(ops.list_risk_decisions)
    iter_risk_decisions = _pages(ops.list_risk_decisions)
    get_oauth_provider = _op(ops.get_oauth_provider)
    replace_oauth_provider = _op(ops.replace_oauth_provider)
    delete_oauth_provider = _op(ops.delete_oauth_provider)
    rotate_signing_key = _op(ops.rotate_signing_key)
    get_jwks = _op(ops.get_jwks)
    edge_validate = _op(ops.edge_validate)
    revoke_session = _op(ops.revoke_session)

    async def check(self, store_id: str, object: str, relation: str, user: str, *,
                    at_least_revision: Revision | int | None = None,
                    timeout: float | None = None) -> CheckResult:  # noqa: ASYNC109 (the per-call bound of a coalesced check)
        """Does ``user`` have ``relation`` on ``object``? As :meth:`AuthioClient.check`, but
        coalesced with the other checks of this event-loop tick into one ``batch-check``
        (unless ``coalesce=False``). ``timeout`` (default ``check_timeout``) bounds this call
        alone: Timeout when it runs out, while the others of its batch carry on."""
        limit = self.check_timeout if timeout is None else timeout
        if not self.coalesce:
            call = ops.check(store_id, object, relation, user, at_least_revision=at_least_revision)
            return await self._bounded(self._run(call), limit)
        at_least = ops._revision(store_id, at_least_revision)
        future = self.coalescer.submit(store_id, TupleKey(object, relation, user), at_least)
        return await self._bounded(future, limit)

    @staticmethod
    async def _bounded(waitable: Any, limit: float | None) -> CheckResult:
        if limit is None:
            result: CheckResult = await waitable
            return result
        try:
            result = await asyncio.wait_for(waitable, limit)
        except TimeoutError:
            raise Timeout(f"the check had no answer within {limit} s") from None
        return result

    async def batch_check(self, store_id: str, checks: Iterable[TupleLike], *,
                          at_least_revision: Revision | int | None = None) -> list[CheckResult | AuthioError]:
        """As :meth:`AuthioClient.batch_check` (one request per 1,000 checks, sent together)."""
        items, at_least = ops.batch_items(store_id, checks, at_least_revision)
        chunks = [items[i:i + ops.MAX_BATCH] for i in range(0, len(items), ops.MAX_BATCH)]
        answers = await asyncio.gather(*(self._run(ops.batch_check_chunk(store_id, c, at_least))
                                         for c in chunks))
        return [r for answer in answers for r in answer]

    # -- sessions -------------------------------------------------------------------------------

    async def resolve_project_id(self) -> str:
        """As :meth:`AuthioClient.resolve_project_id`."""
        if self.project_id is None:
            self.project_id = (await self._run(ops.get_project())).id
        return self.project_id

    async def verify_session(self, token: str | None, *, check_revocation: bool | None = None) -> Session:
        """As :meth:`AuthioClient.verify_session`. Concurrent verifications share one JWKS fetch."""
        header = header_of(token)
        assert token is not None
        project_id = await self.resolve_project_id()
        if header.pid is None:
            raise refused("signature", "The access token names no project.")
        if header.pid != project_id:  # before any key lookup: another project's kids cost no fetch
            raise refused("project", "The access token belongs to another project.")
        cache = self.jwks
        key = cache.keys.get(header.kid)
        if key is None or cache.expired():
            if self._jwks_lock is None:
                self._jwks_lock = asyncio.Lock()
            async with self._jwks_lock:
                if cache.expired():
                    await self._refresh_jwks(project_id)
                if header.kid not in cache.keys and cache.may_refetch_for(header.kid):
                    await self._refresh_jwks(project_id)
                key = cache.keys.get(header.kid)
        session = verify_with(token, header, key, issuer=self.issuer, project_id=project_id,
                              leeway=self.leeway)
        if self.check_revocation if check_revocation is None else check_revocation:
            await self._run(ops.edge_validate(token, project_id=project_id))
        return session

    async def _refresh_jwks(self, project_id: str) -> None:
        try:
            jwks = await self._run(ops.get_jwks(project_id))
        except AuthioError:
            if not self.jwks.keys:
                raise
            self.jwks.postpone()
            return
        self.jwks.store(jwks)
