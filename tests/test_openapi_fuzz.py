"""schemathesis over the live service's ``GET /openapi.json``: every route and method, no 5xx,
and every answer as the document says (status, content type, body, headers).

The service is the one ``authio serve`` runs (``combined_app``), on a loopback port, in a thread
of its own with its own event loop: schemathesis calls it synchronously (requests), and the
suite's event loop is idle during a synchronous test. ``live`` checks that the document it
serves is, byte for byte, ``DOCUMENT``, which the cases are generated from at collection, one
test per operation (schemathesis' lazy loading from a fixture does not run under pytest 9).

For each operation, with ``SEED`` and derandomized, so CI runs the same cases every time:

* the coverage phase: schemathesis' deterministic boundary and negative values of every
  parameter and body property (missing, wrong type, too long, outside the pattern, ...);
* the fuzzing phase: up to ``MAX_EXAMPLES`` generated cases of each mode, valid and invalid
  (their strings include NUL);
* the examples phase, with ``add_hostile_cases``: for each path parameter, query parameter,
  documented header and JSON string of the body (and the keys of free-form objects), a value
  holding NUL, a lone surrogate (percent-encoded as ED A0 80 in a path or query, ``\\ud800``
  in JSON, a Latin-1 byte in a header), an over-long one (1 MiB in a body, just over 8 KiB in a
  path, query or header), and bodies nested 300 and 100,000 levels deep. schemathesis makes
  none of these itself (no surrogates in its alphabet, control characters stripped from paths,
  short strings).

The checks are schemathesis' defaults (no 5xx; status, content type, body and headers as
documented; valid data accepted; invalid data refused; authentication enforced), with four
narrowed (``no_server_error``, ``valid_data_accepted``, ``invalid_data_refused``,
``auth_enforced``: each exception is listed with its reason and told by the answer's error,
never by its status alone), and ``request_id_check``.

What the document cannot say is given to the cases (``prepare``):

* which ids exist: a case meant as valid gets the ids of resources made for its operation (a
  store, a user, an organization with a membership and an invitation, an API key, an
  incident, a maintenance window, ...), so it reaches the route's rules instead of stopping at
  404;
* which project a public route is for: the live project, in ``project_id``; the project has a
  passkey relying party, so passkey options calls answer options;
* a listing's ``cursor``, which is signed: a valid case starts at the first page;
* credentials: the project's full-access key, the bootstrap token, or the access token of a
  user signed in by magic link for the operation (afresh for each case of sign-out), sent in
  place of those the case carries; a case generated without them keeps none;
* the admin portal's session: a link of the operation's organization opened (a ``scim`` link for
  the SCIM step, a ``domain_verification`` one otherwise), its cookie sent with every case of
  the portal's calls (security ``portalSession``), whose answer without a live session is 410
  ``token_invalid_or_expired`` (``auth_enforced``), which every case would otherwise stop at
  before its body is read. The console's calls (``consoleSession``) get no session: each case
  is refused 401 ``no_session`` before its body is read (tests/operators goes through them).
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
import requests
import schemathesis
from aiohttp import ClientSession, ClientTimeout
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import Failure
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    ignored_auth,
    negative_data_rejection,
    positive_data_acceptance,
)

from common.http import NUL_MESSAGE
from common.openapi import JSON_ARRAY_DEPTH
from common.settings import Settings
from control_plane.app import openapi_document
from control_plane.risk import signals
from tests.fixtures.identity import SignedIn, email, sign_in
from tests.fixtures.service import BOOTSTRAP_TOKEN, Project, bootstrap_project, combined_app, serving
from tests.fixtures.webauthn import SoftAuthenticator
from tests.passkeys.helpers import ORIGIN, register
from tests.passkeys.helpers import configure as configure_passkeys
from tests.portal.helpers import COOKIE as PORTAL_COOKIE
from tests.portal.helpers import make_link, open_link, session_cookie

SEED = 20261125
MAX_EXAMPLES = 50
"""Generated cases per operation and mode in the fuzzing phase, on top of the coverage and
examples phases: about 5,000 requests in all, a minute on two cores."""

REAL = "__real__"
"""A path parameter or project_id the case leaves to ``prepare``: the operation's real one."""
MIB = 1 << 20
OVER_8_KIB = 8 * 1024 + 100
NUL = "nul\x00value"


# --- the live service -------------------------------------------------------------------------


