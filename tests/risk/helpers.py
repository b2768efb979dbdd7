"""Helpers of the risk tests: a service that believes ``X-Forwarded-For`` from loopback (so a
test signs in "from" any address), with the test GeoIP database (tests/fixtures/geo.py) and a
known-bad network; sign-ins by magic link from an address and a device; the step-up calls."""

from __future__ import annotations

from typing import Any, Final

from tests.fixtures.identity import latest_link, send_link, token_of, verify
from tests.fixtures.peers import mailbox_messages
from tests.fixtures.service import Api, Project, Response

BLOCKED_NETWORK: Final = "203.0.113.0/24"
"""TEST-NET-3 (RFC 5737): the known-bad network of the risk service."""
CHROME_MAC: Final = ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 "
                     "(KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36")
FIREFOX_WINDOWS: Final = ("Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:133.0) Gecko/20100101 "
                          "Firefox/133.0")
SAFARI_IPHONE: Final = ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15"
                        " (KHTML, like Gecko) Version/17.1 Mobile/15E148 Safari/604.1")
RISK_SETTINGS: Final[dict[str, Any]] = {
    "trusted_proxies": "127.0.0.1/32,::1/128",
    "risk_blocked_networks": BLOCKED_NETWORK,
    "risk_ip_attempts": 5,
    "risk_destination_attempts": 4,
}
"""The risk service's settings (with ``geoip_database``): small velocity limits, so a test
reaches them in a few sign-ins."""


def client(ip: str | None, user_agent: str = CHROME_MAC) -> dict[str, str]:
    """The headers of a browser at ``ip`` (through the trusted proxy) with ``user_agent``."""
    headers = {"User-Agent": user_agent}
    if ip is not None:
        headers["X-Forwarded-For"] = ip
    return headers


async def attempt(project: Project, destination: str, *, ip: str | None,
                  user_agent: str = CHROME_MAC, api: Api | None = None) -> Response:
    """A magic-link sign-in of ``destination`` from ``ip``: the link is sent, read from the
    development mailbox and redeemed from that address and device. The redemption's answer,
    whatever it is."""
    api = api or project.api
    before = len(await mailbox_messages(project.api, destination, count=0))
    sent = await send_link(api, project, destination)
    assert sent.status == 200, sent.body
    link = await latest_link(project, destination, count=before + 1)
    return await verify(api, project, token_of(link), headers=client(ip, user_agent))


async def set_policy(project: Project, *, challenge: int = 50, block: int = 90,
                     **weights: int) -> dict[str, Any]:
    """PUT the project's policy; ``weights`` sets signals' weights by name (0 disables none)."""
    body = {"threshold_challenge": challenge, "threshold_block": block,
            "signals": {name: {"enabled": True, "weight": w} for name, w in weights.items()}}
    r = await project.api.request("PUT", "/v1/risk/policy", json=body)
    assert r.status == 200, r.body
    return dict(r.body)


async def decision(project: Project, decision_id: str) -> dict[str, Any]:
    r = await project.api.get(f"/v1/risk/decisions/{decision_id}")
    assert r.status == 200, r.body
    return dict(r.body)


def fired(d: dict[str, Any]) -> set[str]:
    """The names of the signals that fired in decision ``d``."""
    return {s["name"] for s in d["signals"] if s["fired"]}


def reason(d: dict[str, Any], name: str) -> str:
    """The reason signal ``name`` gave in decision ``d``."""
    return next(str(s["reason"]) for s in d["signals"] if s["name"] == name)


async def step_up_call(project: Project, path: str, body: dict[str, Any],
                       headers: dict[str, str] | None = None) -> Response:
    """``POST /v1/auth/step-up/<path>`` of ``project`` (public: no key)."""
    return await project.api.post(f"/v1/auth/step-up/{path}?project_id={project.id}", body,
                                  key=None, headers=headers)
