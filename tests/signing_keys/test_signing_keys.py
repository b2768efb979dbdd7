"""Signing keys, access tokens and the JWKS (SPEC.md 2 "Access token", 4, 5.4, 8; DESIGN.md
"signing keys", "access token", "project of public endpoints").

Tokens come from the TokenService of a served app and are verified by jwcrypto, an independent
JOSE library, against the JWK Set fetched over HTTP (issue 4 "Proof").
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg
import orjson
import pytest
import pytest_asyncio
from aiohttp import ClientSession, web
from cryptography.hazmat.primitives import serialization
from jwcrypto import jwk as jose_jwk
from jwcrypto import jwt as jose_jwt
from jwcrypto.common import JWException

from common.access_tokens import AccessClaims, KeySource
from common.appkeys import PG_POOL, SETTINGS, SIGNING_KEYS
from common.errors import NoSession
from common.ids import new_id
from common.jwks import PgKeySource
from common.settings import Settings
from control_plane.appkeys import KMS, TOKENS
from control_plane.kms import KmsError, LocalKms
from control_plane.sessions.tokens import TokenService
from control_plane.signing_keys import crypto as signing_keys
from control_plane.signing_keys import repository as signing_key_rows
from control_plane.signing_keys.service import Keyring
from control_plane.web.auth import verify_access
from tests.fixtures.database import migrated_database
from tests.fixtures.service import (
    KMS_KEY,
    Api,
    Project,
    Response,
    assert_error,
    bootstrap_project,
    combined_app,
    eventually,
    serving,
)

SPEC_CLAIMS = {"iss", "aud", "sub", "sid", "iat", "nbf", "exp", "pid"}
ORG_CLAIMS = {"act_org", "act_role"}


@dataclass
class Tokens:
    """Access tokens as a control-plane process issues (its TokenService) and verifies them
    (``verify_access`` over the published keys)."""

    service: TokenService
    keys: KeySource
    settings: Settings

    @classmethod
    def cold(cls, pool: asyncpg.Pool, kms: LocalKms, settings: Settings) -> Tokens:
        """Another process's, with empty caches."""
        return cls(TokenService(Keyring(pool, kms), settings), PgKeySource(pool), settings)

    async def issue(self, **claims: Any) -> str:
        return await self.service.issue(**claims)

    async def verify(self, token: str) -> AccessClaims:
        return await verify_access(self.keys, self.settings, token)


@dataclass
class Served:
    """A whole app on a loopback port, with its application object (its TokenService)."""

    api: Api
    app: web.Application

    @property
    def tokens(self) -> Tokens:
        return Tokens(self.app[TOKENS], self.app[SIGNING_KEYS], self.app[SETTINGS])

    @property
    def settings(self) -> Settings:
        return self.app[SETTINGS]

    @property
    def issuer(self) -> str:
        return self.app[SETTINGS].public_base_url

    def as_project(self, project: Project) -> Api:
        return self.api.with_key(project.key)


@pytest_asyncio.fixture(scope="module")
async def served(settings_factory: Callable[..., Settings], http: ClientSession) -> AsyncIterator[Served]:
    app = combined_app(settings_factory())
    async with serving(http, app) as api:
        yield Served(api, app)


@pytest_asyncio.fixture(scope="module")
async def served_b(settings_factory: Callable[..., Settings], http: ClientSession) -> AsyncIterator[Served]:
    """A second process on the same database."""
    app = combined_app(settings_factory())
    async with serving(http, app) as api:
        yield Served(api, app)


async def jwks(api: Api, project_id: str, **kw: Any) -> Response:
    return await api.get(f"/v1/auth/.well-known/jwks.json?project_id={project_id}", key=None, **kw)


async def key_set(api: Api, project_id: str) -> jose_jwk.JWKSet:
    r = await jwks(api, project_id)
    assert r.status == 200, r.body
    return jose_jwk.JWKSet.from_json(orjson.dumps({"keys": r.body["keys"]}))


async def listed(api: Api) -> list[dict[str, Any]]:
    r = await api.get("/v1/signing-keys")
    assert r.status == 200, r.body
    return list(r.body["data"])


async def patch_project(api: Api, body: dict[str, Any]) -> Response:
    return await api.request("PATCH", "/v1/projects/me", json=body)


