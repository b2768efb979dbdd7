"""The OAuth peers of the tests: a real OpenID Connect provider, and small stand-ins for the two
providers that have no offline peer.

* :func:`oidc_provider`: the npm package ``oidc-provider`` (panva's certified OpenID Provider,
  version and why in :data:`OIDC_PROVIDER_VERSION`), installed by the tests from
  ``oidc_peer/package-lock.json`` into ``.run/peers/oidc-provider`` (gitignored) with Debian's
  ``nodejs`` and ``npm`` installed first when missing (``tests.fixtures.installs``, as the
  browser tests install Chromium), and started (``oidc_peer/server.mjs``) on a free port with a
  config this module writes: one confidential client (``client_secret_basic``) with the test
  service's callback URLs, PKCE required, the claims ``email``/``email_verified``/``name`` in
  the ID token, and a non-interactive login: the test
  registers an account (``POST /_accounts``) and opens ``/interaction/{uid}?account=<id>``, which
  logs that account in and grants the requested scopes (``interactionFinished``).
* :class:`TokenProxy`: an aiohttp reverse proxy in front of the provider, whose URL is the
  provider's issuer (so discovery, JWKS and the token endpoint are all reached through it). The
  test sets ``mode`` to rewrite the ID token of the next token responses: ``tamper`` changes a
  claim without signing again (a bad signature), ``nonce`` and ``aud`` sign again with the
  provider's own key (the test generated it) and a wrong ``nonce`` or audience, so only that
  claim is wrong.
* :class:`GitHubStandIn` and :class:`MicrosoftStandIn`: see their docstrings.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import jwt
from aiohttp import ClientSession, web
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from devtools import DevServicesError
from tests.fixtures.installs import debian_packages, npm_packages
from tests.fixtures.service import free_ports

ROOT = Path(__file__).resolve().parents[2]
PEER_SOURCE = Path(__file__).resolve().parent / "oidc_peer"
PEER_DIR = ROOT / ".run" / "peers" / "oidc-provider"
OIDC_PROVIDER_VERSION = json.loads((PEER_SOURCE / "package.json").read_text())["dependencies"]["oidc-provider"]
"""Why 8.8.1, the last release of the 8.x line: it supports Node.js 18 LTS and every later LTS
(its own start-up check asks for "v18.x LTS, or a later LTS release"), and Debian 12, the
README's platform, installs Node.js 18.20. The 9.x line needs ``URL.parse`` (Node.js 20.18 or
22) and fails at start on Debian's Node. One release for every Node the tests meet (18, 20, 22
and 24 were tried) keeps the peer the same everywhere; ``package-lock.json`` beside it pins
every package it pulls in, each of which declares Node.js 18 or older as enough."""
MIN_NODE_MAJOR = 18
CLIENT_ID = "authio-test"
CLIENT_SECRET = "test-secret-" + "x" * 32


def ensure_node() -> str:
    """The path of ``node``, with Debian's ``nodejs`` and ``npm`` installed when either is
    missing. Raises :class:`devtools.DevServicesError` when they cannot be installed, or when
    the Node.js found is older than :data:`MIN_NODE_MAJOR`."""
    debian_packages(["nodejs", "npm"], present=lambda: bool(shutil.which("node") and shutil.which("npm")),
                    needed_by="the OAuth tests")
    node = str(shutil.which("node"))
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=False,
                             timeout=30).stdout.strip()
    major = version.removeprefix("v").split(".")[0]
    if not major.isdigit() or int(major) < MIN_NODE_MAJOR:
        raise DevServicesError(
            f"the OAuth tests run oidc-provider {OIDC_PROVIDER_VERSION}, which needs Node.js "
            f"{MIN_NODE_MAJOR} or later; {node} is {version or 'of no known version'}: install "
            f"a newer nodejs (Debian 12's is 18)")
    return node


def ensure_oidc_provider() -> Path:
    """:data:`PEER_DIR` with ``oidc_peer/``'s ``server.mjs`` and the packages of its
    ``package-lock.json`` installed (``npm ci``, again only when the lock file changes)."""
    ensure_node()
    npm_packages(PEER_SOURCE, PEER_DIR, needed_by="the OAuth tests", what=f"oidc-provider {OIDC_PROVIDER_VERSION}")
    shutil.copyfile(PEER_SOURCE / "server.mjs", PEER_DIR / "server.mjs")
    return PEER_DIR


def rsa_key(kid: str) -> tuple[rsa.RSAPrivateKey, dict[str, Any]]:
    """A new RSA signing key and its private JWK (``kid``, RS256)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(RSAAlgorithm.to_jwk(key))
    jwk.update(kid=kid, alg="RS256", use="sig")
    return key, jwk


