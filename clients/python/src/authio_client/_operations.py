"""Every operation of the clients, once: each function takes the method's arguments and returns
the :class:`~authio_client._core.Call` to send (paths and bodies of ``docs/openapi.json``).
:class:`~authio_client.AuthioClient` and :class:`~authio_client.AsyncAuthioClient` expose each
one as a method of the same name and signature (the sync one answering the value, the async one
a coroutine of it); their docstrings are these."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import quote

from authio_client._core import Call, Reply
from authio_client.errors import AuthioError, error_from
from authio_client.models import (
    ApiKey,
    AuditEvent,
    CheckResult,
    DataSubjectRequest,
    Deleted,
    Fulfilment,
    Invitation,
    Membership,
    OAuthProvider,
    Organization,
    Page,
    Passkey,
    PortalLink,
    Project,
    Revision,
    RiskDecision,
    RiskPolicy,
    ScimToken,
    SigningKey,
    Store,
    StoredTuple,
    TupleKey,
    TupleLike,
    User,
    WebhookDelivery,
    WebhookEndpoint,
    WriteResult,
    tuple_key,
)

MAX_BATCH: Final = 1000
"""The most checks one ``batch-check`` request carries, and the most tuples one write carries
(``BatchCheckRequest.checks`` and ``WriteBody.writes`` ``maxItems`` in the OpenAPI document)."""


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final[Any] = _Unset()
"""The default of a field an update leaves as it is (None may be a value to set)."""


def _seg(value: str) -> str:
    return quote(value, safe="")


def _page(item: Any) -> Any:
    def parse(r: Reply) -> Page[Any]:
        b = r.body
        return Page([item(d) for d in b["data"]], b.get("next_cursor"), bool(b.get("has_more")),
                    r.request_id)
    return parse


def _changes(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not UNSET}


def _revision(store_id: str, value: Revision | int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, Revision):
        if value.store_id != store_id:
            raise ValueError(f"a revision of store {value.store_id} used with store {store_id}")
        return value.value
    return int(value)


# -- project ----------------------------------------------------------------------------------


def get_project() -> Call[Project]:
    """The calling key's project (``GET /v1/projects/me``)."""
    return Call("GET", "/v1/projects/me", lambda r: Project.from_json(r.body), idempotent=True)


# -- users ------------------------------------------------------------------------------------


def create_user(email: str, *, name: str | None = None, email_verified: bool | None = None,
                phone_number: str | None = None, metadata: Mapping[str, Any] | None = None) -> Call[User]:
    """Create a user (``POST /v1/users``), idempotently on the e-mail: an existing user is
    answered as it is, with ``created=False``; a new one (``created=True``) is sent an
    enrollment link. Raises InvalidRequest (``invalid_email`` 422), Conflict
    (``phone_in_use``)."""
    body = _changes(email=email, name=name if name is not None else UNSET,
                    email_verified=email_verified if email_verified is not None else UNSET,
                    phone_number=phone_number if phone_number is not None else UNSET,
                    metadata=dict(metadata) if metadata is not None else UNSET)
    return Call("POST", "/v1/users", lambda r: User.from_json(r.body, created=r.status == 201),
                json=body, idempotent=True)


def get_user(user_id: str) -> Call[User]:
    """One user (``GET /v1/users/{user_id}``); UserNotFound when the project has none by that id."""
    return Call("GET", f"/v1/users/{_seg(user_id)}", lambda r: User.from_json(r.body), idempotent=True)


def list_users(*, email: str | None = None, limit: int | None = None,
               cursor: str | None = None) -> Call[Page[User]]:
    """A page of the project's users in creation order (``GET /v1/users``); ``email`` filters
    exactly (case-insensitively); ``limit`` 1 to 1000 (50 by default)."""
    return Call("GET", "/v1/users", _page(User.from_json),
                params={"email": email, "limit": limit, "cursor": cursor}, idempotent=True)


def update_user(user_id: str, *, email: str = UNSET, name: str = UNSET, email_verified: bool = UNSET,
                phone_number: str | None = UNSET, metadata: Mapping[str, Any] = UNSET) -> Call[User]:
    """Change the fields given (``PATCH /v1/users/{user_id}``); ``metadata`` replaces the whole
    object. Raises UserNotFound, Conflict (``email_in_use``), InvalidRequest."""
    body = _changes(email=email, name=name, email_verified=email_verified, phone_number=phone_number,
                    metadata=dict(metadata) if metadata is not UNSET else UNSET)
    return Call("PATCH", f"/v1/users/{_seg(user_id)}", lambda r: User.from_json(r.body), json=body,
                idempotent=True)


