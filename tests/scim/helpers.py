"""Helpers of the SCIM tests: an organization with its SCIM token, and a client speaking SCIM
to ``/scim/v2`` with it (every answer held to the OpenAPI document, as ``Api`` does)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from tests.fixtures.identity import make_org
from tests.fixtures.service import Api, Project, Response

USER = "urn:ietf:params:scim:schemas:core:2.0:User"
ENTERPRISE = "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"
GROUP = "urn:ietf:params:scim:schemas:core:2.0:Group"
PATCH = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
ERROR = "urn:ietf:params:scim:api:messages:2.0:Error"
LIST = "urn:ietf:params:scim:api:messages:2.0:ListResponse"


@dataclass
class Directory:
    """An organization of ``project`` as its directory sees it: the token and a client."""

    project: Project
    org_id: str
    token: str
    base_url: str
    api: Api

    async def get(self, path: str) -> Response:
        return await self.api.get("/scim/v2" + path)

    async def post(self, path: str, body: Any) -> Response:
        return await self.api.post("/scim/v2" + path, body)

    async def put(self, path: str, body: Any, **kw: Any) -> Response:
        return await self.api.request("PUT", "/scim/v2" + path, json=body, **kw)

    async def patch(self, path: str, *operations: dict[str, Any], **kw: Any) -> Response:
        return await self.api.request("PATCH", "/scim/v2" + path,
                                      json={"schemas": [PATCH], "Operations": list(operations)},
                                      **kw)

    async def delete(self, path: str, **kw: Any) -> Response:
        return await self.api.request("DELETE", "/scim/v2" + path, **kw)


async def mint(project: Project, org_id: str, **body: Any) -> Response:
    return await project.api.post(f"/v1/organizations/{org_id}/scim-token", body)


async def directory(project: Project, **body: Any) -> Directory:
    """A new organization of ``project`` and its SCIM token (``body``: the mint's body)."""
    org = await make_org(project)
    r = await mint(project, org["id"], **body)
    assert r.status == 201, r.body
    return Directory(project, org["id"], r.body["token"], r.body["base_url"],
                     project.api.with_key(r.body["token"]))


def user_body(address: str | None = None, **extra: Any) -> dict[str, Any]:
    """A User as a directory sends it: ``userName`` and a primary work address."""
    address = address or f"scim-{secrets.token_hex(6)}@example.com"
    return {"schemas": [USER], "userName": address, "active": True,
            "emails": [{"value": address, "type": "work", "primary": True}],
            "name": {"givenName": "Barbara", "familyName": "Jensen"}, **extra}


def assert_scim_error(r: Response, status: int, scim_type: str | None = None) -> None:
    """``r`` is RFC 7644's error body with ``status`` (and ``scimType``), as application/scim+json,
    with an ``X-Request-Id``."""
    assert r.status == status, (r.status, r.body)
    assert r.headers["Content-Type"].startswith("application/scim+json"), r.headers
    assert r.headers.get("X-Request-Id"), r.headers
    assert r.body["schemas"] == [ERROR] and r.body["status"] == str(status), r.body
    assert "error" not in r.body and "request_id" not in r.body, r.body
    if scim_type is not None:
        assert r.body.get("scimType") == scim_type, r.body
