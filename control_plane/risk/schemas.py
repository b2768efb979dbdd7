"""Risk bodies: the policy (DESIGN.md "risk": ``{threshold_challenge, threshold_block, signals:
{<name>: {enabled, weight}}}``), a decision as the API shows it, the decisions listing's query,
and the step-up calls' bodies."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import BeforeValidator, Field, StringConstraints, ValidationInfo, field_validator

from common.schemas import RequestModel, integral
from control_plane.audit.schemas import Time, not_before_from
from control_plane.magic_links.schemas import REDIRECT_URL_DESCRIPTION, RedirectUrl
from control_plane.passkeys.schemas import AuthenticationResponseBody
from control_plane.risk import signals
from control_plane.web.pagination import PageQuery

DecisionKind = Literal["allow", "challenge", "block"]
Score = Annotated[int, Field(ge=0, le=100), BeforeValidator(integral)]
"""A score, threshold or weight: an integer from 0 to 100."""
DEFAULT_THRESHOLD_CHALLENGE: Final = 50
DEFAULT_THRESHOLD_BLOCK: Final = 90
ChallengeId = Annotated[str, StringConstraints(pattern=r"^chal_[0-9a-z]{26}$")]


class SignalSetting(RequestModel):
    """One signal of a policy: whether it is evaluated, and what it adds to the score when it
    fires (0 to 100)."""

    enabled: bool = True
    weight: Score


class PolicyBody(RequestModel):
    """A project's risk policy. Scores are 0 to 100: at or above ``threshold_block`` a sign-in
    is blocked, at or above ``threshold_challenge`` (which must be lower) it needs a step-up.
    ``signals`` sets any of the signals by name; a signal left out keeps its default (enabled,
    its default weight). An unknown name is ``invalid_request``."""

    threshold_challenge: Score
    threshold_block: Score
    signals: dict[str, SignalSetting] = Field(
        default_factory=dict, json_schema_extra={"propertyNames": {"enum": list(signals.NAMES)}})

    @field_validator("signals")
    @classmethod
    def _known(cls, v: dict[str, SignalSetting]) -> dict[str, SignalSetting]:
        unknown = sorted(set(v) - set(signals.NAMES))
        if unknown:
            raise ValueError(f"unknown signal {unknown[0]!r}; the signals are "
                             f"{', '.join(signals.NAMES)}")
        return v

    @field_validator("threshold_block")
    @classmethod
    def _above_challenge(cls, v: int, info: ValidationInfo) -> int:
        challenge = info.data.get("threshold_challenge")
        if challenge is not None and v <= challenge:
            raise ValueError("must be greater than threshold_challenge")
        return v


@dataclass(frozen=True, slots=True)
class SignalPolicy:
    """A signal as the policy sets it, with what it looks at."""

    enabled: bool
    weight: int
    description: str


@dataclass(frozen=True, slots=True)
class Policy:
    """The project's risk policy: the thresholds and every signal. ``default`` is true while the
    project never set one (this is then the documented default); ``updated_at`` is the last
    ``PUT``."""

    threshold_challenge: int
    threshold_block: int
    signals: dict[str, SignalPolicy]
    default: bool
    updated_at: datetime | None

    @property
    def enabled_count(self) -> int:
        return sum(1 for s in self.signals.values() if s.enabled)


def default_policy() -> Policy:
    """The policy of a project that never set one: every signal enabled at its default weight,
    challenge at 50, block at 90. No signal about a place or device alone, nor all of them
    together (a new device in a new country after impossible travel: 85), reaches the block
    threshold; only a known-bad network does, or abuse (velocity, refused attempts) on top of
    others."""
    return Policy(DEFAULT_THRESHOLD_CHALLENGE, DEFAULT_THRESHOLD_BLOCK,
                  {name: SignalPolicy(True, weight, signals.DESCRIPTIONS[name])
                   for name, weight in signals.DEFAULT_WEIGHTS.items()},
                  True, None)


@dataclass(frozen=True, slots=True)
class SignalResult:
    """A signal's part in a decision: whether it ``fired``, what it added to the score
    (``contribution``: its weight when fired, else 0) and why (``reason``)."""

    name: str
    fired: bool
    contribution: int
    reason: str


@dataclass(frozen=True, slots=True)
class Decision:
    """A scored sign-in (``rd_``): the ``score`` (0 to 100, the fired signals' weights summed
    and capped), the ``decision`` (``allow``, ``challenge``: a step-up was required, ``block``),
    every enabled signal with its result, the ``reasons`` of those that fired, and the
    ``inputs`` the signals saw (``ip``, ``user_agent``, ``device``, ``place``, counts).
    ``session_id`` is the session it started, directly or after its step-up;
    ``step_up_challenge_id`` the challenge a ``challenge`` created."""

    id: str
    user_id: str | None
    session_id: str | None
    method: str
    score: int
    decision: DecisionKind
    signals: list[SignalResult]
    reasons: list[str]
    inputs: dict[str, Any]
    step_up_challenge_id: str | None
    created_at: datetime


class DecisionsQuery(PageQuery):
    """``GET /v1/risk/decisions``: newest first; ``user`` (a user id), ``decision``, ``from``
    (inclusive) and ``to`` (exclusive) filter."""

    strict_names = True
    single_values = True

    user: Annotated[str | None, StringConstraints(min_length=1, max_length=64),
                    Field(description="Decisions about this user id.")] = None
    decision: Annotated[DecisionKind | None, Field(description="Only this outcome.")] = None
    since: Annotated[Time | None, Field(alias="from", description=(
        "Decisions at or after this ISO 8601 time (no offset: UTC)."))] = None
    to: Annotated[Time | None, Field(description=(
        "Decisions before this ISO 8601 time (no offset: UTC)."))] = None

    _to_after_from = field_validator("to")(not_before_from)


class StepUpBody(RequestModel):
    """The challenge a ``step_up_required`` answer named (``details.challenge_id``)."""

    challenge_id: ChallengeId


class StepUpLinkBody(StepUpBody):
    """The challenge, and where its link lands (as ``POST /v1/auth/magic-link/send``'s
    ``redirect_url``; this service's page without it)."""

    redirect_url: RedirectUrl | None = Field(None, description=REDIRECT_URL_DESCRIPTION)


class StepUpVerifyBody(AuthenticationResponseBody):
    """The challenge, and the assertion of a passkey of the challenged user:
    ``PublicKeyCredential.toJSON()`` after ``navigator.credentials.get`` with the options of
    ``POST /v1/auth/step-up/passkey/options``, its fields at top level."""

    challenge_id: ChallengeId


@dataclass(frozen=True, slots=True)
class StepUpSent:
    """A step-up link is on its way to the user's verified ``channel`` (``email`` or ``sms``;
    ``destination`` masked); it works once, for ``expires_in`` seconds, and is redeemed like
    any link (``POST /v1/auth/magic-link/verify``)."""

    sent: bool
    channel: Literal["email", "sms"]
    destination: str
    expires_in: int