def delete_user(user_id: str) -> Call[Deleted]:
    """Delete a user, with its memberships and sessions (``DELETE /v1/users/{user_id}``)."""
    return Call("DELETE", f"/v1/users/{_seg(user_id)}", lambda r: Deleted.from_json(r.body),
                idempotent=True)


def list_user_memberships(user_id: str, *, status: str | None = None, limit: int | None = None,
                          cursor: str | None = None) -> Call[Page[Membership]]:
    """A page of one user's memberships, with each organization's name and slug."""
    return Call("GET", f"/v1/users/{_seg(user_id)}/memberships", _page(Membership.from_json),
                params={"status": status, "limit": limit, "cursor": cursor}, idempotent=True)


def list_user_passkeys(user_id: str) -> Call[list[Passkey]]:
    """A user's passkeys, oldest first (``GET /v1/users/{user_id}/passkeys``; all of them, no
    pages). Raises UserNotFound."""
    return Call("GET", f"/v1/users/{_seg(user_id)}/passkeys",
                lambda r: [Passkey.from_json(d) for d in r.body["data"]], idempotent=True)


def delete_user_passkey(user_id: str, passkey_id: str) -> Call[Passkey]:
    """Delete one of a user's passkeys: it signs in no more; answers the passkey deleted.
    Raises UserNotFound, NotFound (``not_found``: the user has no such passkey)."""
    return Call("DELETE", f"/v1/users/{_seg(user_id)}/passkeys/{_seg(passkey_id)}",
                lambda r: Passkey.from_json(r.body), idempotent=True)


# -- organizations and memberships ------------------------------------------------------------


def create_organization(name: str, slug: str, *,
                        metadata: Mapping[str, Any] | None = None) -> Call[Organization]:
    """Create an organization (``POST /v1/organizations``); ``slug`` lowercase alphanumeric with
    hyphens, unique in the project. Raises SlugInUse (409), InvalidRequest (``invalid_slug``)."""
    body = _changes(name=name, slug=slug, metadata=dict(metadata) if metadata is not None else UNSET)
    return Call("POST", "/v1/organizations", lambda r: Organization.from_json(r.body), json=body)


def get_organization(org_id: str) -> Call[Organization]:
    """One organization; OrganizationNotFound when there is none."""
    return Call("GET", f"/v1/organizations/{_seg(org_id)}", lambda r: Organization.from_json(r.body),
                idempotent=True)


def list_organizations(*, limit: int | None = None, cursor: str | None = None) -> Call[Page[Organization]]:
    """A page of the project's organizations in creation order."""
    return Call("GET", "/v1/organizations", _page(Organization.from_json),
                params={"limit": limit, "cursor": cursor}, idempotent=True)


def update_organization(org_id: str, *, name: str = UNSET, slug: str = UNSET,
                        metadata: Mapping[str, Any] = UNSET) -> Call[Organization]:
    """Change an organization's name, slug or metadata (replaced whole)."""
    body = _changes(name=name, slug=slug, metadata=dict(metadata) if metadata is not UNSET else UNSET)
    return Call("PATCH", f"/v1/organizations/{_seg(org_id)}", lambda r: Organization.from_json(r.body),
                json=body, idempotent=True)


def delete_organization(org_id: str) -> Call[Deleted]:
    """Delete an organization with its memberships and invitations."""
    return Call("DELETE", f"/v1/organizations/{_seg(org_id)}", lambda r: Deleted.from_json(r.body),
                idempotent=True)


def add_membership(org_id: str, user_id: str, *, role: str | None = None) -> Call[Membership]:
    """Add a user of the project to the organization (``role`` ``member`` by default). Raises
    AlreadyAMember (409), OrganizationNotFound."""
    body = _changes(user_id=user_id, role=role if role is not None else UNSET)
    return Call("POST", f"/v1/organizations/{_seg(org_id)}/memberships",
                lambda r: Membership.from_json(r.body), json=body)


def get_membership(org_id: str, membership_id: str) -> Call[Membership]:
    """One membership; MembershipNotFound when there is none."""
    return Call("GET", f"/v1/organizations/{_seg(org_id)}/memberships/{_seg(membership_id)}",
                lambda r: Membership.from_json(r.body), idempotent=True)