@dataclass
class Live:
    """The service running in its own thread, and the project the run acts in."""

    base_url: str
    project: Project
    loop: asyncio.AbstractEventLoop
    worlds: dict[str, dict[str, str]] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    portal_sessions: dict[str, str] = field(default_factory=dict)

    def run(self, coro: Any) -> Any:
        """Run ``coro`` on the service's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)


@pytest.fixture(scope="module")
def live(settings_factory: Callable[..., Settings]) -> Iterator[Live]:
    # A check waits this long for a revision it asked for: generated revisions are never reached.
    # Webhook receivers may be on loopback: the world's endpoint is (a closed port), so no
    # delivery of the fuzzed project leaves the machine.
    settings = settings_factory(consistency_timeout_ms=100, webhook_allow_private_urls=True)
    loop = asyncio.new_event_loop()
    started: Future[tuple[Live, asyncio.Event]] = Future()
    failed: list[BaseException] = []

    async def main() -> None:
        stop = asyncio.Event()
        async with ClientSession(timeout=ClientTimeout(total=60)) as http, \
                serving(http, combined_app(settings)) as api:
            project = await bootstrap_project(api, "fuzz")
            await configure_passkeys(project)
            started.set_result((Live(api.base_url, project, loop), stop))
            await stop.wait()

    def thread() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(main())
        except BaseException as exc:
            failed.append(exc)
            if not started.done():
                started.set_exception(exc)
        finally:
            loop.close()

    runner = threading.Thread(target=thread, name="fuzzed-service", daemon=True)
    runner.start()
    live, stop = started.result(60)
    served = requests.get(f"{live.base_url}/openapi.json", timeout=30)
    assert served.status_code == 200 and served.content == DOCUMENT
    yield live
    loop.call_soon_threadsafe(stop.set)
    runner.join(60)
    assert not runner.is_alive(), "the fuzzed service did not stop"
    assert not failed, failed


CONFIG = schemathesis.Config.from_dict({
    "seed": SEED,
    "generation": {"mode": "all", "max-examples": MAX_EXAMPLES, "deterministic": True},
    "phases": {"examples": {"fill-missing": True}, "stateful": {"enabled": False}},
})
DOCUMENT = openapi_document(dev_mailbox=True)
"""What the live service serves at /openapi.json (``live`` checks it byte for byte): loaded
here, at collection, so that each operation is a test of its own (schemathesis' lazy loading
from a fixture does not run under this pytest)."""
schema = schemathesis.openapi.from_dict(orjson.loads(DOCUMENT), config=CONFIG)


# --- what the document cannot say -------------------------------------------------------------


async def signed_in(project: Project, address: str, *, count: int = 1) -> SignedIn:
    """A sign-in by magic link that the risk engine lets through whatever the fuzzed
    ``PUT /v1/risk/policy`` cases left in the project's policy (a threshold of 0 challenges
    every sign-in): a policy that scores nothing is put back first."""
    r = await project.api.request("PUT", "/v1/risk/policy", json={
        "threshold_challenge": 99, "threshold_block": 100,
        "signals": {name: {"enabled": False, "weight": 0} for name in signals.NAMES}})
    assert r.status == 200, r.body
    return await sign_in(project, address, count=count)


def world(live: Live, label: str) -> dict[str, str]:
    """Ids of resources made for the operation ``label`` (once), keyed by path parameter."""
    if label not in live.worlds:
        live.worlds[label] = live.run(_make_world(live.project, passkey="{passkey_id}" in label))
    return live.worlds[label]


async def _make_world(project: Project, *, passkey: bool) -> dict[str, str]:
    api = project.api

    async def make(path: str, body: dict[str, Any]) -> str:
        r = await api.post(path, body)
        assert r.status == 201, (path, r.body)
        return str(r.body["id"])

    store = await make("/v1/stores", {"name": "fuzz"})
    address = email()
    user = await make("/v1/users", {"email": address})
    org = await make("/v1/organizations", {"name": "Fuzz", "slug": f"fuzz-{user[-12:]}"})
    membership = await make(f"/v1/organizations/{org}/memberships", {"user_id": user})
    invitation = await make(f"/v1/organizations/{org}/invitations", {"email": email()})
    key = await make("/v1/api-keys", {"prefix": "sk_live_", "name": "fuzz", "scopes": []})
    ids = {"store_id": store, "user_id": user, "org_id": org, "membership_id": membership,
           "invitation_id": invitation, "key_id": key, "provider": "github",
           "tail": "app/things/1"}
    # GitHub: its endpoints are fixed, so starting a sign-in reaches no network.
    r = await api.request("PUT", "/v1/oauth/providers/github", json={
        "client_id": "fuzz", "client_secret": "fuzz-secret",
        "redirect_uris": ["https://app.example.com/"]})
    assert r.status in (200, 201), r.body
    # A webhook endpoint and a delivery: the endpoint's own creation event, fanned out to it.
    r = await api.post("/v1/webhook-endpoints", {"url": "http://127.0.0.1:9/hooks", "events": ["*"]})
    assert r.status == 201, r.body
    ids["endpoint_id"] = r.body["id"]
    for _ in range(100):
        r = await api.get(f"/v1/webhook-endpoints/{ids['endpoint_id']}/deliveries")
        if r.body["data"]:
            break
        await asyncio.sleep(0.1)
    assert r.body["data"], r.body
    ids["delivery_id"] = r.body["data"][0]["id"]
    r = await api.post("/v1/audit/streams", {"destination": {"type": "webhook",
                                                             "url": "http://127.0.0.1:9/stream"}})
    assert r.status == 201, r.body
    ids["stream_id"] = r.body["id"]
    # A data-subject export request (a fuzzed fulfilment of a deletion would delete a user).
    r = await api.post("/v1/compliance/dsr", {"request_type": "export", "user_email": address})
    assert r.status == 201, r.body
    ids["dsr_id"] = r.body["dsr_id"]
    ids["incident_id"] = await make("/v1/incidents", {"severity": "sev2", "title": "Fuzz incident"})
    now = datetime.now(UTC)
    ids["window_id"] = await make("/v1/maintenance-windows", {
        "title": "Fuzz window", "starts_at": (now + timedelta(hours=1)).isoformat(),
        "ends_at": (now + timedelta(hours=2)).isoformat()})
    # A risk decision: a sign-in's (the listing is newest first).
    await signed_in(project, email())
    r = await api.get("/v1/risk/decisions?limit=1")
    assert r.status == 200 and r.body["data"], r.body
    ids["decision_id"] = r.body["data"][0]["id"]
    # A live-import credential, deleted at once: its export would read the origin's API.
    credential = await make("/v1/imports/credentials", {
        "provider": "descope", "source_project_id": "P2fuzz", "token": "K2fuzz"})
    assert (await api.delete(f"/v1/imports/credentials/{credential}")).status == 200
    ids["credential_id"] = credential
    # A recovery request of the user, pending (each operation has a world of its own: an
    # approval moves only that world's user to the new address).
    r = await api.post("/v1/recovery/requests", {"user_id": user, "email": email()})
    assert r.status == 201, r.body
    ids["recovery_id"] = r.body["id"]
    # The organization's SCIM token (its own store for the groups' tuples), and a directory group
    # of the member.
    r = await api.post(f"/v1/organizations/{org}/scim-token", {"store_id": store})
    assert r.status == 201, r.body
    ids["scim_token"] = r.body["token"]
    r = await api.request("POST", "/scim/v2/Groups", key=ids["scim_token"], json={
        "schemas": ["urn:ietf:params:scim:schemas:core:2.0:Group"], "displayName": "Fuzz",
        "members": [{"value": user}]})
    assert r.status == 201, r.body
    ids["group_id"] = r.body["id"]
    ids["resource_type"] = "User"
    ids["schema_id"] = "urn:ietf:params:scim:schemas:core:2.0:User"
    # A dashboard operator of the tenant (each operation its own: a removal deletes it).
    r = await api.post("/v1/operators", {"email": email()})
    assert r.status == 201, r.body
    ids["operator_id"] = r.body["id"]
    if passkey:  # the user's, registered after signing in (the enrollment link came first)
        await configure_passkeys(project)  # again: a fuzzed PATCH /v1/projects/me changes it
        user = await signed_in(project, address, count=2)
        ids["passkey_id"] = (await register(project, user, SoftAuthenticator(ORIGIN)))["id"]
    return ids


async def _open_portal(project: Project, org_id: str, intent: str) -> str:
    link = await make_link(project, org_id, intent)
    r = await open_link(project.api, link["link"])
    assert r.status == 200, r.raw[:300]
    return session_cookie(r)


def portal_session(live: Live, label: str, path: str) -> str:
    """The admin portal session of the operation ``label``, on its world's organization."""
    if label not in live.portal_sessions:
        intent = "scim" if path.startswith("/v1/portal/scim/") else "domain_verification"
        org_id = world(live, label)["org_id"]
        live.portal_sessions[label] = live.run(_open_portal(live.project, org_id, intent))
    return live.portal_sessions[label]


