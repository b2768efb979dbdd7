"""Risk routes (DESIGN.md "risk"): the project's policy and its decisions (API key), and the
step-up calls a challenged sign-in makes (public, of the project the request names)."""

from __future__ import annotations

import time
from typing import Final

from aiohttp import web

from common.errors import (
    BlockedByRiskPolicy,
    InvalidRequest,
    NotFound,
    RateLimited,
    ServiceUnavailable,
    StepUpRequired,
    UnknownOrExpiredChallenge,
    VerificationFailed,
)
from common.routing import Reply, RouteTable
from control_plane.appkeys import CURSOR_SECRET, KMS, RISK, SEND_LIMITS, TOKENS
from control_plane.passkeys.schemas import RequestOptions
from control_plane.risk import service, step_up
from control_plane.risk.schemas import (
    Decision,
    DecisionsQuery,
    Policy,
    PolicyBody,
    StepUpBody,
    StepUpLinkBody,
    StepUpSent,
    StepUpVerifyBody,
)
from control_plane.sessions import service as sessions
from control_plane.sessions.schemas import Grant
from control_plane.web import auth
from control_plane.web.actor import Call, client_device
from control_plane.web.endpoint import endpoint
from control_plane.web.pagination import Listing, Page
from control_plane.web.public_project import HEADER as PROJECT_HEADER

routes = RouteTable("risk", "The risk engine: each sign-in scored, explained, and allowed, "
                            "challenged (step-up) or blocked by the project's policy.")
POLICY: Final = auth.ApiKey("risk:write")
DECISIONS: Final = auth.ApiKey("risk:write", "audit:read")
_PROJECT_HEADERS: Final = {PROJECT_HEADER: "The project, when the query does not name it."}


@endpoint(routes, "GET", "/v1/risk/policy", auth=POLICY,
          replies=[Reply(200, "The project's policy (the default until one is set).", Policy)])
async def get_risk_policy(call: Call) -> web.Response:
    """Show the project's risk policy: the thresholds and every signal with its weight.

    A project that never set one has the default (``default: true``): challenge at 50, block
    at 90, every signal enabled at its default weight."""
    return call.reply(await service.current_policy(call.pool, call.project_id))


@endpoint(routes, "PUT", "/v1/risk/policy", auth=POLICY, errors=[InvalidRequest],
          replies=[Reply(200, "The policy as stored.", Policy)])
async def put_risk_policy(call: Call, body: PolicyBody) -> web.Response:
    """Set the project's risk policy (records ``risk.policy.updated``).

    Thresholds are 0 to 100, ``threshold_challenge`` lower than ``threshold_block``; a signal
    left out of ``signals`` takes its default, and an unknown one is ``invalid_request``. The
    policy applies at once in this process, within a second in the others."""
    async with call.connection() as conn:
        policy = await service.set_policy(conn, call.actor, body=body)
    call.app[RISK].forget_policy(call.project_id)
    return call.reply(policy)


@endpoint(routes, "GET", "/v1/risk/decisions", auth=DECISIONS, errors=[InvalidRequest],
          replies=[Reply(200, "A page of decisions, newest first.", Page[Decision])])
async def get_risk_decisions(call: Call, query: DecisionsQuery) -> web.Response:
    """List the project's risk decisions, newest first: why each sign-in was allowed,
    challenged or blocked. ``user``, ``decision``, ``from`` and ``to`` filter."""
    listing = Listing(service.LISTING, call.project_id, call.app[CURSOR_SECRET])
    return call.reply(await service.list_decisions(call.pool, listing, query))


@endpoint(routes, "GET", "/v1/risk/decisions/{decision_id}", auth=DECISIONS, errors=[NotFound],
          replies=[Reply(200, "The decision.", Decision)])
async def get_risk_decision(call: Call) -> web.Response:
    """Show one risk decision: every signal with its contribution and reason, and what it saw."""
    return call.reply(await service.find_decision(call.pool, call.project_id,
                                                  call.path("decision_id")))


@endpoint(routes, "POST", "/v1/auth/step-up/passkey/options", auth=auth.Public(),
          headers=_PROJECT_HEADERS, errors=[UnknownOrExpiredChallenge, InvalidRequest],
          replies=[Reply(200, "Request options for navigator.credentials.get.", RequestOptions)])
async def post_step_up_passkey_options(call: Call, body: StepUpBody) -> web.Response:
    """Start a step-up by passkey: request options listing the challenged user's passkeys,
    valid for this challenge only."""
    async with call.connection() as conn:
        options = await step_up.passkey_options(conn, call.actor, challenge_id=body.challenge_id,
                                                settings=call.settings)
    return call.reply(options)


@endpoint(routes, "POST", "/v1/auth/step-up/passkey/verify", auth=auth.Public(), json_only=True,
          headers=_PROJECT_HEADERS,
          errors=[UnknownOrExpiredChallenge, VerificationFailed, InvalidRequest, StepUpRequired,
                  BlockedByRiskPolicy],
          replies=[Reply(200, "Signed in (the service_session cookie is set too).", Grant)])
async def post_step_up_passkey_verify(call: Call, body: StepUpVerifyBody) -> web.Response:
    """Finish a step-up by passkey: sign in.

    The body is ``challenge_id`` and the browser's ``PublicKeyCredential.toJSON()`` fields at
    top level. Answers what a sign-in answers and sets the ``service_session`` cookie. The
    challenge is used up whatever the outcome: a refused assertion issues nothing, ever."""
    iat = int(time.time())
    async with call.connection() as conn:
        s = await step_up.verify_passkey(conn, call.actor, body=body,
                                         device=client_device(call.request),
                                         settings=call.settings, iat=iat,
                                         risk_engine=call.app[RISK])
    grant = await sessions.grant(call.app[TOKENS], call.settings, project_id=s.project_id,
                                 session=s.session, user=s.user, iat=iat,
                                 refresh_token=s.refresh_token)
    return call.reply_signed_in(grant, access_token=grant.access_token, max_age=grant.expires_in)


@endpoint(routes, "POST", "/v1/auth/step-up/magic-link/send", auth=auth.Public(),
          headers=_PROJECT_HEADERS,
          errors=[UnknownOrExpiredChallenge, InvalidRequest, RateLimited, ServiceUnavailable],
          replies=[Reply(200, "The link is on its way.", StepUpSent)])
async def post_step_up_magic_link_send(call: Call, body: StepUpLinkBody) -> web.Response:
    """Start a step-up by link: a link to the challenged user's verified e-mail address (else
    phone number), redeemed by ``POST /v1/auth/magic-link/verify`` like any link."""
    sent = await step_up.send_link(call.pool, call.actor, challenge_id=body.challenge_id,
                                   per_destination=call.app[SEND_LIMITS].per_destination,
                                   kms=call.app[KMS], settings=call.settings,
                                   redirect_url=body.redirect_url)
    return call.reply(sent)