def list_memberships(org_id: str, *, status: str | None = None, limit: int | None = None,
                     cursor: str | None = None) -> Call[Page[Membership]]:
    """A page of an organization's memberships (``status`` ``active`` or ``suspended`` filters)."""
    return Call("GET", f"/v1/organizations/{_seg(org_id)}/memberships", _page(Membership.from_json),
                params={"status": status, "limit": limit, "cursor": cursor}, idempotent=True)


def update_membership(org_id: str, membership_id: str, *, role: str = UNSET,
                      status: str = UNSET) -> Call[Membership]:
    """Change a membership's role or status (``active`` or ``suspended``)."""
    return Call("PATCH", f"/v1/organizations/{_seg(org_id)}/memberships/{_seg(membership_id)}",
                lambda r: Membership.from_json(r.body), json=_changes(role=role, status=status),
                idempotent=True)


def remove_membership(org_id: str, membership_id: str) -> Call[Deleted]:
    """Remove a user from the organization."""
    return Call("DELETE", f"/v1/organizations/{_seg(org_id)}/memberships/{_seg(membership_id)}",
                lambda r: Deleted.from_json(r.body), idempotent=True)


# -- invitations -------------------------------------------------------------------------------


def create_invitation(org_id: str, email: str, *, role: str | None = None) -> Call[Invitation]:
    """Invite ``email`` to the organization with ``role`` (``member`` by default; ``POST
    /v1/organizations/{org_id}/invitations``): the invitation is ``pending`` until its e-mailed
    link is used, for ``SERVICE_INVITATION_TTL_SECONDS`` (7 days by default). Raises
    OrganizationNotFound, InvitationPending (409: one is pending for that e-mail),
    AlreadyAMember (409), InvalidRequest (``invalid_email`` 422)."""
    body = _changes(email=email, role=role if role is not None else UNSET)
    return Call("POST", f"/v1/organizations/{_seg(org_id)}/invitations",
                lambda r: Invitation.from_json(r.body), json=body)


def get_invitation(org_id: str, invitation_id: str) -> Call[Invitation]:
    """One invitation of the organization; InvitationNotFound when it has none by that id."""
    return Call("GET", f"/v1/organizations/{_seg(org_id)}/invitations/{_seg(invitation_id)}",
                lambda r: Invitation.from_json(r.body), idempotent=True)


def list_invitations(org_id: str, *, status: str | None = None, limit: int | None = None,
                     cursor: str | None = None) -> Call[Page[Invitation]]:
    """A page of the organization's invitations in creation order; ``status`` (``pending``,
    ``accepted``, ``revoked``, ``expired``) filters. Raises OrganizationNotFound."""
    return Call("GET", f"/v1/organizations/{_seg(org_id)}/invitations", _page(Invitation.from_json),
                params={"status": status, "limit": limit, "cursor": cursor}, idempotent=True)


def revoke_invitation(org_id: str, invitation_id: str) -> Call[Invitation]:
    """Revoke a pending invitation: its link stops working; answers it ``revoked``. Raises
    InvitationNotFound, InvitationNotPending (409: already accepted, revoked or expired)."""
    # Not resent after a broken connection: a revoke that went through would then answer 409.
    return Call("POST", f"/v1/organizations/{_seg(org_id)}/invitations/{_seg(invitation_id)}/revoke",
                lambda r: Invitation.from_json(r.body))


# -- admin portal and SCIM ----------------------------------------------------------------------


def create_portal_link(organization_id: str, intent: str, *,
                       ttl_seconds: int | None = None) -> Call[PortalLink]:
    """A one-time link to the admin portal for the organization's IT administrator (``POST
    /v1/portal/links``): ``intent`` ``scim`` (connect a directory) or ``domain_verification``
    (prove a domain by DNS); usable once within ``ttl_seconds`` (60 to 86,400; 300 by
    default). Raises OrganizationNotFound, InvalidRequest."""
    body = _changes(organization_id=organization_id, intent=intent,
                    ttl_seconds=ttl_seconds if ttl_seconds is not None else UNSET)
    return Call("POST", "/v1/portal/links", lambda r: PortalLink.from_json(r.body), json=body)


