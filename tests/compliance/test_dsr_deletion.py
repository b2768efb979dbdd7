"""A data-subject deletion leaves nothing that names the user (SPEC.md 4 rule 2; issue 21).

The user is seeded through the paths that write data about a user: two magic-link sign-ins and
a passkey sign-in (sessions, refresh tokens, risk decisions, known devices and last locations,
messages and links, audit events), a passkey, a membership, a directory's SCIM record of it and
a directory group it is in (whose token names a store: the group's tuple grants a document), tuples
naming it in two stores (as a tuple's user, a userset's object, a tuple's object, and one written
and deleted again), an invitation to its address from another organization, and
webhook deliveries of its events that stay pending (the receiver fails and
the retry comes after ten minutes). After the deletion, SQL over every column of every table
that can hold text (walked from the catalog, so a table added later is covered) finds neither
the user's id nor its address, except in the request's own record; the audit export and the
webhook deliveries made afterwards name neither (an export of the same seed, before, holds it
all and no secret); the edge refuses the user's session as
revoked; and the address registers again as a new user. The engine no longer grants what the
user's tuples granted, no tuple names it, the stores' change logs name it only in the rows of
the revision that deleted its tuples, and an engine that had loaded a store at any earlier
revision, following the log as it now is, ends with exactly the store's tuples. An audit stream that kept failing with
the user's events in its batch sends that batch anonymized afterwards.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from tests.compliance.helpers import naming, receiver
from tests.fixtures.database import events
from tests.fixtures.identity import add_member, email, make_org, session_call, sign_in
from tests.fixtures.service import Api, Project, eventually
from tests.fixtures.webauthn import SoftAuthenticator
from tests.scim.helpers import GROUP, directory, user_body

RP_ID, ORIGIN = "localhost", "http://localhost:8443"
Key = tuple[str, str, str]


async def _allowed(api: Api, store: str, object_: str, user: str) -> bool:
    """The engine's answer to ``object_#viewer@user``, at the store's latest revision."""
    revision = (await api.get(f"/v1/stores/{store}")).body["revision"]
    r = await api.post(f"/v1/stores/{store}/check", {
        "tuple_key": {"object": object_, "relation": "viewer", "user": user},
        "consistency": {"at_least_revision": revision}})
    assert r.status == 200, r.body
    return bool(r.body["allowed"])


async def _log(db: asyncpg.Pool, store: str) -> list[tuple[int, str, Key]]:
    """The store's change log: ``(revision, operation, (object, relation, user))`` in order."""
    return [(r["revision"], r["operation"], (r["object"], r["relation"], r["subject"]))
            for r in await db.fetch("SELECT * FROM tuple_changes WHERE store_id = $1 "
                                    "ORDER BY revision, seq", store)]


def _follow(state: set[Key], log: list[tuple[int, str, Key]], after: int) -> set[Key]:
    """What an engine holding ``state`` at revision ``after`` holds once it has applied ``log``'s
    rows above it (``engine.registry``'s catch-up: a write adds, a delete removes)."""
    state = set(state)
    for revision, operation, key in log:
        if revision > after:
            (state.add if operation == "write" else state.discard)(key)
    return state


