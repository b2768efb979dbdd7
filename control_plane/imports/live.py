"""Reading a Descope project through its management API, for the multi-tenant importer's live
mode (SPEC.md 4 rule 6; the API as FORMATS.md section 6 records it from
``descope/go-sdk``: ``Authorization: Bearer <ProjectId>:<ManagementKey>``, ``GET
/v1/mgmt/tenant/all`` answering ``{"tenants": [...]}``, ``POST /v2/mgmt/user/search`` taking
``{"limit", "page"}`` and answering ``{"users": [...], "total"}``).

:func:`export` yields the export document ``{"tenants": [...], "users": [...], "total": n}`` in
chunks of bytes, the users page by page (:data:`PAGE` each), so neither side holds a large
project in memory. The tenants are read before the first chunk: a refused token or an
unreachable origin raises :class:`OriginError` before anything is answered.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Final

import aiohttp
import orjson

PAGE: Final = 500
"""Users per search page (Descope's search takes up to its own limit; 500 keeps pages small)."""
TIMEOUT: Final = aiohttp.ClientTimeout(total=60, connect=10)


class OriginError(Exception):
    """The origin refused the token (``refused``) or could not be read."""

    def __init__(self, message: str, *, refused: bool) -> None:
        super().__init__(message)
        self.refused = refused


async def _call(http: aiohttp.ClientSession, method: str, url: str, headers: dict[str, str],
                body: Any = None) -> Any:
    try:
        async with http.request(method, url, headers=headers,
                                data=None if body is None else orjson.dumps(body)) as r:
            raw = await r.read()
    except (aiohttp.ClientError, TimeoutError) as err:
        raise OriginError(f"the origin could not be reached ({type(err).__name__})",
                          refused=False) from None
    if r.status in (401, 403):
        raise OriginError(f"the origin refused the token ({r.status})", refused=True)
    if r.status != 200:
        raise OriginError(f"the origin answered {r.status} to {method} {url}", refused=False)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise OriginError(f"the origin's answer to {method} {url} is not JSON",
                          refused=False) from None


async def export(api_url: str, source_project_id: str, token: str) -> AsyncGenerator[bytes]:
    """The export document of the project (module docstring). Raises OriginError."""
    headers = {"Authorization": f"Bearer {source_project_id}:{token}",
               "Content-Type": "application/json", "Accept": "application/json"}
    base = api_url.rstrip("/")
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        tenants = await _call(http, "GET", f"{base}/v1/mgmt/tenant/all", headers)
        if not isinstance(tenants, dict) or not isinstance(tenants.get("tenants"), list):
            raise OriginError("the origin's tenants are not {\"tenants\": [...]}", refused=False)
        yield b'{"tenants":' + orjson.dumps(tenants["tenants"]) + b',"users":['
        page, sent, total = 0, 0, None
        while total is None or sent < total:
            found = await _call(http, "POST", f"{base}/v2/mgmt/user/search", headers,
                                {"limit": PAGE, "page": page})
            users = found.get("users") if isinstance(found, dict) else None
            if not isinstance(users, list):
                raise OriginError("the origin's users are not {\"users\": [...]}", refused=False)
            if isinstance(found.get("total"), int):
                total = found["total"]
            if not users:
                break
            for user in users:
                yield (b"," if sent else b"") + orjson.dumps(user)
                sent += 1
            page += 1
        yield b'],"total":' + str(sent).encode() + b"}"