def create_organization_scim_token(org_id: str, *, store_id: str | None = UNSET) -> Call[ScimToken]:
    """Mint the organization's SCIM token, replacing its previous one at once (``POST
    /v1/organizations/{org_id}/scim-token``). ``store_id`` the store whose tuples the
    directory's groups write (``group:<grp_ id>#member@user:<user_ id>``), None for none; left
    out, the organization keeps the store it had. Raises OrganizationNotFound, StoreNotFound."""
    return Call("POST", f"/v1/organizations/{_seg(org_id)}/scim-token",
                lambda r: ScimToken.from_json(r.body), json=_changes(store_id=store_id))


# -- API keys -----------------------------------------------------------------------------------


def create_api_key(name: str, *, scopes: Sequence[str] = (), prefix: str = "sk_live_") -> Call[ApiKey]:
    """Create an API key (its ``secret`` is in this answer only). ``scopes`` empty means full
    access; a key never creates a key with more access than itself (InsufficientScope)."""
    return Call("POST", "/v1/api-keys", lambda r: ApiKey.from_json(r.body),
                json={"prefix": prefix, "name": name, "scopes": list(scopes)})


def list_api_keys(*, limit: int | None = None, cursor: str | None = None) -> Call[Page[ApiKey]]:
    """A page of the project's API keys (never their secrets)."""
    return Call("GET", "/v1/api-keys", _page(ApiKey.from_json),
                params={"limit": limit, "cursor": cursor}, idempotent=True)


def revoke_api_key(key_id: str) -> Call[ApiKey]:
    """Revoke an API key: it stops working at once on every service."""
    return Call("DELETE", f"/v1/api-keys/{_seg(key_id)}", lambda r: ApiKey.from_json(r.body),
                idempotent=True)


# -- stores, tuples, checks -----------------------------------------------------------------------


def create_store(name: str) -> Call[Store]:
    """Create a tuple store, at revision 0."""
    return Call("POST", "/v1/stores", lambda r: Store.from_json(r.body), json={"name": name})


def get_store(store_id: str) -> Call[Store]:
    """A store and its latest revision; StoreNotFound when the project has none by that id."""
    return Call("GET", f"/v1/stores/{_seg(store_id)}", lambda r: Store.from_json(r.body), idempotent=True)


def list_stores(*, limit: int | None = None, cursor: str | None = None) -> Call[Page[Store]]:
    """A page of the project's stores in creation order."""
    return Call("GET", "/v1/stores", _page(Store.from_json),
                params={"limit": limit, "cursor": cursor}, idempotent=True)


def write_tuples(store_id: str, *, writes: Iterable[TupleLike] = (), deletes: Iterable[TupleLike] = (),
                 idempotency_key: str | None = None) -> Call[WriteResult]:
    """Write and delete tuples atomically (1 to 1,000 in all; ``POST /v1/stores/{id}/write``).

    An ``Idempotency-Key`` (a new UUID unless ``idempotency_key`` is given) goes with the call
    and with each of its retries, so a write answered 503 or lost on the wire and sent again is
    applied once, and the answer is the first one's (``replayed=True`` when the service says
    so). The answer's ``revision`` is what to pass as a check's ``at_least_revision``. Raises
    StoreNotFound, InvalidRequest, IdempotencyKeyReused (a key reused with other tuples)."""
    key = idempotency_key or str(uuid.uuid4())
    body: dict[str, Any] = {}
    w = [tuple_key(t).to_json() for t in writes]
    d = [tuple_key(t).to_json() for t in deletes]
    if w:
        body["writes"] = w
    if d:
        body["deletes"] = d

    def parse(r: Reply) -> WriteResult:
        b = r.body
        return WriteResult(int(b["written"]), int(b["deleted"]), Revision(store_id, int(b["revision"])),
                           key, r.headers.get("idempotent-replayed") == "true", r.request_id)
    return Call("POST", f"/v1/stores/{_seg(store_id)}/write", parse, json=body,
                headers={"Idempotency-Key": key})


def list_tuples(store_id: str, *, object: str | None = None, relation: str | None = None,
                user: str | None = None, limit: int | None = None,
                cursor: str | None = None) -> Call[Page[StoredTuple]]:
    """A page of a store's tuples in (object, relation, user) order, filtered exactly."""
    return Call("GET", f"/v1/stores/{_seg(store_id)}/tuples", _page(StoredTuple.from_json),
                params={"object": object, "relation": relation, "user": user, "limit": limit,
                        "cursor": cursor}, idempotent=True)


def check_body(tuple_: TupleKey, at_least: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"tuple_key": tuple_.to_json()}
    if at_least is not None:
        body["consistency"] = {"at_least_revision": at_least}
    return body