async def issue(tokens: Tokens, project_id: str, *, org: bool = False) -> tuple[str, dict[str, Any]]:
    args: dict[str, Any] = {
        "project_id": project_id, "user_id": new_id("user"), "session_id": new_id("sess"),
        "org_id": new_id("org") if org else None, "role": "admin" if org else None,
        "iat": int(time.time()),
    }
    return await tokens.issue(**args), args


def jose_verify(token: str, keys: jose_jwk.JWKSet, issuer: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(header, claims) of ``token`` as jwcrypto verifies it; raises JWException."""
    t = jose_jwt.JWT(jwt=token, key=keys, algs=["EdDSA", "RS256"],
                     check_claims={"iss": issuer, "aud": "service", "exp": None, "nbf": None})
    return orjson.loads(t.header), orjson.loads(t.claims)


async def audit_rows(db: asyncpg.Pool | asyncpg.Connection, project_id: str,
                     action: str) -> list[dict[str, Any]]:
    rows = await db.fetch(
        "SELECT * FROM audit_events WHERE project_id = $1 AND action = $2 ORDER BY created_at, id",
        project_id, action,
    )
    return [{**dict(r), "metadata": r["metadata"] if isinstance(r["metadata"], dict)
             else orjson.loads(r["metadata"])} for r in rows]


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# --- JWKS -----------------------------------------------------------------------------------------


async def test_jwks_shape_and_headers(project: Project, service: Api) -> None:
    r = await jwks(service, project.id)
    assert r.status == 200, r.body
    assert r.headers["Cache-Control"] == "public, max-age=600"
    assert r.headers["ETag"].startswith('"') and r.headers["ETag"].endswith('"')
    assert r.headers["X-Request-Id"] == r.body["request_id"]
    assert set(r.body) == {"keys", "request_id"}
    # A bootstrapped project gets its first key on first use: one active EdDSA key.
    [key] = r.body["keys"]
    assert set(key) == {"kty", "crv", "x", "kid", "alg", "use"}, key
    assert (key["kty"], key["crv"], key["alg"], key["use"]) == ("OKP", "Ed25519", "EdDSA", "sig")
    assert len(unb64(key["x"])) == 32 and key["kid"].startswith("kid_")
    jose_jwk.JWKSet.from_json(orjson.dumps({"keys": r.body["keys"]}))  # a valid RFC 7517 set
    # The management listing agrees and shows no key material.
    [row] = await listed(project.api)
    assert row["kid"] == key["kid"] and row["status"] == "active" and row["alg"] == "EdDSA"
    assert set(row) == {"kid", "alg", "status", "created_at", "activated_at", "retired_at",
                        "publish_until"}
    # Fetching again neither creates nor changes anything.
    again = await jwks(service, project.id)
    assert again.body["keys"] == r.body["keys"] and again.headers["ETag"] == r.headers["ETag"]


async def test_jwks_not_modified(project: Project, served: Served) -> None:
    first = await jwks(served.api, project.id)
    etag = first.headers["ETag"]
    r = await jwks(served.api, project.id, headers={"If-None-Match": etag})
    assert r.status == 304 and r.raw == b""
    assert r.headers["ETag"] == etag and r.headers["Cache-Control"] == "public, max-age=600"
    assert r.headers["X-Request-Id"]
    assert (await jwks(served.api, project.id, headers={"If-None-Match": f"W/{etag}"})).status == 304
    assert (await jwks(served.api, project.id, headers={"If-None-Match": '"other", ' + etag})).status == 304
    assert (await jwks(served.api, project.id, headers={"If-None-Match": '"other"'})).status == 200
    # A rotation changes the set, so the old validator no longer matches.
    assert (await served.as_project(project).post("/v1/signing-keys/rotate", {})).status == 201
    changed = await jwks(served.api, project.id, headers={"If-None-Match": etag})
    assert changed.status == 200 and len(changed.body["keys"]) == 2
    assert changed.headers["ETag"] != etag


async def test_jwks_project_resolution(project: Project, new_project: Callable[..., Any],
                                       service: Api) -> None:
    other = await new_project("other")
    by_query = await jwks(service, project.id)
    by_header = await service.get("/v1/auth/.well-known/jwks.json", key=None,
                                  headers={"Service-Project": project.id})
    assert by_header.status == 200 and by_header.body["keys"] == by_query.body["keys"]
    assert "Service-Project" in by_header.headers["Vary"]
    # The query parameter wins over the header.
    both = await service.get(f"/v1/auth/.well-known/jwks.json?project_id={other.id}", key=None,
                             headers={"Service-Project": project.id})
    assert both.body["keys"] == (await jwks(service, other.id)).body["keys"] != by_query.body["keys"]
    # A configured domain names the project through the Host header.
    host = f"auth-{secrets.token_hex(4)}.example.test"
    assert (await patch_project(project.api, {"domains": [host.upper()]})).status == 200
    by_host = await service.get("/v1/auth/.well-known/jwks.json", key=None, headers={"Host": host})
    assert by_host.status == 200, by_host.body
    assert by_host.body["keys"] == by_query.body["keys"]
    # Errors: nothing names a project; an unknown or malformed project id; an unknown host.
    r = await service.get("/v1/auth/.well-known/jwks.json", key=None)
    assert_error(r, 400, "invalid_request")
    assert r.body["error"]["details"]["fields"][0]["field"] == "project_id"
    assert_error(await jwks(service, new_id("proj")), 404, "project_not_found")
    assert_error(await jwks(service, "proj_nope"), 404, "project_not_found")
    unknown = await service.get("/v1/auth/.well-known/jwks.json", key=None,
                                headers={"Host": "nobody.example.test"})
    assert_error(unknown, 400, "invalid_request")


# --- project token settings ----------------------------------------------------------------------


async def test_patch_domains(project: Project, new_project: Callable[..., Any], db: asyncpg.Pool) -> None:
    me = await project.api.get("/v1/projects/me")
    assert me.body["signing_alg"] == "EdDSA" and me.body["domains"] == []
    tag = secrets.token_hex(4)
    a, b = f"a-{tag}.example.test", f"b-{tag}.example.test"
    r = await patch_project(project.api, {"domains": [f"  {a.upper()}.", b, b]})
    assert r.status == 200, r.body
    assert r.body["domains"] == sorted([a, b]) and r.body["id"] == project.id
    assert (await project.api.get("/v1/projects/me")).body["domains"] == sorted([a, b])
    # Replacing the set; an empty body changes nothing and records nothing.
    r = await patch_project(project.api, {"domains": [b]})
    assert r.body["domains"] == [b]
    assert (await patch_project(project.api, {})).body["domains"] == [b]
    events = await audit_rows(db, project.id, "project.updated")
    assert [e["metadata"]["changes"] for e in events] == [
        {"domains": {"added": sorted([a, b]), "removed": []}},
        {"domains": {"added": [], "removed": [a]}},
    ]
    assert events[0]["actor_id"] == project.key_id
    # A domain belongs to one project.
    other = await new_project("other")
    clash = await patch_project(other.api, {"domains": ["free-" + tag + ".example.test", b.upper()]})
    assert_error(clash, 409, "domain_in_use")
    assert clash.body["error"]["details"]["domains"] == [b]
    assert (await other.api.get("/v1/projects/me")).body["domains"] == []  # all or nothing
    # A released domain can be taken.
    assert (await patch_project(project.api, {"domains": []})).body["domains"] == []
    assert (await patch_project(other.api, {"domains": [b]})).body["domains"] == [b]


@pytest.mark.parametrize("body", [
    {"domains": ["https://auth.example.test"]}, {"domains": ["auth.example.test:8443"]},
    {"domains": ["auth.example.test/path"]}, {"domains": ["-bad.example.test"]},
    {"domains": ["a..example.test"]}, {"domains": ["10.0.0.1"]}, {"domains": [""]},
    {"domains": ["x" * 64 + ".example.test"]}, {"domains": "auth.example.test"},
    {"domains": [7]}, {"signing_alg": "HS256"}, {"signing_alg": "none"}, {"name": "renamed"},
])
async def test_patch_rejects_bad_input(project: Project, body: dict[str, Any]) -> None:
    r = await patch_project(project.api, body)
    assert_error(r, 400, "invalid_request")
    assert r.body["error"]["details"]["fields"], r.body


async def test_patch_signing_alg_rotates_to_rs256(project: Project, served: Served, db: asyncpg.Pool) -> None:
    api = served.as_project(project)
    old_token, _ = await issue(served.tokens, project.id)  # creates the first (EdDSA) key
    [old] = await listed(api)
    r = await patch_project(api, {"signing_alg": "RS256"})
    assert r.status == 200 and r.body["signing_alg"] == "RS256"
    keys = {k["kid"]: k for k in await listed(api)}
    assert keys[old["kid"]]["status"] == "retired"
    [new] = [k for k in keys.values() if k["status"] == "active"]
    assert new["alg"] == "RS256"
    # The JWKS publishes the new RSA key and still the retired Ed25519 key.
    published = {k["kid"]: k for k in (await jwks(served.api, project.id)).body["keys"]}
    assert set(published) == {old["kid"], new["kid"]}
    rsa = published[new["kid"]]
    assert set(rsa) == {"kty", "n", "e", "kid", "alg", "use"} and rsa["kty"] == "RSA"
    assert rsa["e"] == "AQAB" and len(unb64(rsa["n"])) == 256
    # New tokens are RS256 at once in the process that rotated; the old one still verifies.
    token, _ = await issue(served.tokens, project.id)
    header, _ = jose_verify(token, await key_set(served.api, project.id), served.issuer)
    assert (header["alg"], header["kid"]) == ("RS256", new["kid"])
    assert (await served.tokens.verify(old_token)).kid == old["kid"]
    [event] = await audit_rows(db, project.id, "project.updated")
    assert event["metadata"]["changes"] == {
        "signing_alg": {"from": "EdDSA", "to": "RS256", "kid": new["kid"]}}
    [rotated] = await audit_rows(db, project.id, "signing_key.rotated")
    assert rotated["metadata"]["old_kid"] == old["kid"] and rotated["metadata"]["new_kid"] == new["kid"]
    # Setting the same algorithm again is no change and no rotation.
    assert (await patch_project(api, {"signing_alg": "RS256"})).status == 200
    assert len(await listed(api)) == 2


# --- keys at rest --------------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ["EdDSA", "RS256"])
async def test_private_key_is_sealed(project: Project, db: asyncpg.Pool, alg: str) -> None:
    assert (await project.api.post("/v1/signing-keys/rotate", {"alg": alg})).status == 201
    row = await db.fetchrow(
        "SELECT kid, public_jwk, private_sealed FROM signing_keys WHERE project_id = $1 AND status = 'active'",
        project.id,
    )
    assert row is not None
    kid, sealed, jwk = row["kid"], row["private_sealed"], orjson.loads(row["public_jwk"])
    with pytest.raises(ValueError):
        serialization.load_der_private_key(sealed, password=None)
    assert b"PRIVATE KEY" not in sealed
    kek = base64.b64decode(KMS_KEY)
    der = LocalKms(kek).open(sealed, b"signing_key:" + kid.encode())
    private_key = serialization.load_der_private_key(der, password=None)
    assert der not in sealed
    assert signing_keys.public_jwk(private_key, kid, alg) == jwk
    # Only the right key-encryption key and the key's own kid (aad) open it.
    with pytest.raises(KmsError):
        LocalKms(kek).open(sealed, b"signing_key:" + new_id("kid").encode())
    with pytest.raises(KmsError):
        LocalKms(secrets.token_bytes(32)).open(sealed, b"signing_key:" + kid.encode())


# --- access tokens -------------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ["EdDSA", "RS256"])
async def test_tokens_verify_with_an_independent_library(project: Project, served: Served, alg: str) -> None:
    api = served.as_project(project)
    if alg == "RS256":
        assert (await patch_project(api, {"signing_alg": "RS256"})).status == 200
    token, args = await issue(served.tokens, project.id, org=True)
    issuer = served.issuer
    header, claims = jose_verify(token, await key_set(served.api, project.id), issuer)
    [active] = [k for k in await listed(api) if k["status"] == "active"]
    assert header == {"alg": alg, "kid": active["kid"], "typ": "JWT"}
    ttl = served.settings.access_token_ttl_seconds
    assert claims == {
        "iss": issuer, "aud": "service", "sub": args["user_id"], "act_org": args["org_id"],
        "act_role": "admin", "sid": args["session_id"], "iat": args["iat"], "nbf": args["iat"],
        "exp": args["iat"] + ttl, "pid": project.id,
    }
    assert ttl == 900  # SPEC.md 8: 15 minutes by default
    verified = await served.tokens.verify(token)
    assert verified == AccessClaims(sub=args["user_id"], sid=args["session_id"], pid=project.id,
                                    act_org=args["org_id"], act_role="admin", iat=args["iat"],
                                    exp=args["iat"] + ttl, kid=active["kid"])
    # A verifier with cold caches (another process on the same database) agrees.
    cold = Tokens.cold(served.app[PG_POOL], served.app[KMS], served.settings)
    assert await cold.verify(token) == verified


async def test_claims_without_org_are_exactly_the_spec_set(project: Project, served: Served) -> None:
    token, args = await issue(served.tokens, project.id)
    _, claims = jose_verify(token, await key_set(served.api, project.id), served.issuer)
    assert set(claims) == SPEC_CLAIMS and not ORG_CLAIMS & set(claims)
    assert claims["nbf"] == claims["iat"] == args["iat"]
    verified = await served.tokens.verify(token)
    assert verified.act_org is None and verified.act_role is None
    # An org without a role still carries act_org only.
    token = await served.tokens.issue(project_id=project.id, user_id=new_id("user"),
                                      session_id=new_id("sess"), org_id=new_id("org"), role=None,
                                      iat=int(time.time()))
    _, claims = jose_verify(token, await key_set(served.api, project.id), served.issuer)
    assert set(claims) == SPEC_CLAIMS | {"act_org"}


def _forgeries(token: str, public_jwk: dict[str, Any]) -> dict[str, str]:
    h, p, s = token.split(".")
    header, claims = orjson.loads(unb64(h)), orjson.loads(unb64(p))

    def signed_hs256(secret: bytes) -> str:
        head = b64(orjson.dumps({**header, "alg": "HS256"}))
        mac = hmac.new(secret, f"{head}.{p}".encode(), hashlib.sha256).digest()
        return f"{head}.{p}.{b64(mac)}"

    flipped = s[:10] + ("A" if s[10] != "A" else "B") + s[11:]
    return {
        "payload changed": f"{h}.{b64(orjson.dumps({**claims, 'sub': new_id('user')}))}.{s}",
        "project changed": f"{h}.{b64(orjson.dumps({**claims, 'pid': new_id('proj')}))}.{s}",
        "signature changed": f"{h}.{p}.{flipped}",
        "signature removed": f"{h}.{p}.",
        "alg none": f"{b64(orjson.dumps({**header, 'alg': 'none'}))}.{p}.",
        "alg HS256 keyed with the public key": signed_hs256(unb64(public_jwk.get("x") or public_jwk["n"])),
        "alg HS256 keyed with the JWK": signed_hs256(orjson.dumps(public_jwk)),
        "unknown kid": f"{b64(orjson.dumps({**header, 'kid': new_id('kid')}))}.{p}.{s}",
        "not a JWT": "not-a-jwt",
    }


@pytest.mark.parametrize("alg", ["EdDSA", "RS256"])
async def test_tampered_tokens_fail_both_verifiers(project: Project, served: Served, alg: str) -> None:
    assert (await served.as_project(project).post("/v1/signing-keys/rotate", {"alg": alg})).status == 201
    token, _ = await issue(served.tokens, project.id)
    keys = await key_set(served.api, project.id)
    jose_verify(token, keys, served.issuer)  # the genuine token passes
    await served.tokens.verify(token)
    [public] = [k for k in (await jwks(served.api, project.id)).body["keys"]
                if k["kid"] == orjson.loads(unb64(token.split(".")[0]))["kid"]]
    for name, forged in _forgeries(token, public).items():
        with pytest.raises((JWException, ValueError)):
            jose_verify(forged, keys, served.issuer)
            pytest.fail(f"jwcrypto accepted: {name}")
        with pytest.raises(NoSession) as caught:
            await served.tokens.verify(forged)
        assert caught.value.details == {"reason": "token_invalid"}, name


async def test_expired_and_foreign_tokens(project: Project, served: Served,
                                          settings_factory: Callable[..., Settings]) -> None:
    ttl = served.settings.access_token_ttl_seconds
    old = await served.tokens.issue(project_id=project.id, user_id=new_id("user"),
                                    session_id=new_id("sess"), org_id=None, role=None,
                                    iat=int(time.time()) - ttl - 60)
    with pytest.raises(NoSession) as caught:
        await served.tokens.verify(old)
    assert caught.value.details == {"reason": "token_expired"}
    # Within the 30 s leeway it still verifies.
    recent = await served.tokens.issue(project_id=project.id, user_id=new_id("user"),
                                       session_id=new_id("sess"), org_id=None, role=None,
                                       iat=int(time.time()) - ttl - 5)
    assert (await served.tokens.verify(recent)).sub
    # A token from the future (beyond the leeway) is not valid yet.
    future = await served.tokens.issue(project_id=project.id, user_id=new_id("user"),
                                       session_id=new_id("sess"), org_id=None, role=None,
                                       iat=int(time.time()) + 600)
    with pytest.raises(NoSession) as caught:
        await served.tokens.verify(future)
    assert caught.value.details == {"reason": "token_invalid"}
    # A deployment with another base URL (issuer) does not accept this one's tokens.
    token, _ = await issue(served.tokens, project.id)
    elsewhere = Tokens.cold(served.app[PG_POOL], served.app[KMS],
                             settings_factory(base_url="https://id.example.test"))
    with pytest.raises(NoSession) as caught:
        await elsewhere.verify(token)
    assert caught.value.details == {"reason": "token_invalid"}


async def test_concurrent_first_use_makes_one_key(project: Project, served: Served, served_b: Served,
                                                  db: asyncpg.Pool) -> None:
    results = await asyncio.gather(
        *[issue(s.tokens, project.id) for s in (served, served_b) for _ in range(10)],
        *[jwks(s.api, project.id) for s in (served, served_b) for _ in range(3)],
    )
    tokens = [r[0] for r in results if isinstance(r, tuple)]
    kids = {orjson.loads(unb64(t.split(".")[0]))["kid"] for t in tokens}
    [row] = await db.fetch("SELECT kid, status FROM signing_keys WHERE project_id = $1", project.id)
    assert kids == {row["kid"]} and row["status"] == "active"
    assert all(r.body["keys"][0]["kid"] == row["kid"] for r in results if isinstance(r, Response))
    assert len(await audit_rows(db, project.id, "signing_key.created")) == 1


# --- rotation --------------------------------------------------------------------------------------


async def test_rotated_out_key_still_verifies_in_its_overlap(project: Project, served: Served,
                                                             db: asyncpg.Pool) -> None:
    api = served.as_project(project)
    before, args = await issue(served.tokens, project.id)
    [old] = await listed(api)
    r = await api.post("/v1/signing-keys/rotate", {})
    assert r.status == 201, r.body
    new = r.body
    assert new["kid"] != old["kid"] and new["status"] == "active" and new["alg"] == "EdDSA"
    keys = {k["kid"]: k for k in await listed(api)}
    retired = keys[old["kid"]]
    assert retired["status"] == "retired"
    retired_at, until = (await db.fetchrow(
        "SELECT retired_at, publish_until FROM signing_keys WHERE kid = $1", old["kid"]))
    assert until - retired_at == timedelta(seconds=served.settings.access_token_ttl_seconds + 300)
    # The old key is still in the JWKS, so a token it signed verifies (both verifiers).
    published = [k["kid"] for k in (await jwks(served.api, project.id)).body["keys"]]
    assert published == [new["kid"], old["kid"]]  # the active key first
    _, claims = jose_verify(before, await key_set(served.api, project.id), served.issuer)
    assert claims["sub"] == args["user_id"]
    assert (await served.tokens.verify(before)).kid == old["kid"]
    # New tokens use the new key.
    after, _ = await issue(served.tokens, project.id)
    assert orjson.loads(unb64(after.split(".")[0]))["kid"] == new["kid"]
    [event] = await audit_rows(db, project.id, "signing_key.rotated")
    assert event["metadata"] | {"description": None} == {
        "old_kid": old["kid"], "old_alg": "EdDSA", "new_kid": new["kid"], "alg": "EdDSA",
        "reason": "manual", "description": None}
    assert event["actor_id"] == project.key_id
    # Once past publish_until the retired key is deleted and leaves the JWKS.
    assert await signing_key_rows.delete_expired(served.app[PG_POOL], project_id=project.id) == []
    assert await signing_key_rows.delete_expired(
        served.app[PG_POOL], project_id=project.id, now=until + timedelta(seconds=1)) == [old["kid"]]
    assert [k["kid"] for k in (await jwks(served.api, project.id)).body["keys"]] == [new["kid"]]
    assert [k["kid"] for k in await listed(api)] == [new["kid"]]


async def test_rotate_validation_and_alg(project: Project) -> None:
    for body in ({"alg": "HS256"}, {"alg": None, "x": 1}, {"kid": "kid_x"}, {"alg": 256}):
        assert_error(await project.api.post("/v1/signing-keys/rotate", body), 400, "invalid_request")
    r = await project.api.post("/v1/signing-keys/rotate", {"alg": "RS256"})
    assert r.status == 201 and r.body["alg"] == "RS256"
    # The project keeps the algorithm for later rotations.
    assert (await project.api.get("/v1/projects/me")).body["signing_alg"] == "RS256"
    assert (await project.api.post("/v1/signing-keys/rotate", {})).body["alg"] == "RS256"
    statuses = sorted(k["status"] for k in await listed(project.api))
    assert statuses == ["active", "retired"]


async def test_key_endpoints_need_keys_write(project: Project) -> None:
    key = await project.api.post("/v1/api-keys", {"prefix": "sk_test_", "name": "narrow",
                                                  "scopes": ["users:read", "users:write"]})
    assert key.status == 201
    narrow = project.api.with_key(key.body["secret"])
    for r in (await narrow.get("/v1/signing-keys"),
              await narrow.post("/v1/signing-keys/rotate", {}),
              await patch_project(narrow, {"signing_alg": "RS256"})):
        assert_error(r, 403, "insufficient_scope")
        assert r.body["error"]["details"]["required_scopes"] == ["keys:write"]
    assert (await narrow.get("/v1/projects/me")).status == 200
    assert_error(await project.api.get("/v1/signing-keys", key=None), 401, "missing_api_key")
    writer = await project.api.post("/v1/api-keys", {"prefix": "sk_test_", "name": "keys",
                                                     "scopes": ["keys:write"]})
    assert (await project.api.with_key(writer.body["secret"]).get("/v1/signing-keys")).status == 200


async def test_listing_is_paginated(project: Project) -> None:
    for _ in range(3):
        assert (await project.api.post("/v1/signing-keys/rotate", {})).status == 201
    page = await project.api.get("/v1/signing-keys?limit=2")
    assert page.body["has_more"] is True and len(page.body["data"]) == 2
    rest = await project.api.get(f"/v1/signing-keys?limit=2&cursor={page.body['next_cursor']}")
    assert rest.body["has_more"] is False and len(rest.body["data"]) == 1
    kids = [k["kid"] for k in page.body["data"] + rest.body["data"]]
    assert kids == sorted(kids) and len(set(kids)) == 3
    assert_error(await project.api.get("/v1/signing-keys?cursor=forged.AAAAAAAAAAAAAAAAAAAAAA"),
                 400, "invalid_request")


# --- the rotation worker ---------------------------------------------------------------------------
# The worker rotates every project of its database, so these tests run on a database of their own
# (the other tests' projects keep their keys, and the passes stay short).


@pytest.fixture(scope="module")
def worker_database_url(database_url: str) -> Iterator[str]:
    with migrated_database(database_url, "rotation") as url:
        yield url


@pytest.fixture
def tiny_rotation(settings_factory: Callable[..., Settings], worker_database_url: str) -> Callable[..., Settings]:
    def make(*, rotation_s: float, prepublish_s: float) -> Settings:
        return settings_factory(database_url=worker_database_url,
                                signing_key_rotation_days=rotation_s / 86_400,
                                signing_key_prepublish_seconds=prepublish_s,
                                signing_key_check_seconds=0.1)
    return make


async def test_worker_prepublishes_then_rotates(tiny_rotation: Callable[..., Settings],
                                                http: ClientSession) -> None:
    settings = tiny_rotation(rotation_s=3.0, prepublish_s=1.5)
    app = combined_app(settings)
    async with serving(http, app) as api:
        project = await bootstrap_project(api)
        db = app[PG_POOL]
        app_api = api.with_key(project.key)
        token, _ = await issue(app[TOKENS], project.id)
        first = (await jwks(api, project.id)).body["keys"][0]["kid"]

        async def pending() -> list[dict[str, Any]]:
            keys = await listed(app_api)
            return [k for k in keys if k["status"] == "pending"]

        [queued] = await eventually(pending, what="a pending key")
        # Pending: published in the JWKS, not yet signing; the old key is still the active one.
        published = [k["kid"] for k in (await jwks(api, project.id)).body["keys"]]
        assert published[0] == first and queued["kid"] in published
        statuses = {k["kid"]: k["status"] for k in await listed(app_api)}
        assert statuses[first] == "active"

        async def rotated() -> dict[str, str]:
            keys = {k["kid"]: k["status"] for k in await listed(app_api)}
            return keys if keys.get(queued["kid"]) == "active" else {}

        statuses = await eventually(rotated, what="the pending key to become active")
        assert statuses[first] == "retired"
        events = await audit_rows(db, project.id, "signing_key.rotated")
        assert events[0]["metadata"]["old_kid"] == first
        assert events[0]["metadata"]["new_kid"] == queued["kid"]
        assert events[0]["metadata"]["reason"] == "scheduled" and events[0]["actor_type"] == "system"
        row = await db.fetchrow("SELECT activated_at, created_at FROM signing_keys WHERE kid = $1",
                                queued["kid"])
        assert row["activated_at"] - row["created_at"] >= timedelta(seconds=1.5)  # published ahead
        # The token the old key signed still verifies against the JWKS in its overlap window.
        published = await key_set(api, project.id)
        assert published.get_key(first) is not None
        jose_verify(token, published, settings.public_base_url)
        # Retired keys are deleted once publish_until has passed (the pass's deletion step; the
        # overlap is at least 6 minutes, so the clock is moved rather than waited for).
        until = await db.fetchval("SELECT publish_until FROM signing_keys WHERE kid = $1", first)
        assert first not in await signing_key_rows.delete_expired(db, project_id=project.id)
        deleted = await signing_key_rows.delete_expired(db, project_id=project.id,
                                                         now=until + timedelta(seconds=1))
        assert deleted == [first]
        assert first not in [k["kid"] for k in (await jwks(api, project.id)).body["keys"]]


async def test_two_workers_rotate_once(tiny_rotation: Callable[..., Settings],
                                       http: ClientSession, worker_database_url: str) -> None:
    settings = tiny_rotation(rotation_s=1.0, prepublish_s=0.3)
    app_a, app_b = combined_app(settings), combined_app(settings)
    async with serving(http, app_a) as api_a, serving(http, app_b) as api_b:
        project = await bootstrap_project(api_a)
        first = (await jwks(api_b, project.id)).body["keys"][0]["kid"]
        db = app_a[PG_POOL]

        async def three_rotations() -> list[dict[str, Any]]:
            events = await audit_rows(db, project.id, "signing_key.rotated")
            return events if len(events) >= 3 else []

        await eventually(three_rotations, what="three scheduled rotations")
    db = await asyncpg.connect(worker_database_url)
    try:
        events = [e["metadata"] for e in await audit_rows(db, project.id, "signing_key.rotated")]
        rows = await db.fetch("SELECT kid, status FROM signing_keys WHERE project_id = $1", project.id)
    finally:
        await db.close()
    # One chain: each rotation retires the key the previous one activated, never twice.
    assert events[0]["old_kid"] == first
    for prev, nxt in itertools.pairwise(events):
        assert nxt["old_kid"] == prev["new_kid"], events
    olds = [e["old_kid"] for e in events]
    assert len(set(olds)) == len(olds), events
    by_status: dict[str, list[str]] = {}
    for r in rows:
        by_status.setdefault(r["status"], []).append(r["kid"])
    assert by_status["active"] == [events[-1]["new_kid"]]
    assert sorted(by_status["retired"]) == sorted(olds)
    assert len(by_status.get("pending", [])) <= 1