def access_token(live: Live, label: str, *, fresh: bool = False) -> str:
    """The access token of a user signed in for the operation ``label``."""
    if fresh or label not in live.tokens:
        live.tokens[label] = live.run(signed_in(live.project, email())).access_token
    return live.tokens[label]


def security(case: schemathesis.Case) -> set[str]:
    return {name for way in case.operation.definition.raw.get("security", []) for name in way}


def prepare(case: schemathesis.Case, live: Live) -> dict[str, dict[str, str]]:
    """Give ``case`` what the document cannot (the module's docstring); the credentials to send
    (``credentials``)."""
    label = case.operation.label
    valid = case.meta is not None and case.meta.generation.mode is GenerationMode.POSITIVE
    path = case.path_parameters or {}
    for name, value in list(path.items()):
        if valid or value == REAL:
            path[name] = world(live, label)[name]
    query = case.query if case.query is not None else {}
    params = {p["name"] for p in case.operation.definition.raw.get("parameters", [])
              if p["in"] == "query"}
    if "project_id" in params and (valid or query.get("project_id") == REAL):
        query["project_id"] = live.project.id
        case.query = query
    if valid and "cursor" in query:
        del query["cursor"]
    return credentials(case, live)


def credentials(case: schemathesis.Case, live: Live) -> dict[str, dict[str, str]]:
    """The operation's real credentials, as the ``headers`` and ``cookies`` to send over those
    the case carries (explicit credentials: schemathesis then also sends the case without them
    and expects 401). A case generated without them (a negative case about authentication) is
    sent as it is."""
    ways = security(case)
    headers = case.headers or {}
    ours = case.meta is None  # a hostile case: about something else, always authenticated
    path = case.operation.path
    if "portalSession" in ways:
        # A case meant without a valid cookie (a negative one about it) is sent without any.
        bad = case.meta is not None and case.meta.is_negative_at(ParameterLocation.COOKIE)
        if ours or (PORTAL_COOKIE in (case.cookies or {}) and not bad):
            return {"cookies": {PORTAL_COOKIE: portal_session(live, case.operation.label, path)}}
        return {}
    if "apiKey" in ways or "session" in ways:
        if "apiKey" in ways:
            secret = live.project.key
        else:
            revoke = case.operation.method.upper() == "POST" and case.operation.path.endswith("/revoke")
            secret = access_token(live, case.operation.label, fresh=revoke)
        if ours or "Authorization" in headers:
            return {"headers": {"Authorization": f"Bearer {secret}"}}
        if "session" in ways and "service_session" in (case.cookies or {}):
            return {"cookies": {"service_session": secret}}
    if "bootstrapToken" in ways and (ours or "x-service-bootstrap-token" in headers):
        return {"headers": {"x-service-bootstrap-token": BOOTSTRAP_TOKEN}}
    if "scimToken" in ways and (ours or "Authorization" in headers):
        token = world(live, case.operation.label)["scim_token"]
        return {"headers": {"Authorization": f"Bearer {token}"}}
    return {}