def check(store_id: str, object: str, relation: str, user: str, *,
          at_least_revision: Revision | int | None = None) -> Call[CheckResult]:
    """Does ``user`` have ``relation`` on ``object``? (``POST /v1/stores/{id}/check``, answered
    by the engine from memory.) ``at_least_revision`` (a write's :class:`Revision`) makes the
    check see that write: the engine waits for it (bounded; ``revision_not_reached`` 503 is
    retried), and a revision beyond the store's latest is RevisionAhead at once. Raises
    StoreNotFound, InvalidRequest, ResolutionTooComplex (the depth cap, never a no)."""
    body = check_body(TupleKey(object, relation, user), _revision(store_id, at_least_revision))
    stale = "x-authio-stale"
    return Call("POST", f"/v1/stores/{_seg(store_id)}/check",
                lambda r: CheckResult.from_json(r.body, r.headers.get(stale) == "true"),
                json=body, idempotent=True, target="engine")


def item_result(item: Mapping[str, Any], stale: bool, request_id: str | None) -> CheckResult | AuthioError:
    """One result of a batch-check answer: the check's answer, or the error of that item alone."""
    info = item.get("error")
    if isinstance(info, Mapping):
        status = _ITEM_STATUS.get(str(info.get("code")), 400)
        err = error_from(status, {"error": info}, request_id=request_id)
        if status == 503:
            err.retry_after = 1.0
        return err
    return CheckResult.from_json(item, stale)


_ITEM_STATUS: Final = {"invalid_request": 400, "revision_ahead": 400, "resolution_too_complex": 422,
                       "revision_not_reached": 503}


def batch_check_chunk(store_id: str, items: Sequence[Mapping[str, Any]],
                      at_least: int | None) -> Call[list[CheckResult | AuthioError]]:
    """One ``batch-check`` request of at most :data:`MAX_BATCH` ready items."""
    body: dict[str, Any] = {"checks": list(items)}
    if at_least is not None:
        body["consistency"] = {"at_least_revision": at_least}

    def parse(r: Reply) -> list[CheckResult | AuthioError]:
        stale = bool(r.body.get("stale")) or r.headers.get("x-authio-stale") == "true"
        return [item_result(i, stale, r.request_id) for i in r.body["results"]]
    return Call("POST", f"/v1/stores/{_seg(store_id)}/batch-check", parse, json=body, idempotent=True,
                target="engine")


def batch_items(store_id: str, checks: Iterable[TupleLike],
                at_least_revision: Revision | int | None) -> tuple[list[dict[str, Any]], int | None]:
    return ([{"tuple_key": tuple_key(c).to_json()} for c in checks],
            _revision(store_id, at_least_revision))


# -- audit ----------------------------------------------------------------------------------------


def list_audit_events(*, type: str | Sequence[str] | None = None, user: str | None = None,
                      actor: str | None = None, since: datetime | str | None = None,
                      until: datetime | str | None = None, q: str | None = None,
                      limit: int | None = None, cursor: str | None = None) -> Call[Page[AuditEvent]]:
    """A page of the project's audit events, newest first (``GET /v1/audit/events``, SPEC.md 4
    "Audit query filters"): ``type`` action names, ``user`` and ``actor`` exact ids, ``since``
    and ``until`` the ``from`` and ``to`` timestamps, ``q`` a substring. Needs ``audit:read``."""
    return Call("GET", "/v1/audit/events", _page(AuditEvent.from_json),
                params={"type": type, "user": user, "actor": actor, "from": since, "to": until,
                        "q": q, "limit": limit, "cursor": cursor}, idempotent=True)


# -- webhooks -------------------------------------------------------------------------------------


def _rfc3339(value: datetime | str) -> str:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("a naive datetime: give one with a time zone (UTC)")
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return value


def create_webhook_endpoint(url: str, events: Sequence[str], *,
                            description: str | None = None) -> Call[WebhookEndpoint]:
    """Subscribe ``url`` to the project's events (``POST /v1/webhook-endpoints``): ``events``
    action names (``user.created``...) or ``["*"]``. The answer's ``secret`` (shown this once)
    is what :func:`~authio_client.verify_webhook` checks deliveries with. ``url`` must be
    https and public unless the service runs with ``SERVICE_WEBHOOK_ALLOW_PRIVATE_URLS=true``
    (else InvalidRequest naming ``url``). Needs ``webhooks:write``."""
    body = _changes(url=url, events=list(events),
                    description=description if description is not None else UNSET)
    return Call("POST", "/v1/webhook-endpoints", lambda r: WebhookEndpoint.from_json(r.body), json=body)


