"""The synchronous client (``httpx.Client``)."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from authio_client import _operations as ops
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
from authio_client.errors import AuthioError
from authio_client.models import CheckResult, Page, Revision, Session, TupleLike

__all__ = ["AuthioClient"]

P = ParamSpec("P")
T = TypeVar("T")


def describe(method: Callable[..., Any], op: Callable[..., Any], returns: str | None = None) -> None:
    """Give ``method`` (a wrapper of the operation ``op``) the name, docstring and signature of
    ``op`` with ``self`` first, so help() and editors show the real parameters."""
    method.__name__ = op.__name__
    method.__qualname__ = op.__name__
    method.__doc__ = op.__doc__
    sig = inspect.signature(op)
    ret = sig.return_annotation
    if isinstance(ret, str) and ret.startswith("Call[") and returns is None:
        returns = ret[5:-1]
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    params = [self_param, *sig.parameters.values()]
    method.__signature__ = sig.replace(parameters=params, return_annotation=returns or ret)  # type: ignore[attr-defined]


def _op(op: Callable[P, Call[T]]) -> Callable[Concatenate[AuthioClient, P], T]:
    def method(self: AuthioClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(op(*args, **kwargs))
    describe(method, op)
    return method


def _pages(op: Callable[P, Call[Page[T]]]) -> Callable[Concatenate[AuthioClient, P], Iterator[T]]:
    def method(self: AuthioClient, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        more: dict[str, Any] = dict(kwargs)
        while True:
            page = self._run(op(*args, **more))
            yield from page.data
            if not page.has_more or not page.next_cursor:
                return
            more["cursor"] = page.next_cursor
    describe(method, op, "Iterator")
    method.__name__ = method.__qualname__ = "iter_" + op.__name__.removeprefix("list_")
    method.__doc__ = (f"Every item of :meth:`{op.__name__}`, page after page (keyset pages fetched "
                      "as the iteration reaches them; ``limit`` is the page size).")
    return method


class AuthioClient:
    """A synchronous client of one authio project.

    ``base_url`` the service (or its ingress), ``api_key`` an ``sk_live_``/``sk_test_`` key
    (None for a client that only verifies sessions: then give ``project_id``), ``timeout``
    seconds per HTTP attempt, ``retry`` the :class:`~authio_client.RetryPolicy` of 429/503
    answers and broken connections, ``engine_url`` where checks and edge validation go when
    the engine is reached apart from the control plane (default ``base_url``), ``project_id``
    the project whose sessions :meth:`verify_session` accepts (default: the API key's, read once
    from ``GET /v1/projects/me``), ``issuer`` the tokens' ``iss`` (the service's
    ``SERVICE_BASE_URL``; default ``base_url``), ``check_revocation`` the default of
    :meth:`verify_session`'s option, ``jwks_ttl`` and ``jwks_refetch_interval`` the JWKS cache's
    lifetime and its minimum interval between refetches for unknown ``kid``s (seconds),
    ``leeway`` the clock skew allowed on ``exp``/``nbf`` (seconds), ``event_hooks`` httpx event
    hooks of the client's own ``httpx.Client`` (logging, metrics), or ``http`` an
    ``httpx.Client`` of your own (proxies, transport; it is not closed by :meth:`close`).

    Every method raises :class:`~authio_client.errors.AuthioError` (a subclass by the answer's
    ``code``) once the retries are spent. Thread-safe as ``httpx.Client`` is.
    """

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
                 retry: RetryPolicy | None = None, engine_url: str | None = None,
                 project_id: str | None = None, issuer: str | None = None, check_revocation: bool = False,
                 jwks_ttl: float = JWKS_TTL_SECONDS, jwks_refetch_interval: float = REFETCH_INTERVAL_SECONDS,
                 leeway: float = LEEWAY_SECONDS, http: httpx.Client | None = None,
                 event_hooks: Mapping[str, list[Callable[..., Any]]] | None = None) -> None:
        self.config = Config(base_url.rstrip("/"), (engine_url or base_url).rstrip("/"), api_key,
                             retry or RetryPolicy())
        self._own_http = http is None
        self.http = http or httpx.Client(timeout=timeout, headers={"User-Agent": user_agent()}, limits=LIMITS,
                                             event_hooks=dict(event_hooks or {}))
        self.project_id = project_id
        self.issuer = (issuer or base_url).rstrip("/")
        self.check_revocation = check_revocation
        self.leeway = leeway
        self.jwks = JwksCache(ttl=jwks_ttl, refetch_interval=jwks_refetch_interval)
        self._jwks_lock = threading.Lock()

    def close(self) -> None:
        if self._own_http:
            self.http.close()

    def __enter__(self) -> AuthioClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, call: Call[T]) -> T:
        """Send ``call``, retrying as :mod:`authio_client._core` says; its parsed value."""
        request = build_request(self.http, self.config, call)
        attempts = Attempts(self.config.retry, call)
        while True:
            try:
                response = self.http.send(request)
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
            time.sleep(delay)

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
    check = _op(ops.check)
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

    def batch_check(self, store_id: str, checks: Iterable[TupleLike], *,
                    at_least_revision: Revision | int | None = None) -> list[CheckResult | AuthioError]:
        """Check many permissions of one store, answered in order: each item a
        :class:`~authio_client.models.CheckResult` or the :class:`~authio_client.errors.AuthioError`
        of that item alone (an invalid tuple, the depth cap, its revision not reached). More than
        1,000 checks go as several ``batch-check`` requests. A failure of a whole request (the
        store, the key, ``at_least_revision``) is raised."""
        items, at_least = ops.batch_items(store_id, checks, at_least_revision)
        out: list[CheckResult | AuthioError] = []
        for i in range(0, len(items), ops.MAX_BATCH):
            answer = self._run(ops.batch_check_chunk(store_id, items[i:i + ops.MAX_BATCH], at_least))
            out.extend(answer)
        return out

    # -- sessions -------------------------------------------------------------------------------

    def resolve_project_id(self) -> str:
        """The project whose sessions are verified: ``project_id`` as given, else the API key's
        (one ``GET /v1/projects/me``, remembered)."""
        if self.project_id is None:
            self.project_id = self._run(ops.get_project()).id
        return self.project_id

    def verify_session(self, token: str | None, *, check_revocation: bool | None = None) -> Session:
        """The :class:`~authio_client.models.Session` of an access token (the ``service_session``
        cookie or a Bearer token), verified locally against the project's JWKS (see
        ``authio_client._sessions`` for every rule and the cache). With ``check_revocation``
        (default: the client's), the engine's ``/v1/edge/validate`` is asked too, so a session
        signed out a moment ago is refused (InvalidSession, reason ``revoked``) although its
        token still verifies. Raises NoSession, InvalidSession; AuthioError when the JWKS cannot
        be fetched and no keys are cached."""
        header = header_of(token)
        assert token is not None
        project_id = self.resolve_project_id()
        if header.pid is None:
            raise refused("signature", "The access token names no project.")
        if header.pid != project_id:  # before any key lookup: another project's kids cost no fetch
            raise refused("project", "The access token belongs to another project.")
        with self._jwks_lock:
            cache = self.jwks
            if cache.expired():
                self._refresh_jwks(project_id)
            if header.kid not in cache.keys and cache.may_refetch_for(header.kid):
                self._refresh_jwks(project_id)
            key = cache.keys.get(header.kid)
        session = verify_with(token, header, key, issuer=self.issuer, project_id=project_id,
                              leeway=self.leeway)
        if self.check_revocation if check_revocation is None else check_revocation:
            self._run(ops.edge_validate(token, project_id=project_id))
        return session

    def _refresh_jwks(self, project_id: str) -> None:
        try:
            jwks = self._run(ops.get_jwks(project_id))
        except AuthioError:
            if not self.jwks.keys:
                raise
            self.jwks.postpone()
            return  # keep verifying with the keys we have (stale-if-error)
        self.jwks.store(jwks)