def error_code(response: schemathesis.Response) -> str | None:
    try:
        body = orjson.loads(response.content)
        return str(body["error"]["code"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None


def error_details(response: schemathesis.Response) -> dict[str, Any]:
    """The envelope's ``error.details`` ({} for any other body)."""
    try:
        details = orjson.loads(response.content)["error"]["details"]
        return details if isinstance(details, dict) else {}
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return {}


def oauth_error(response: schemathesis.Response) -> str | None:
    """An OAuth error body's ``error`` (RFC 6749 5.2), else None."""
    try:
        error = orjson.loads(response.content)["error"]
        return error if isinstance(error, str) else None
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None


def scim_error(response: schemathesis.Response) -> tuple[str | None, str]:
    """An RFC 7644 error body's ``scimType`` and ``detail`` (None and "" for any other body)."""
    try:
        body = orjson.loads(response.content)
        if body.get("schemas") == ["urn:ietf:params:scim:api:messages:2.0:Error"]:
            return body.get("scimType"), str(body.get("detail", ""))
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        pass
    return None, ""


def _deep_in_arrays(path: str) -> bool:
    """Whether the dotted ``path`` of a refused field runs through more arrays held directly in
    arrays (consecutive indexes) than ``JsonValue`` describes."""
    run = deepest = 0
    for part in path.split("."):
        run = run + 1 if part.isdigit() else 0
        deepest = max(deepest, run)
    return deepest > JSON_ARRAY_DEPTH


def refused_fields(response: schemathesis.Response) -> list[tuple[str, str]]:
    try:
        fields = orjson.loads(response.content)["error"]["details"]["fields"]
        return [(str(f["field"]), str(f["message"])) for f in fields]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return []


NOT_SAYABLE: list[tuple[str, Callable[[schemathesis.Case, schemathesis.Response], bool]]] = [
    ("email-validator's rules are stricter than JSON Schema's `email` format (a special-use "
     "domain such as .test, a local part it does not take)",
     lambda case, r: error_code(r) == "invalid_email"
     or (bool(refused_fields(r)) and all(f == "user_email" for f, _ in refused_fields(r)))
     or (scim_error(r)[0] == "invalidValue" and ("e-mail address" in scim_error(r)[1]
                                                 or "email address" in scim_error(r)[1]))),
    ("a data-subject export's fulfilment needs output_artifact_url and a deletion's takes none: "
     "the type of the request, as 404 is for an id",
     lambda case, r: bool(refused_fields(r)) and all(
         f == "output_artifact_url" for f, _ in refused_fields(r))),
    ("a well-formed link token that was never issued: the state of a link, as 404 is for an id",
     lambda case, r: error_code(r) == "token_invalid_or_expired"),
    ("the request line (8,190 bytes) carries the whole query: the document bounds each "
     "parameter, not their sum once percent-encoded (non-ASCII takes up to 12 bytes a character)",
     lambda case, r: error_details(r).get("reason") == "line_too_long"),
    ("a device's user_code that no device is waiting with, and a device_code never issued (RFC "
     "8628's invalid_grant): the state of a device authorization, as 404 is for an id",
     lambda case, r: refused_fields(r) == [("user_code", "matches no device waiting for approval "
                                                        "(mistyped, or expired: run login again)")]
     or oauth_error(r) == "invalid_grant"),
    ("which internationalized domain names have an ASCII form (IDNA) no pattern can say",
     lambda case, r: bool(refused_fields(r)) and all(
         f.startswith("domains") for f, _ in refused_fields(r))
     and any(not str(d).isascii() for d in case.body.get("domains") or [])),
    ("an organization's domain in the admin portal: which internationalized names have an ASCII "
     "form (IDNA), and whether that form's labels and length still fit DNS (253 characters with "
     "the record's label)",
     lambda case, r: refused_fields(r) != [] and all(f == "domain" for f, _ in refused_fields(r))
     and not str((case.body or {}).get("domain", "")).isascii()),
    ("a project's domains (IDNA, above) and its relying party's origins (on its rp_id, below), "
     "refused in the same answer",
     lambda case, r: bool(refused_fields(r)) and all(
         (f.startswith("domains") and any(not str(d).isascii()
                                          for d in case.body.get("domains") or []))
         or (f == "webauthn.origins" and "or a subdomain of it" in m)
         for f, m in refused_fields(r))),
    ("NUL in an array held in arrays deeper than JsonValue describes them (common.openapi."
     "JSON_ARRAY_DEPTH, for client generators that cannot follow an array's recursion): below "
     "that, any JSON value, though the service refuses NUL anywhere in a body",
     lambda case, r: any(_deep_in_arrays(path) for path in [
         *(f for f, m in refused_fields(r) if m == NUL_MESSAGE),
         *([scim_error(r)[1].removesuffix(f": {NUL_MESSAGE}")]
           if scim_error(r)[1].endswith(NUL_MESSAGE) else [])])),
    ("a SCIM User's emails marked primary, two or more (RFC 7643 2.4 allows one): JSON Schema's "
     "maxContains says it, but schemathesis then filters out too many of the cases it makes "
     "(its health check fails)",
     lambda case, r: scim_error(r)[0] == "invalidValue" and "marked as primary" in scim_error(r)[1]),
    ("an audit listing's `to` may not be earlier than its `from`: two parameters, compared",
     lambda case, r: refused_fields(r) == [("to", "must not be earlier than from")]),
    ("a write's 1,000 tuples are counted across writes and deletes, and a tuple may not be in "
     "both: JSON Schema bounds and deduplicates each array alone",
     lambda case, r: bool(refused_fields(r)) and all(
         m.startswith("repeats ") or "tuples in all" in m for _, m in refused_fields(r))),
    ("a risk policy's threshold_block must be above its threshold_challenge: two fields, "
     "compared",
     lambda case, r: refused_fields(r) == [("threshold_block",
                                            "must be greater than threshold_challenge")]),
    ("a passkey relying party's origins must be on its rp_id: two fields, compared",
     lambda case, r: bool(refused_fields(r)) and all(
         f == "webauthn.origins" and "or a subdomain of it" in m for f, m in refused_fields(r))),
    ("a WebAuthn response or a step-up whose challenge was never issued, or that does not "
     "verify: the state of a ceremony and a signature, as 404 is for an id",
     lambda case, r: error_code(r) in ("unknown_or_expired_challenge", "verification_failed")),
    ("an Idempotency-Key already used with other tuples: the state of a key, as 404 is for an "
     "id (generated keys repeat across cases)",
     lambda case, r: error_code(r) == "idempotency_key_reused"),
    ("a check's consistency.at_least_revision beyond the store's latest revision "
     "(revision_ahead): the state of a store, as 404 is for an id (generated revisions mostly "
     "are)",
     lambda case, r: error_code(r) == "revision_ahead"),
    ("edge validation's permission is store_id, object and relation together or none: three "
     "parameters, counted",
     lambda case, r: bool(refused_fields(r)) and all(
         "store_id, object and relation" in m for _, m in refused_fields(r))),
    ("an OAuth state that was never issued, or is used up: the state of a sign-in, as 404 is "
     "for an id",
     lambda case, r: bool(refused_fields(r)) and all(f == "state" for f, _ in refused_fields(r))),
    ("a redirect_uri that is not one of the provider's: the state of its configuration",
     lambda case, r: refused_fields(r) == [
         ("redirect_uri", "must be one of the provider's redirect_uris")]),
    ("a webhook receiver's or an audit stream destination's URL or server: https (nats, tls), "
     "and a host that is "
     "a name DNS takes (labels of 1 to 63 characters) and public as written and once resolved: "
     "rules on a URL's host beyond a pattern",
     lambda case, r: bool(refused_fields(r)) and all(
         f.rsplit(".", 1)[-1] in ("url", "endpoint_url") or f.startswith("destination.servers.")
         for f, _ in refused_fields(r))),
    ("replaying or recovering the deliveries of a disabled endpoint: the state of an endpoint, "
     "as 404 is for an id (fuzzed PATCHes disable it)",
     lambda case, r: error_code(r) == "invalid_request" and "endpoint_id" in error_details(r)),
    ("an OAuth provider's URLs (https, or http only for a loopback host), and which providers "
     "take an issuer: rules on a URL's host and on the path, beyond a pattern",
     lambda case, r: bool(refused_fields(r)) and all(
         f == "issuer" or f.startswith("redirect_uris") for f, _ in refused_fields(r))),
    ("a magic link's redirect_url on an origin the project allows (its cors_origins and "
     "webauthn.origins): a rule on the project's settings, beyond the URL's pattern",
     lambda case, r: bool(refused_fields(r)) and all(
         f == "redirect_url" and m.startswith("its origin ") for f, m in refused_fields(r))),
    ("an incident's detected_at and notified_at may not be in the future, a maintenance "
     "window's ends_at not in the past: a time compared with the clock",
     lambda case, r: bool(refused_fields(r)) and all(
         (f in ("detected_at", "notified_at") and m == "must not be in the future")
         or (f == "ends_at" and m == "must not be in the past") for f, m in refused_fields(r))),
    ("a maintenance window ends after it starts, and an incident is not notified before it was "
     "detected: two times compared (the stored one when a PATCH gives one)",
     lambda case, r: bool(refused_fields(r)) and all(
         (f, m) in (("ends_at", "must be later than starts_at"),
                    ("starts_at", "must be earlier than ends_at"),
                    ("notified_at", "must not be earlier than detected_at"))
         for f, m in refused_fields(r))),
    ("a SCIM filter's grammar and the attributes it may name (RFC 7644 3.4.2.2), and a PATCH "
     "operation's path grammar, target and value (RFC 7644 3.5.2): a language and the "
     "resource's schema, beyond a pattern",
     lambda case, r: scim_error(r)[0] in ("invalidFilter", "invalidPath", "noTarget",
                                          "mutability")
     or (scim_error(r)[0] == "invalidValue" and case.method.upper() == "PATCH")),
    ("a SCIM If-Match naming a version the resource does not have: the state of a resource, as "
     "404 is for an id",
     lambda case, r: r.status_code == 412 and scim_error(r)[1].startswith("The resource has")),
    ("a SCIM group's members are users of the organization: the state of users, as 404 is for an "
     "id",
     lambda case, r: scim_error(r)[0] == "invalidValue"
     and "is not a User of this organization" in scim_error(r)[1]),
    ("a maintenance window goes scheduled, in_progress, completed in that order, its start "
     "is fixed once started and nothing changes once completed: the state of a window, as 404 "
     "is for an id (fuzzed PATCHes start and complete it)",
     lambda case, r: bool(refused_fields(r)) and all(
         (f == "status" and m.startswith("cannot go from "))
         or m in ("cannot change once the window has started",
                  "cannot change once the window is completed")
         for f, m in refused_fields(r))),
]
"""Refusals of requests the document calls valid, which the document cannot rule out: why, and
how to tell each (never just a status)."""


def valid_data_accepted(ctx: Any, response: schemathesis.Response,
                        case: schemathesis.Case) -> bool | None:
    """schemathesis' ``positive_data_acceptance``, except the refusals of ``NOT_SAYABLE``."""
    try:
        return positive_data_acceptance(ctx, response, case)
    except Failure:
        if response.status_code < 500 and any(tell(case, response) for _, tell in NOT_SAYABLE):
            return None
        raise


def no_server_error(ctx: Any, response: schemathesis.Response,
                    case: schemathesis.Case) -> bool | None:
    """schemathesis' ``not_a_server_error``, except 503 ``revision_not_reached``: the documented
    answer to a check at a committed revision the engine has not followed within its wait
    (DESIGN.md; a generated revision beyond the store's is ``revision_ahead``, 400)."""
    if response.status_code == 503 and error_code(response) == "revision_not_reached":
        return None
    if response.status_code == 501 and case.operation.path == "/scim/v2/.search":
        return None  # RFC 7644 3.12's answer to an operation not offered, as documented
    return not_a_server_error(ctx, response, case)


def _sent_portal_cookie(response: schemathesis.Response) -> bool:
    return f"{PORTAL_COOKIE}=" in (response.request.headers.get("Cookie") or "")


def invalid_data_refused(ctx: Any, response: schemathesis.Response,
                         case: schemathesis.Case) -> bool | None:
    """schemathesis' ``negative_data_rejection``, except a portal call sent without its cookie
    (a case whose cookie is missing or invalid): 410 ``token_invalid_or_expired`` is the
    portal's documented refusal of it (``auth_enforced``)."""
    if ("portalSession" in security(case) and not _sent_portal_cookie(response)
            and (response.status_code, error_code(response)) == (410, "token_invalid_or_expired")):
        return None
    return negative_data_rejection(ctx, response, case)


def auth_enforced(ctx: Any, response: schemathesis.Response,
                  case: schemathesis.Case) -> bool | None:
    """schemathesis' ``ignored_auth``, except for the admin portal's calls (security
    ``portalSession``): without a live portal session they answer 410
    ``token_invalid_or_expired``, the state of the setup link whose session it was (as the
    document says), where ``ignored_auth`` expects 401 or 403. A portal call that was accepted
    is sent again without its cookie and with a cookie of no session, and each must be that
    refusal."""
    if "portalSession" not in security(case):
        return ignored_auth(ctx, response, case)
    if not 200 <= response.status_code < 300:
        return None
    sent = response.request
    headers = {k: v for k, v in sent.headers.items() if k.lower() != "cookie"}
    for cookies in ({}, {PORTAL_COOKIE: "no-such-session"}):
        probe = requests.request(sent.method, sent.url, data=sent.body, headers=headers,
                                 cookies=cookies, timeout=60)
        assert (probe.status_code, error_code(probe)) == (410, "token_invalid_or_expired"), \
            (cookies, probe.status_code, probe.text[:300])
    return None


def request_id_check(ctx: Any, response: schemathesis.Response, case: schemathesis.Case) -> bool:
    """The document's promise on every JSON answer: ``request_id`` is the ``X-Request-Id``."""
    header = response.headers.get("x-request-id")
    assert header, "no X-Request-Id"
    media = (response.headers.get("content-type") or [""])[0]
    if media.startswith("application/json") and response.content:
        body = orjson.loads(response.content)
        if isinstance(body, dict) and "request_id" in body:
            assert [body["request_id"]] == header, (body["request_id"], header)
    return True


# --- hostile cases ----------------------------------------------------------------------------


def _resolve(node: Any, components: dict[str, Any]) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        node = components[node["$ref"].rsplit("/", 1)[1]]
    return node


def string_paths(node: Any, components: dict[str, Any], at: tuple[Any, ...] = (),
                 depth: int = 0) -> Iterator[tuple[tuple[Any, ...], bool]]:
    """Each place in a body of schema ``node`` that holds a string (``False``) or a free-form
    object (``True``: its keys and values are open), as a path of keys and list indexes."""
    node = _resolve(node, components)
    if not isinstance(node, dict) or depth > 6:
        return
    for branch in [*node.get("allOf", []), *node.get("anyOf", []), *node.get("oneOf", [])]:
        yield from string_paths(branch, components, at, depth + 1)
    kind = node.get("type")
    if kind == "string":
        yield at, False
    elif kind == "array" and "items" in node:
        yield from string_paths(node["items"], components, (*at, 0), depth + 1)
    elif kind == "object" or "properties" in node:
        if node.get("additionalProperties") is True or (
                kind == "object" and "properties" not in node):
            yield at, True
        for name, prop in node.get("properties", {}).items():
            yield from string_paths(prop, components, (*at, name), depth + 1)


def put(body: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A copy of ``body`` with ``value`` at ``path`` (objects and lists made as needed)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(head, int):
        items = list(body) if isinstance(body, list) and body else [None]
        items[0] = put(items[0], rest, value)
        return items
    out = dict(body) if isinstance(body, dict) else {}
    out[head] = put(out.get(head), rest, value)
    return out


HOSTILE_TEXT = [NUL, "\ud800 lone surrogate", "x" * MIB]
SURROGATE_IN_URL = "%ED%A0%80"  # U+D800 in CESU-8: what a client percent-encodes for a surrogate
SURROGATE_BYTES = b"\xed\xa0\x80"  # a query value as bytes: requests percent-encodes them as they are
DEEPEST = b'{"deep": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
DEEP_OBJECT = b'{"a":' * 300 + b"1" + b"}" * 300  # past what orjson writes (254 levels)
HOLE = "__deep_object__"


def add_hostile_cases(context: Any, examples: list[schemathesis.Case]) -> None:
    """``before_add_examples``: the hostile values of the module's docstring, each in one place
    of a case otherwise like the phase's own example (its path ids and project left ``REAL``)."""
    operation = context.operation
    raw = operation.definition.raw
    base = examples[0] if examples else operation.Case()
    components = operation.schema.raw_schema.get("components", {}).get("schemas", {})
    params = raw.get("parameters", [])
    path_names = [p["name"] for p in params if p["in"] == "path"]
    query_names = [p["name"] for p in params if p["in"] == "query"]
    header_names = [p["name"] for p in params if p["in"] == "header"]
    body_schema = raw.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    base_body = base.body if isinstance(base.body, dict) else {}

    def case(*, path: dict[str, str] | None = None, query: dict[str, Any] | None = None,
             headers: dict[str, str] | None = None, body: Any = None) -> schemathesis.Case:
        base_query = {k: v for k, v in (base.query or {}).items() if k != "cursor"}
        if "project_id" in query_names:
            base_query["project_id"] = REAL
        parts: dict[str, Any] = {}
        if body_schema is not None:
            parts = {"body": copy.deepcopy(base_body) if body is None else body,
                     "media_type": "application/json"}
        return operation.Case(
            path_parameters={name: REAL for name in path_names} | (path or {}),
            query=base_query | (query or {}), headers=dict(headers or {}), **parts)

    made: list[schemathesis.Case] = []
    for name in path_names:
        for value in ("%00", f"store_%00{name}", SURROGATE_IN_URL, "i" * OVER_8_KIB):
            made.append(case(path={name: value}))
    for name in query_names:
        for value in (NUL, SURROGATE_BYTES, "q" * OVER_8_KIB):
            made.append(case(query={name: value}))
    for name in header_names:
        for value in ("caf\xe9", "h" * OVER_8_KIB):
            made.append(case(headers={name: value}))
    if body_schema is not None:
        for path, open_object in string_paths(body_schema, components):
            for value in HOSTILE_TEXT:
                made.append(case(body=put(base_body, path, value)))
            if open_object:
                made.append(case(body=put(base_body, path, {NUL: "key", "k": [NUL]})))
                # As bytes: schemathesis' own copy of a JSON body stops at 255 levels.
                made.append(case(body=orjson.dumps(put(base_body, path, HOLE)).replace(
                    orjson.dumps(HOLE), DEEP_OBJECT)))
        made.append(case(body=DEEPEST))  # raw bytes: no JSON library writes this deep
    examples.extend(made)


schema.hook("before_add_examples")(add_hostile_cases)


# --- the run ----------------------------------------------------------------------------------


@schema.parametrize()
def test_every_operation(case: schemathesis.Case, live: Live) -> None:
    case.call_and_validate(
        base_url=live.base_url, timeout=60, **prepare(case, live),
        excluded_checks=[positive_data_acceptance, not_a_server_error, ignored_auth,
                         negative_data_rejection],
        additional_checks=[valid_data_accepted, no_server_error, request_id_check,
                           auth_enforced, invalid_data_refused])