def get_webhook_endpoint(endpoint_id: str) -> Call[WebhookEndpoint]:
    """One endpoint, without its secret; NotFound (``not_found``) when there is none."""
    return Call("GET", f"/v1/webhook-endpoints/{_seg(endpoint_id)}",
                lambda r: WebhookEndpoint.from_json(r.body), idempotent=True)


def list_webhook_endpoints(*, limit: int | None = None,
                           cursor: str | None = None) -> Call[Page[WebhookEndpoint]]:
    """A page of the project's webhook endpoints, oldest first (without their secrets)."""
    return Call("GET", "/v1/webhook-endpoints", _page(WebhookEndpoint.from_json),
                params={"limit": limit, "cursor": cursor}, idempotent=True)


def update_webhook_endpoint(endpoint_id: str, *, url: str = UNSET, events: Sequence[str] = UNSET,
                            description: str | None = UNSET,
                            status: str = UNSET) -> Call[WebhookEndpoint]:
    """Change the fields given (``PATCH /v1/webhook-endpoints/{id}``); ``status`` ``disabled``
    stops deliveries, ``active`` enables a disabled endpoint again (then
    :meth:`recover_webhook_endpoint` queues what failed). Raises NotFound, InvalidRequest."""
    body = _changes(url=url, events=list(events) if events is not UNSET else UNSET,
                    description=description, status=status)
    return Call("PATCH", f"/v1/webhook-endpoints/{_seg(endpoint_id)}",
                lambda r: WebhookEndpoint.from_json(r.body), json=body, idempotent=True)


def delete_webhook_endpoint(endpoint_id: str) -> Call[Deleted]:
    """Delete an endpoint and its deliveries: nothing more is sent to it. Raises NotFound."""
    return Call("DELETE", f"/v1/webhook-endpoints/{_seg(endpoint_id)}",
                lambda r: Deleted.from_json(r.body), idempotent=True)


def rotate_webhook_endpoint_secret(endpoint_id: str) -> Call[WebhookEndpoint]:
    """Replace the endpoint's signing secret; the answer carries the new one (shown this once).
    For 24 hours deliveries are signed under the previous secret too, so a receiver can switch
    without losing any. Raises NotFound."""
    return Call("POST", f"/v1/webhook-endpoints/{_seg(endpoint_id)}/rotate-secret",
                lambda r: WebhookEndpoint.from_json(r.body))


def recover_webhook_endpoint(endpoint_id: str, since: datetime | str) -> Call[int]:
    """Queue again every failed delivery of the endpoint made at or after ``since`` (an aware
    datetime, or RFC 3339 text) and answer how many (``POST .../recover``). Raises NotFound."""
    return Call("POST", f"/v1/webhook-endpoints/{_seg(endpoint_id)}/recover",
                lambda r: int(r.body["requeued"]), json={"since": _rfc3339(since)})


def list_webhook_deliveries(endpoint_id: str, *, status: str | None = None, limit: int | None = None,
                            cursor: str | None = None) -> Call[Page[WebhookDelivery]]:
    """A page of an endpoint's deliveries, newest first, each with every attempt; ``status``
    (``pending``, ``succeeded``, ``failed``) filters. Raises NotFound."""
    return Call("GET", f"/v1/webhook-endpoints/{_seg(endpoint_id)}/deliveries",
                _page(WebhookDelivery.from_json),
                params={"status": status, "limit": limit, "cursor": cursor}, idempotent=True)


def replay_webhook_delivery(delivery_id: str) -> Call[WebhookDelivery]:
    """Send one delivery again now, whatever its status, with the same ``webhook-id`` (``POST
    /v1/webhook-deliveries/{id}/replay``); answers it queued. Raises NotFound."""
    return Call("POST", f"/v1/webhook-deliveries/{_seg(delivery_id)}/replay",
                lambda r: WebhookDelivery.from_json(r.body))


# -- data-subject requests ------------------------------------------------------------------------