def public_jwk(jwk: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in jwk.items() if k in ("kty", "n", "e", "kid", "alg", "use")}


def s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


# --- the proxy -----------------------------------------------------------------------------------


class TokenProxy:
    """A reverse proxy to the provider at ``upstream``; ``mode`` rewrites the ID token of token
    responses (``None``, ``tamper``, ``nonce``, ``aud``), signing with ``key`` (``kid``)."""

    def __init__(self, upstream: str, key: rsa.RSAPrivateKey, kid: str) -> None:
        self.upstream, self.key, self.kid = upstream, key, kid
        self.mode: str | None = None
        self.token_requests: list[dict[str, str]] = []
        self._client: ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.forward)
        return app

    async def forward(self, request: web.Request) -> web.Response:
        if self._client is None:
            self._client = ClientSession(auto_decompress=True)
        body = await request.read()
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in ("content-length", "accept-encoding")}
        # Host stays the proxy's: oidc-provider builds its endpoints' URLs from it.
        async with self._client.request(request.method, self.upstream + request.path_qs,
                                        data=body or None, headers=headers,
                                        allow_redirects=False) as r:
            raw = await r.read()
            out = [(k, v) for k, v in r.headers.items()
                   if k.lower() not in ("content-length", "transfer-encoding", "content-encoding")]
            status = r.status
        if request.path == "/token" and status == 200:
            self.token_requests.append(dict(parse_qsl(body.decode())))
            if self.mode is not None:
                raw = self._rewrite(raw)
        response = web.Response(status=status, body=raw)
        for k, v in out:
            response.headers.add(k, v)
        return response

    def _rewrite(self, raw: bytes) -> bytes:
        answer = json.loads(raw)
        token = answer["id_token"]
        claims = jwt.decode(token, options={"verify_signature": False})
        if self.mode == "tamper":
            head, payload, sig = token.split(".")
            claims["email"] = "attacker@example.com"
            payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
            answer["id_token"] = f"{head}.{payload}.{sig}"
        else:
            claims[{"nonce": "nonce", "aud": "aud"}[str(self.mode)]] = "wrong-" + secrets.token_hex(4)
            answer["id_token"] = jwt.encode(claims, self.key, algorithm="RS256",
                                            headers={"kid": self.kid})
        return json.dumps(answer).encode()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()


async def _serve(app: web.Application, port: int = 0) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{bound}"


@dataclass
class OidcPeer:
    """The running provider: ``issuer`` (the proxy's URL), the ``proxy``, ``http`` to register
    accounts, and the node process's ``pid``."""

    issuer: str
    proxy: TokenProxy
    http: ClientSession
    pid: int

    async def account(self, *, email: str | None, email_verified: bool = True,
                      name: str | None = None) -> str:
        """A new account (its ``sub``) with these claims (no ``email`` at all when None)."""
        sub = "acct-" + secrets.token_hex(6)
        claims: dict[str, Any] = {}
        if email is not None:
            claims.update(email=email, email_verified=email_verified)
        if name is not None:
            claims["name"] = name
        async with self.http.post(f"{self.issuer}/_accounts",
                                  json={"id": sub, "claims": claims}) as r:
            assert r.status == 204, await r.text()
        return sub


