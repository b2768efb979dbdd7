"""Domain verification through the admin portal, end to end against a real DNS server (dnslib,
``tests/fixtures/dns.py``): the TXT record to publish, the lookup through
``SERVICE_DNS_RESOLVER``, and the outcomes: missing, mismatched, a failing server, verified (an
``organization.updated`` event by the portal's actor), and one organization per verified domain
in a project."""

from __future__ import annotations

import re

import asyncpg

from tests.fixtures.database import events
from tests.fixtures.dns import Zone
from tests.fixtures.identity import make_org
from tests.fixtures.service import Api, Project, assert_error, bootstrap_project, ts
from tests.portal.helpers import domain, opened, portal_call

RECORD_VALUE = re.compile(r"authio-domain-verification=[A-Za-z0-9_-]{32}")


async def add(api: Api, cookie: str, name: str, status: int = 201) -> dict:  # type: ignore[type-arg]
    r = await portal_call(api, "POST", "/v1/portal/domains", cookie, json={"domain": name})
    assert r.status == status, r.body
    return dict(r.body)


async def check(api: Api, cookie: str, name: str) -> dict:  # type: ignore[type-arg]
    r = await portal_call(api, "POST", "/v1/portal/domains/verify", cookie, json={"domain": name})
    assert r.status == 200, r.body
    return dict(r.body)


async def test_a_domain_is_verified_by_its_txt_record(
        portal_service: Api, portal_project: Project, zone: Zone, db: asyncpg.Pool) -> None:
    portal = await opened(portal_service, portal_project)
    name = domain()
    claimed = await add(portal_service, portal.cookie, name.upper() + ".")  # case, trailing dot
    assert claimed["domain"] == name and claimed["status"] == "pending"
    record = claimed["txt_record"]
    assert record["type"] == "TXT" and record["name"] == f"_authio-verification.{name}"
    assert RECORD_VALUE.fullmatch(record["value"]), record
    assert claimed["verified_at"] is None and claimed["checked_at"] is None
    # Added again: the same claim, the same value.
    again = await add(portal_service, portal.cookie, name, status=200)
    assert again["txt_record"] == record

    # Nothing published yet: not verified, and the page is told why.
    asked = len(zone.asked)
    result = await check(portal_service, portal.cookie, name)
    assert (result["verified"], result["outcome"]) == (False, "record_missing")
    assert f"No TXT record was found at {record['name']}" in result["message"]
    assert result["domain"]["status"] == "pending" and result["domain"]["checked_at"] is not None
    assert (record["name"], "TXT") in zone.asked[asked:]  # the lookup reached our DNS server

    # A record with another value (an old challenge, another service's): still not.
    zone.publish(record["name"], "v=spf1 -all", "authio-domain-verification=stale")
    result = await check(portal_service, portal.cookie, name)
    assert (result["verified"], result["outcome"]) == (False, "record_mismatch")
    assert sorted(result["found"]) == ["authio-domain-verification=stale", "v=spf1 -all"]
    assert record["value"] in result["message"]
    assert await events(db, portal_project.id, "organization.updated") != []  # the claim's

    zone.publish(record["name"], record["value"])
    result = await check(portal_service, portal.cookie, name)
    assert (result["verified"], result["outcome"]) == (True, "verified"), result
    assert result["message"] == f"{name} is verified."
    assert result["domain"]["status"] == "verified"
    verified_at = ts(result["domain"]["verified_at"])

    state = await portal_call(portal_service, "GET", "/v1/portal/state", portal.cookie)
    [listed] = state.body["domains"]
    assert listed["domain"] == name and listed["status"] == "verified"
    # Verified stays verified, without asking DNS again.
    asked = len(zone.asked)
    result = await check(portal_service, portal.cookie, name)
    assert result["verified"] and ts(result["domain"]["verified_at"]) == verified_at
    assert len(zone.asked) == asked

    updated = await events(db, portal_project.id, "organization.updated")
    assert [e["metadata"].get("domain_status") for e in updated] == ["pending", "verified"]
    for event in updated:
        assert (event["actor_type"], event["actor_id"]) == ("portal", portal.link["id"])
        assert (event["target_type"], event["target_id"]) == ("organization", portal.org["id"])
        assert event["metadata"]["domain"] == name
        assert event["api_key_id"] is None and event["ip"] == "127.0.0.1"
    assert updated[1]["metadata"]["domain_verified"] is True
    assert name in updated[1]["description"]


async def test_a_failing_dns_server_is_not_a_missing_record(
        portal_service: Api, portal_project: Project, zone: Zone) -> None:
    portal = await opened(portal_service, portal_project)
    name = domain()
    claimed = await add(portal_service, portal.cookie, name)
    zone.publish(claimed["txt_record"]["name"], claimed["txt_record"]["value"])
    zone.refuse = True
    try:
        result = await check(portal_service, portal.cookie, name)
    finally:
        zone.refuse = False
    assert (result["verified"], result["outcome"]) == (False, "lookup_failed"), result
    assert "try again" in result["message"]
    result = await check(portal_service, portal.cookie, name)
    assert result["verified"] is True


async def test_a_verified_domain_belongs_to_one_organization_of_a_project(
        portal_service: Api, portal_project: Project, zone: Zone) -> None:
    name = domain()
    first = await opened(portal_service, portal_project)
    second = await opened(portal_service, portal_project)
    records = [(await add(portal_service, p.cookie, name))["txt_record"] for p in (first, second)]
    assert records[0]["value"] != records[1]["value"]  # each claim its own challenge
    for record in records:
        zone.publish(record["name"], record["value"])
    assert (await check(portal_service, first.cookie, name))["verified"] is True
    r = await portal_call(portal_service, "POST", "/v1/portal/domains/verify", second.cookie,
                          json={"domain": name})
    assert_error(r, 409, "domain_in_use")
    r = await portal_call(portal_service, "POST", "/v1/portal/domains", second.cookie,
                          json={"domain": name})
    assert_error(r, 409, "domain_in_use")
    # Another project's organization is another customer's: it verifies on its own.
    other = await bootstrap_project(portal_service, "other")
    third = await opened(portal_service, other, org=await make_org(other))
    record = (await add(portal_service, third.cookie, name))["txt_record"]
    zone.publish(record["name"], record["value"])
    assert (await check(portal_service, third.cookie, name))["verified"] is True


async def test_what_a_domain_is(portal_service: Api, portal_project: Project) -> None:
    portal = await opened(portal_service, portal_project)
    claimed = await add(portal_service, portal.cookie, "Bücher.Example")
    assert claimed["domain"] == "xn--bcher-kva.example"
    for bad in ("localhost", "https://example.com", "example.com/path", "127.0.0.1",
                "a" * 64 + ".example", "x" * 60 + "." + "y" * 60 + "." + "z" * 60 + "." + "w" * 60):
        r = await portal_call(portal_service, "POST", "/v1/portal/domains", portal.cookie,
                              json={"domain": bad})
        assert_error(r, 400, "invalid_request")
        assert r.body["error"]["details"]["fields"][0]["field"] == "domain", (bad, r.body)
    r = await portal_call(portal_service, "POST", "/v1/portal/domains/verify", portal.cookie,
                          json={"domain": domain()})
    assert_error(r, 404, "not_found")