def create_dsr(user_email: str, request_type: str, *, due_days: int | None = None,
               notes: str | None = None) -> Call[DataSubjectRequest]:
    """Record a data-subject request (``POST /v1/compliance/dsr``): ``request_type``
    ``deletion`` or ``export`` of what the project holds about ``user_email`` (an address the
    project does not know is accepted), due ``due_days`` (1 to 90; 30 by default, 45 for
    CCPA) days from now; ``notes`` free text up to 2,000 characters. Answers it ``pending``.
    Needs ``compliance:write``. Raises InvalidRequest."""
    body = _changes(request_type=request_type, user_email=user_email,
                    due_days=due_days if due_days is not None else UNSET,
                    notes=notes if notes is not None else UNSET)
    return Call("POST", "/v1/compliance/dsr", lambda r: DataSubjectRequest.from_json(r.body), json=body)


def get_dsr(dsr_id: str) -> Call[DataSubjectRequest]:
    """One data-subject request: its status, due date and what fulfilling it did. Raises
    NotFound (``not_found``)."""
    return Call("GET", f"/v1/compliance/dsr/{_seg(dsr_id)}", lambda r: DataSubjectRequest.from_json(r.body),
                idempotent=True)


def list_dsrs(*, status: str | None = None, type: str | None = None, overdue: bool | None = None,
              limit: int | None = None, cursor: str | None = None) -> Call[Page[DataSubjectRequest]]:
    """A page of the project's data-subject requests, oldest first; ``status`` (``pending``,
    ``in_progress``, ``fulfilled``), ``type`` (``deletion``, ``export``) and ``overdue`` (True:
    past due and not fulfilled; False: the others) filter."""
    return Call("GET", "/v1/compliance/dsr", _page(DataSubjectRequest.from_json),
                params={"status": status, "type": type, "overdue": overdue, "limit": limit,
                        "cursor": cursor}, idempotent=True)


def fulfill_dsr(dsr_id: str, *, output_artifact_url: str | None = None) -> Call[Fulfilment]:
    """Fulfil a data-subject request (``POST /v1/compliance/dsr/{id}/fulfill``), once; again it
    answers the first result. A deletion removes the user's rows and the tuples naming it in
    every store at once and anonymizes its history; an export (``output_artifact_url``, where
    its document is handed over, required) answers the JSON ``document`` of everything held
    about the user. ``finishing`` in the answer: another process is finishing the deletion.
    Raises NotFound, InvalidRequest."""
    body = _changes(output_artifact_url=output_artifact_url if output_artifact_url is not None else UNSET)
    return Call("POST", f"/v1/compliance/dsr/{_seg(dsr_id)}/fulfill",
                lambda r: Fulfilment.from_json(r.body, finishing=r.status == 202), json=body,
                idempotent=True)


# -- risk ---------------------------------------------------------------------------------------


def get_risk_policy() -> Call[RiskPolicy]:
    """The project's risk policy (``GET /v1/risk/policy``): the thresholds and every signal
    with its weight; the documented default (``default=True``: challenge at 50, block at 90,
    every signal enabled) until one is set."""
    return Call("GET", "/v1/risk/policy", lambda r: RiskPolicy.from_json(r.body), idempotent=True)


def replace_risk_policy(threshold_challenge: int, threshold_block: int, *,
                        signals: Mapping[str, Mapping[str, Any]] | None = None) -> Call[RiskPolicy]:
    """Set the project's risk policy (``PUT /v1/risk/policy``): thresholds 0 to 100,
    ``threshold_challenge`` lower than ``threshold_block``; ``signals`` by name, each
    ``{"weight": int, "enabled": bool}`` (``enabled`` True by default), a signal left out
    taking its default. Applies at once. Needs ``risk:write``. Raises InvalidRequest (an
    unknown signal, thresholds out of order)."""
    body: dict[str, Any] = {"threshold_challenge": threshold_challenge, "threshold_block": threshold_block}
    if signals is not None:
        body["signals"] = {name: dict(setting) for name, setting in signals.items()}
    return Call("PUT", "/v1/risk/policy", lambda r: RiskPolicy.from_json(r.body), json=body,
                idempotent=True)


def get_risk_decision(decision_id: str) -> Call[RiskDecision]:
    """One risk decision: every signal with its contribution and reason, and what it saw.
    Raises NotFound (``not_found``)."""
    return Call("GET", f"/v1/risk/decisions/{_seg(decision_id)}", lambda r: RiskDecision.from_json(r.body),
                idempotent=True)