async def test_nothing_names_the_user_after_a_deletion(cproject: Project, cdb: asyncpg.Pool) -> None:
    address = email()
    r = await cproject.api.request("PATCH", "/v1/projects/me", json={"webauthn": {
        "rp_id": RP_ID, "rp_name": "Test app", "origins": [ORIGIN]}})
    assert r.status == 200, r.body
    async with receiver(500) as (url, received):
        hook = await cproject.api.post("/v1/webhook-endpoints", {"url": url, "events": ["*"]})
        assert hook.status == 201, hook.body
        # An audit stream to the same failing receiver: it holds its first batch (the user's
        # events among them) and sends it again and again, read afresh each time.
        stream = await cproject.api.post("/v1/audit/streams", {
            "destination": {"type": "webhook", "url": url + "/stream"},
            "actions": ["user.created", "auth.signin_attempt"]})
        assert stream.status == 201, stream.body

        first = await sign_in(cproject, address)
        second = await sign_in(cproject, address, count=2)
        user_id = first.user_id
        options = await session_call(cproject.api, "POST", "/v1/auth/passkey/register/options",
                                     first.access_token, json={"name": "Laptop"})
        assert options.status == 200, options.body
        authenticator = SoftAuthenticator(origin=ORIGIN)
        credential = authenticator.create(options.body)
        registered = await session_call(cproject.api, "POST", "/v1/auth/passkey/register/verify",
                                        first.access_token, json=credential)
        assert registered.status == 201, registered.body
        login = f"/v1/auth/passkey/login/{{}}?project_id={cproject.id}"
        asked = await cproject.api.post(login.format("options"), {}, key=None)
        assert asked.status == 200, asked.body
        third = await cproject.api.post(login.format("verify"), authenticator.get(asked.body), key=None)
        assert third.status == 200, third.body
        org, other = await make_org(cproject), await make_org(cproject)
        await add_member(cproject, org["id"], user_id)
        # An organization's directory provisions the user over SCIM and puts it in a group; its
        # token names a store, where the group's members are tuples.
        stores = [(await cproject.api.post("/v1/stores", {"name": name})).body["id"]
                  for name in ("directory", "documents")]
        synced = await directory(cproject, store_id=stores[0])
        provisioned = await synced.post("/Users", user_body(address, externalId="ext-dsr"))
        assert provisioned.status == 201 and provisioned.body["id"] == user_id, provisioned.body
        group = await synced.post("/Groups", {"schemas": [GROUP], "displayName": "Finance",
                                              "members": [{"value": user_id}]})
        assert group.status == 201, group.body
        me = f"user:{user_id}"
        writes: list[tuple[int, str, list[dict[str, str]]]] = [
            (0, "writes", [{"object": "document:plan", "relation": "viewer",
                            "user": f"group:{group.body['id']}#member"},
                           {"object": "document:secret", "relation": "viewer", "user": me},
                           {"object": "team:core", "relation": "member", "user": f"{me}#friend"},
                           {"object": me, "relation": "manager", "user": "user:bystander"},
                           {"object": "document:plan", "relation": "viewer",
                            "user": "user:bystander"}]),
            (1, "writes", [{"object": "document:old", "relation": "viewer", "user": me},
                           {"object": "document:kept", "relation": "viewer", "user": me}]),
            (1, "deletes", [{"object": "document:old", "relation": "viewer", "user": me}]),
            (1, "writes", [{"object": "document:kept", "relation": "viewer",
                            "user": "user:bystander"}])]
        for index, kind, items in writes:
            r = await cproject.api.post(f"/v1/stores/{stores[index]}/write", {kind: items})
            assert r.status == 200, r.body
        assert await _allowed(cproject.api, stores[0], "document:plan", me)  # through the group
        assert await _allowed(cproject.api, stores[0], "document:secret", me)
        assert await _allowed(cproject.api, stores[1], "document:kept", me)
        logs_before = [await _log(cdb, s) for s in stores]
        invited = await cproject.api.post(f"/v1/organizations/{other['id']}/invitations",
                                          {"email": address})
        assert invited.status == 201, invited.body
        recovery = await cproject.api.post("/v1/recovery/requests", {"user_id": user_id,
                                                                     "email": email()})
        assert recovery.status == 201, recovery.body

        async def pending() -> bool:
            return bool(await cdb.fetchval(
                "SELECT count(*) FROM webhook_deliveries d JOIN audit_events e ON e.id = d.event_id "
                "WHERE d.project_id = $1 AND d.status = 'pending' AND jsonb_array_length(d.attempts) > 0 "
                "AND e.user_id = $2", cproject.id, user_id))
        await eventually(pending, what="failed deliveries of the user's events, pending")

        def streamed(raw: bytes) -> bool:
            return b'"stream_id"' in raw

        async def stream_holds_the_user() -> bool:
            return any(streamed(raw) and user_id.encode() in raw for raw in received)
        await eventually(stream_holds_the_user, what="a stream batch naming the user, failing")
        before = await naming(cdb, [user_id, address])
        assert {"users.email", "sessions.user_id", "passkeys.user_id", "memberships.user_id",
                "invitations.email", "audit_events.user_id", "risk_decisions.user_id",
                "risk_known.user_id", "messages.destination",
                "recovery_requests.user_id"} <= set(before), before

        # The export of the same seed holds all of it, and no secret.
        exported = await cproject.api.post("/v1/compliance/dsr", {"request_type": "export",
                                                                  "user_email": address})
        document = (await cproject.api.post(f"/v1/compliance/dsr/{exported.body['dsr_id']}/fulfill",
                                            {"output_artifact_url": "https://files.example.com/a"})
                    ).body["document"]
        assert document["user"]["id"] == user_id
        assert {s["auth_method"] for s in document["sessions"]} == {"magic_link", "passkey"}
        assert len(document["sessions"]) == 3 and len(document["risk_decisions"]) == 3
        assert [p["id"] for p in document["passkeys"]] == [registered.body["id"]]
        assert sorted(m["organization_id"] for m in document["memberships"]) == \
            sorted([org["id"], synced.org_id])
        assert [(d["organization_id"], d["user_name"], d["external_id"])
                for d in document["directory_users"]] == [(synced.org_id, address, "ext-dsr")]
        assert [(g["group_id"], g["display_name"]) for g in document["directory_groups"]] == \
            [(group.body["id"], "Finance")]
        assert sorted((t["store_id"], t["object"], t["user"]) for t in document["tuples"]) == \
            sorted([(stores[0], f"group:{group.body['id']}", me), (stores[0], "document:secret", me),
                    (stores[0], "team:core", f"{me}#friend"), (stores[0], me, "user:bystander"),
                    (stores[1], "document:kept", me)])
        assert {"user.created", "auth.signin_attempt", "membership.created"} <= \
            {e["action"] for e in document["audit_events"]}
        text = str(document)
        for secret in (first.refresh_token, second.refresh_token, third.body["refresh_token"],
                       first.access_token):
            assert secret not in text

        made = await cproject.api.post("/v1/compliance/dsr", {"request_type": "deletion",
                                                              "user_email": address})
        assert made.status == 201, made.body
        dsr_id = made.body["dsr_id"]
        done = await cproject.api.post(f"/v1/compliance/dsr/{dsr_id}/fulfill", {})
        assert done.status == 200, done.body
        body: dict[str, Any] = done.body
        assert body["user_found"] is True and body["dsr"]["status"] == "fulfilled"
        deleted = body["deleted"]
        assert (deleted["users"], deleted["sessions"], deleted["passkeys"]) == (1, 3, 1)
        assert deleted["memberships"] == 2 and deleted["invitations"] == 1
        assert deleted["scim_users"] == 1 and deleted["scim_group_members"] == 1
        assert deleted["recovery_requests"] == 1
        assert deleted["refresh_tokens"] >= 2 and deleted["messages"] >= 2
        assert deleted["risk_known"] >= 1 and deleted["risk_last_locations"] >= 0
        assert deleted["webhook_deliveries"] >= 1
        assert body["anonymized"]["risk_decisions"] == 3
        assert body["anonymized"]["audit_events"] >= 6
        seen = len(received)

        # Nothing names the user: not a row, not the export, not a delivery made since.
        assert sorted(await naming(cdb, [user_id, address])) == [
            "dsr_requests.user_email", "dsr_requests.user_id", "tuple_changes.object",
            "tuple_changes.subject"]
        # The engine no longer grants what the user's tuples did; the bystander's stay.
        assert not await _allowed(cproject.api, stores[0], "document:plan", me)
        assert not await _allowed(cproject.api, stores[0], "document:secret", me)
        assert not await _allowed(cproject.api, stores[1], "document:kept", me)
        assert await _allowed(cproject.api, stores[0], "document:plan", "user:bystander")
        assert await _allowed(cproject.api, stores[1], "document:kept", "user:bystander")
        tables: list[set[Key]] = []
        for store in stores:
            listed = await cproject.api.get(f"/v1/stores/{store}/tuples?limit=1000")
            tables.append({(t["object"], t["relation"], t["user"]) for t in listed.body["data"]})
            assert user_id not in str(listed.body), listed.body
        assert tables == [{("document:plan", "viewer", "user:bystander"),
                           ("document:plan", "viewer", f"group:{group.body['id']}#member")},
                          {("document:kept", "viewer", "user:bystander")}]
        assert deleted["tuples"] == 5
        # The change logs: the earlier rows redacted, the user named only by the last revision's
        # deletes; an engine that loaded a store at any earlier revision, and follows the log as
        # it is now, ends with the store's tuples (nothing of the user, no redacted leftover).
        for store, before_log, table in zip(stores, logs_before, tables, strict=True):
            after_log = await _log(cdb, store)
            head = after_log[-1][0]
            naming_rows = [row for row in after_log if user_id in str(row[2])]
            assert naming_rows and all(rev == head and op == "delete" for rev, op, _ in naming_rows)
            redacted = [row for row in after_log if "[deleted]" in str(row[2]) and row[0] < head]
            assert len(redacted) == len([row for row in before_log if user_id in str(row[2])])
            for cursor in range(head):
                loaded = _follow(set(), [row for row in before_log if row[0] <= cursor], -1)
                assert _follow(loaded, after_log, cursor) == table, (store, cursor)
        assert body["anonymized"]["tuple_changes"] == sum(
            len([row for row in log if user_id in str(row[2])]) for log in logs_before)
        export = await cproject.api.get("/v1/audit/events.jsonl")
        assert export.status == 200
        assert user_id not in export.raw.decode() and address not in export.raw.decode().lower()
        fulfilled = [e for e in await events(cdb, cproject.id, "dsr.fulfilled")
                     if e["target_id"] == dsr_id]
        assert len(fulfilled) == 1

        async def delivered_since() -> bool:  # dsr.fulfilled's first attempt, the stream's retry
            return any(not streamed(raw) for raw in received[seen:]) and \
                any(streamed(raw) for raw in received[seen:])
        await eventually(delivered_since, within=40, what="a delivery and a stream batch after it")
        for raw in received[seen:]:
            assert user_id.encode() not in raw and address.encode() not in raw.lower()

        # The edge refuses the sessions; the address is free for a new user.
        async def refused() -> bool:
            r = await session_call(cproject.api, "GET", "/v1/edge/validate", second.access_token)
            return r.status == 401 and r.body["error"]["details"]["reason"] == "revoked"
        await eventually(refused, what="the session refused as revoked at the edge")
        again = await cproject.api.post("/v1/users", {"email": address})
        assert again.status == 201 and again.body["id"] != user_id

        repeat = await cproject.api.post(f"/v1/compliance/dsr/{dsr_id}/fulfill", {})
        assert repeat.status == 200
        assert {k: repeat.body[k] for k in ("deleted", "anonymized", "user_found")} == \
            {k: body[k] for k in ("deleted", "anonymized", "user_found")}
        assert len(await events(cdb, cproject.id, "dsr.fulfilled")) == 2  # the export's, this
