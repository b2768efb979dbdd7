"""The check bodies, as the OpenAPI document describes them.

The hot path parses these bodies by hand (``engine.checks``: no pydantic per check, measured in
bench/); these models are the same contract written for the document and for clients, and a
test runs both over the same bodies (tests/engine/test_check_schemas.py) so they cannot drift.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field

from common.http import OMIT_IF_NONE
from common.ids import id_pattern
from common.schemas import RequestModel
from common.tuples import ObjectName, RelationName, TupleKey

MAX_BATCH = 1000
"""Most items one batch-check may hold."""


class Consistency(RequestModel):
    """``at_least_revision``: answer at this store revision or a later one (a write's
    ``revision``), waiting up to ``SERVICE_CONSISTENCY_TIMEOUT_MS`` for the engine to follow it
    (then 503 ``revision_not_reached`` with ``Retry-After``); a revision beyond the store's latest
    is 400 ``revision_ahead`` at once."""

    at_least_revision: Annotated[int, Field(ge=0)] | None = None


class CheckRequest(RequestModel):
    """Does ``tuple_key.user`` have ``tuple_key.relation`` on ``tuple_key.object``?"""

    tuple_key: TupleKey
    consistency: Consistency | None = None


class BatchCheckRequest(RequestModel):
    """Up to 1,000 checks, answered in order at one revision."""

    checks: Annotated[list[CheckRequest], Field(min_length=1, max_length=MAX_BATCH)]
    consistency: Consistency | None = None


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The answer and why: ``resolution`` ``direct`` (the tuple exists), ``userset`` (through
    the tuples of ``resolution_path``, ``object#relation@user`` each) or ``none`` (denied);
    ``dispatch_count`` the ``object#relation`` nodes visited, ``depth`` the nodes on the proof
    (0 when denied); ``revision`` the store revision answered at; ``stale``, present and true
    only while the engine cannot follow the change log (PostgreSQL unreachable): the answer comes
    from memory at the store's last revision, which may be behind (also ``X-Authio-Stale: true``;
    in a batch, on the batch, not on its items)."""

    allowed: bool
    resolution: Literal["direct", "userset", "none"]
    resolution_path: list[str]
    revision: int
    dispatch_count: int
    depth: int
    stale: Literal[True] | None = field(default=None, metadata={OMIT_IF_NONE: True})


@dataclass(frozen=True, slots=True)
class ItemError:
    """A batch item refused alone: ``{"code", "message", "details"}`` as in the envelope."""

    error: dict[str, Any]


@dataclass(frozen=True, slots=True)
class BatchCheckResult:
    """One result per check, in order: an answer or that item's error; ``stale`` as on a check
    (present and true only while the engine answers from memory without following the log)."""

    results: list[CheckResult | ItemError]
    revision: int
    stale: Literal[True] | None = field(default=None, metadata={OMIT_IF_NONE: True})


ProjectId = Annotated[str, Field(pattern=id_pattern("proj"))]
StoreId = Annotated[str, Field(pattern=id_pattern("store"))]


class EdgeQuery(RequestModel):
    """Query parameters of edge validation: ``project_id`` pins the project a token must
    belong to; ``store_id``, ``object`` and ``relation`` (all three or none) ask in the same
    call whether ``user:<sub>`` has the relation on the object."""

    project_id: ProjectId | None = None
    store_id: StoreId | None = None
    object: ObjectName | None = None
    relation: RelationName | None = None


class EdgeValidateBody(RequestModel):
    """The JSON body of ``POST /v1/edge/validate``: a permission to check with the session
    (all three or none). A permission in the query string is checked as well: both must be
    allowed, and neither completes the other."""

    store_id: StoreId | None = None
    object: ObjectName | None = None
    relation: RelationName | None = None


@dataclass(frozen=True, slots=True)
class EdgeIdentity:
    """Who a valid session is: ``org_id`` and ``org_role`` are null when no organization is
    selected (and their ``Service-Org-*`` headers absent)."""

    user_id: str
    session_id: str
    org_id: str | None
    org_role: str | None
    project_id: str
