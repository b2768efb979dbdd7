"""Sign-ins racing a data-subject deletion (issue 21): refreshes of the user's session and
magic-link sign-ins to its address, sent around the deletion (rounds with the deletion sent 0 to
60 ms after them), end either before it (and are deleted or anonymized with the rest) or refused
after it, never with a row left that names the user, and never with a server error."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import asyncpg

from tests.compliance.helpers import naming
from tests.fixtures.identity import email, latest_link, send_link, sign_in, token_of, verify
from tests.fixtures.service import Project, Response


async def _after(delay: float, call: Awaitable[Response]) -> Response:
    await asyncio.sleep(delay)
    return await call


async def test_sign_ins_racing_a_deletion_leave_no_orphan(cproject: Project,
                                                           cdb: asyncpg.Pool) -> None:
    outcomes: list[tuple[int, str | None]] = []
    for delay in (0.0, 0.005, 0.015, 0.03, 0.06):
        address = email()
        signed = await sign_in(cproject, address)
        links = []
        for n in range(3):  # unused links to the address, redeemed around the deletion
            assert (await send_link(cproject.api, cproject, address)).status == 200
            links.append(token_of(await latest_link(cproject, address, count=n + 2)))
        made = await cproject.api.post("/v1/compliance/dsr", {"request_type": "deletion",
                                                              "user_email": address})

        refreshes = [cproject.api.post("/v1/sessions/refresh",
                                       {"refresh_token": signed.refresh_token}, key=None)
                     for _ in range(3)]
        redeemed = [verify(cproject.api, cproject, t) for t in links]
        fulfil = f"/v1/compliance/dsr/{made.body['dsr_id']}/fulfill"
        done, *others = await asyncio.gather(_after(delay, cproject.api.post(fulfil, {})),
                                             *refreshes, *redeemed)
        assert done.status == 200 and done.body["dsr"]["status"] == "fulfilled", done.body
        outcomes += [(r.status, (r.body.get("error") or {}).get("code")) for r in others]
        assert all(r.status < 500 for r in others), [(r.status, r.body) for r in others]
        # A link redeemed after the deletion may make a new user of the address: another user,
        # another id. Nothing names the deleted one but the request's own record.
        assert await naming(cdb, [signed.user_id]) == ["dsr_requests.user_id"], outcomes