def list_risk_decisions(*, user: str | None = None, decision: str | None = None,
                        since: datetime | str | None = None, until: datetime | str | None = None,
                        limit: int | None = None, cursor: str | None = None) -> Call[Page[RiskDecision]]:
    """A page of the project's risk decisions, newest first: ``user`` a user id, ``decision``
    ``allow``, ``challenge`` or ``block``, ``since`` and ``until`` the ``from`` and ``to``
    times."""
    return Call("GET", "/v1/risk/decisions", _page(RiskDecision.from_json),
                params={"user": user, "decision": decision, "from": since, "to": until,
                        "limit": limit, "cursor": cursor}, idempotent=True)


# -- OAuth providers ------------------------------------------------------------------------------


def get_oauth_provider(provider: str) -> Call[OAuthProvider]:
    """A sign-in provider's configuration in the project, without its client secret (``GET
    /v1/oauth/providers/{provider}``). Raises UnknownProvider (404) when it is not configured."""
    return Call("GET", f"/v1/oauth/providers/{_seg(provider)}", lambda r: OAuthProvider.from_json(r.body),
                idempotent=True)


def replace_oauth_provider(provider: str, *, client_id: str, client_secret: str,
                           redirect_uris: Sequence[str], issuer: str | None = None,
                           scopes: Sequence[str] | None = None) -> Call[OAuthProvider]:
    """Configure a sign-in provider, replacing its configuration (``PUT
    /v1/oauth/providers/{provider}``; ``created`` True when it was not configured). ``google``,
    ``github``, ``microsoft`` and ``apple`` are those providers; any other name is a generic
    OpenID Connect provider and needs ``issuer``. ``redirect_uris`` the application pages a
    sign-in may return to; ``scopes`` default to the provider's. The client secret is stored
    encrypted and never answered; register the answer's ``callback_url`` at the provider.
    Raises InvalidRequest (naming the field)."""
    body = _changes(client_id=client_id, client_secret=client_secret, redirect_uris=list(redirect_uris),
                    issuer=issuer if issuer is not None else UNSET,
                    scopes=list(scopes) if scopes is not None else UNSET)
    return Call("PUT", f"/v1/oauth/providers/{_seg(provider)}",
                lambda r: OAuthProvider.from_json(r.body, created=r.status == 201), json=body,
                idempotent=True)


def delete_oauth_provider(provider: str) -> Call[str]:
    """Delete a provider's configuration: sign-ins with it are refused until it is configured
    again (the identities linked through it stay). Answers the provider's name. Raises
    UnknownProvider."""
    return Call("DELETE", f"/v1/oauth/providers/{_seg(provider)}", lambda r: str(r.body["provider"]),
                idempotent=True)


# -- signing keys, sessions -------------------------------------------------------------------------


def rotate_signing_key(*, alg: str | None = None) -> Call[SigningKey]:
    """Rotate the project's signing key now (``keys:write``): the new key signs at once, the old
    one stays in the JWKS until its tokens have expired. ``alg`` ``EdDSA`` or ``RS256``."""
    return Call("POST", "/v1/signing-keys/rotate", lambda r: SigningKey.from_json(r.body),
                json=_changes(alg=alg if alg is not None else UNSET))


def get_jwks(project_id: str) -> Call[dict[str, Any]]:
    """The project's JWK Set (RFC 7517), ``GET /v1/auth/.well-known/jwks.json`` (public)."""
    return Call("GET", "/v1/auth/.well-known/jwks.json", lambda r: dict(r.body),
                params={"project_id": project_id}, idempotent=True, bearer="")


def edge_validate(token: str, *, project_id: str | None = None, store_id: str | None = None,
                  object: str | None = None, relation: str | None = None) -> Call[dict[str, Any]]:
    """Ask the engine whether the session of ``token`` is valid now (``GET /v1/edge/validate``):
    its identity (``user_id``, ``session_id``, ``org_id``, ``org_role``, ``project_id``), or
    InvalidSession (``reason`` ``revoked``, ``expired``, ``signature``, ``project``) / NoSession;
    with ``store_id``, ``object`` and ``relation`` also checks ``user:<sub>`` (Forbidden when
    denied)."""
    return Call("GET", "/v1/edge/validate", lambda r: dict(r.body),
                params={"project_id": project_id, "store_id": store_id, "object": object,
                        "relation": relation}, idempotent=True, target="engine", bearer=token)


def revoke_session(access_token: str) -> Call[dict[str, Any]]:
    """Sign the session of ``access_token`` out everywhere, at once (``POST
    /v1/sessions/revoke``)."""
    # Not resent after a broken connection: a revoke that went through would then answer 401.
    return Call("POST", "/v1/sessions/revoke", lambda r: dict(r.body), bearer=access_token)