@contextlib.asynccontextmanager
async def oidc_provider(callback_urls: list[str], *, direct: bool = False) -> AsyncIterator[OidcPeer]:
    """``oidc-provider`` running behind a :class:`TokenProxy`, with one client
    (``CLIENT_ID``/``CLIENT_SECRET``) allowed ``callback_urls``. ``direct``: the issuer is the
    provider itself (the proxy still runs, unused), as the bench measures it."""
    folder = await asyncio.to_thread(ensure_oidc_provider)
    key, jwk = rsa_key("peer-key-1")
    proxy_port, peer_port = free_ports(2)
    issuer = f"http://127.0.0.1:{peer_port if direct else proxy_port}"
    config = {
        "issuer": issuer, "port": peer_port, "cookieKey": secrets.token_hex(16),
        "jwks": {"keys": [jwk]},
        "clients": [{"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
                     "redirect_uris": callback_urls, "grant_types": ["authorization_code"],
                     "response_types": ["code"],
                     "token_endpoint_auth_method": "client_secret_basic"}],
    }
    proc = await asyncio.create_subprocess_exec(
        "node", "server.mjs", cwd=folder, env={**os.environ, "PEER_CONFIG": json.dumps(config),
                                                "NODE_ENV": "test"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    proxy = TokenProxy(f"http://127.0.0.1:{peer_port}", key, jwk["kid"])
    runner, _ = await _serve(proxy.app(), proxy_port)
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        deadline = time.monotonic() + 60
        while True:
            line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
            seen.append(line)
            if line.strip() == "ready":
                break
            if not line or time.monotonic() > deadline:
                raise RuntimeError("oidc-provider did not start:\n" + "".join(seen))
        drain = asyncio.create_task(_drain(proc.stdout))
        async with ClientSession() as http:
            yield OidcPeer(issuer, proxy, http, proc.pid)
        drain.cancel()
    finally:
        await proxy.close()
        await runner.cleanup()
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


# --- stand-ins ------------------------------------------------------------------------------------


@dataclass
class _Grant:
    redirect_uri: str
    challenge: str
    nonce: str | None
    user: dict[str, Any]


@dataclass
class GitHubStandIn:
    """GitHub's OAuth endpoints and the two REST calls the service makes (``/user``,
    ``/user/emails``), in aiohttp. GitHub has no offline peer (it is not an OpenID Connect
    provider and issues no ID token); this checks what GitHub checks of the flow: the client's
    credentials, the single-use code, its redirect URI and the PKCE S256 verifier.
    ``next_user`` is who signs in next: ``{"id", "login", "emails": [{email, primary,
    verified}]}``."""

    client_id: str = "gh-client"
    client_secret: str = "gh-secret-" + "y" * 20
    next_user: dict[str, Any] = field(default_factory=dict)
    base_url: str = ""
    _grants: dict[str, _Grant] = field(default_factory=dict)
    _tokens: dict[str, dict[str, Any]] = field(default_factory=dict)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/login/oauth/authorize", self.authorize)
        app.router.add_post("/login/oauth/access_token", self.token)
        app.router.add_get("/api/user", self.user)
        app.router.add_get("/api/user/emails", self.emails)
        return app

    async def authorize(self, request: web.Request) -> web.Response:
        q = request.query
        assert q["client_id"] == self.client_id and q["code_challenge_method"] == "S256"
        code = secrets.token_hex(10)
        self._grants[code] = _Grant(q["redirect_uri"], q["code_challenge"], None,
                                    dict(self.next_user))
        raise web.HTTPFound(f"{q['redirect_uri']}?code={code}&state={q['state']}")

    async def token(self, request: web.Request) -> web.Response:
        form = await request.post()
        grant = self._grants.pop(str(form.get("code")), None)
        if (form.get("client_id") != self.client_id or form.get("client_secret") != self.client_secret
                or grant is None or form.get("redirect_uri") != grant.redirect_uri
                or s256(str(form.get("code_verifier"))) != grant.challenge):
            return web.json_response({"error": "bad_verification_code"})  # GitHub answers 200
        token = "gho_" + secrets.token_hex(16)
        self._tokens[token] = grant.user
        return web.json_response({"access_token": token, "token_type": "bearer",
                                  "scope": "read:user,user:email"})

    def _who(self, request: web.Request) -> dict[str, Any]:
        user = self._tokens.get(request.headers.get("Authorization", "").removeprefix("Bearer "))
        if user is None:
            raise web.HTTPUnauthorized()
        return user

    async def user(self, request: web.Request) -> web.Response:
        u = self._who(request)
        return web.json_response({"id": u["id"], "login": u["login"], "name": None, "email": None})

    async def emails(self, request: web.Request) -> web.Response:
        return web.json_response(self._who(request)["emails"])


@dataclass
class MicrosoftStandIn:
    """Microsoft identity platform's multi-tenant shape, in aiohttp: a discovery document whose
    ``issuer`` is ``{base}/{tenantid}/v2.0``, an authorization endpoint, a token endpoint
    answering an ID token signed by a local RSA key, and the JWKS. Microsoft has no offline peer;
    what matters here is the tenant template: the token's ``iss`` names the tenant of its
    ``tid`` (or, with ``wrong_tenant``, another one, which must be refused)."""

    client_id: str = "ms-client"
    client_secret: str = "ms-secret-" + "z" * 20
    tenant: str = "9188040d-6c67-4c5b-b112-36a304b66dad"
    next_user: dict[str, Any] = field(default_factory=dict)
    wrong_tenant: bool = False
    base_url: str = ""
    _grants: dict[str, _Grant] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.key, self.jwk = rsa_key("ms-key-1")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/common/v2.0/.well-known/openid-configuration", self.discovery)
        app.router.add_get("/common/oauth2/v2.0/authorize", self.authorize)
        app.router.add_post("/common/oauth2/v2.0/token", self.token)
        app.router.add_get("/common/discovery/v2.0/keys", self.keys)
        return app

    async def discovery(self, request: web.Request) -> web.Response:
        b = self.base_url
        return web.json_response({
            "issuer": f"{b}/{{tenantid}}/v2.0",
            "authorization_endpoint": f"{b}/common/oauth2/v2.0/authorize",
            "token_endpoint": f"{b}/common/oauth2/v2.0/token",
            "jwks_uri": f"{b}/common/discovery/v2.0/keys",
            "id_token_signing_alg_values_supported": ["RS256"],
            "token_endpoint_auth_methods_supported": ["client_secret_post", "private_key_jwt",
                                                      "client_secret_basic"],
        })

    async def keys(self, request: web.Request) -> web.Response:
        return web.json_response({"keys": [public_jwk(self.jwk)]})

    async def authorize(self, request: web.Request) -> web.Response:
        q = request.query
        assert q["client_id"] == self.client_id and q["code_challenge_method"] == "S256"
        code = secrets.token_hex(10)
        self._grants[code] = _Grant(q["redirect_uri"], q["code_challenge"], q["nonce"],
                                    dict(self.next_user))
        raise web.HTTPFound(f"{q['redirect_uri']}?code={code}&state={q['state']}")

    async def token(self, request: web.Request) -> web.Response:
        form = await request.post()
        basic = request.headers.get("Authorization", "")
        creds = (base64.b64decode(basic.removeprefix("Basic ")).decode().split(":", 1)
                 if basic.startswith("Basic ") else [form.get("client_id"), form.get("client_secret")])
        grant = self._grants.pop(str(form.get("code")), None)
        if (creds != [self.client_id, self.client_secret] or grant is None
                or form.get("redirect_uri") != grant.redirect_uri
                or s256(str(form.get("code_verifier"))) != grant.challenge):
            return web.json_response({"error": "invalid_grant"}, status=400)
        now = int(time.time())
        tenant = "00000000-0000-0000-0000-000000000001" if self.wrong_tenant else self.tenant
        claims = {"iss": f"{self.base_url}/{tenant}/v2.0", "tid": self.tenant,
                  "aud": self.client_id, "iat": now, "nbf": now, "exp": now + 3600,
                  "nonce": grant.nonce, **grant.user}
        id_token = jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": "ms-key-1"})
        return web.json_response({"access_token": "ms-at", "token_type": "Bearer",
                                  "expires_in": 3600, "id_token": id_token})


@contextlib.asynccontextmanager
async def stand_in(peer: GitHubStandIn | MicrosoftStandIn) -> AsyncIterator[str]:
    """Serve ``peer`` on a free loopback port; yields (and sets) its base URL."""
    runner, url = await _serve(peer.app())
    peer.base_url = url
    try:
        yield url
    finally:
        await runner.cleanup()
