"""Dashboard operators: the operator as the API shows it, adding one, and the operator console's
request bodies and query strings."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, BeforeValidator, Field, StringConstraints, WithJsonSchema

from common.ids import id_pattern, is_id
from common.schemas import QueryModel, RequestModel
from control_plane.users.schemas import UserName
from control_plane.web.pagination import Cursor
from control_plane.web.schemas import Email


@dataclass(frozen=True, slots=True)
class Operator:
    """A dashboard operator (``opr_``) of a tenant: a person who signs in to the operator
    console at ``/console`` (by a magic link sent to ``email``) and acts there on the tenant's
    projects. ``user_id`` is the operator's user in the tenant's operator project."""

    id: str
    tenant_id: str
    email: str
    name: str
    user_id: str
    created_at: datetime


class AddOperator(RequestModel):
    """``POST /v1/operators``: the new operator's e-mail address (unique in the tenant whatever
    its case) and, optionally, a display name."""

    email: Email
    name: UserName = ""


# --- the console ----------------------------------------------------------------------------------


def _project_id(value: str) -> str:
    if not is_id(value, "proj"):
        raise ValueError("must be a project id (proj_...)")
    return value


ProjectId = Annotated[str, AfterValidator(_project_id), WithJsonSchema(
    {"type": "string", "pattern": id_pattern("proj"),
     "description": "A project of the operator's tenant."})]


def _blank_is_none(value: object) -> object:
    return None if value == "" else value


FILTER_LENGTH: Final = 256
Filter = Annotated[
    Annotated[str, StringConstraints(max_length=FILTER_LENGTH, pattern=r"^[^\x00-\x1f\x7f]*$")]
    | None, BeforeValidator(_blank_is_none),
    WithJsonSchema({"type": "string", "maxLength": FILTER_LENGTH,
                    "pattern": "^[^\\u0000-\\u001f\\u007f]*$"})]
"""A filter field of a console page's form: empty means not given (a form sends every field)."""


class ConsolePageQuery(QueryModel):
    """A console page: the project to show (default: the tenant's first) and, for a list, the
    ``cursor`` of its next page."""

    strict_names = True
    single_values = True

    project_id: Annotated[ProjectId | None, BeforeValidator(_blank_is_none), WithJsonSchema({
        "anyOf": [{"type": "string", "pattern": id_pattern("proj")}, {"const": ""}],
        "description": "The project to show, of the operator's tenant (absent or empty: its "
                       "first)."})] = None
    cursor: Cursor = None


class DevicePageQuery(ConsolePageQuery):
    """The device page: the code, filled in from ``authio login``'s link."""

    user_code: Filter = None


class AuditPageQuery(ConsolePageQuery):
    """The audit-log page and its exports: the log's filters as the page's form sends them
    (an empty field is no filter). Each is what ``GET /v1/audit/events`` takes: ``type``
    (comma-separated actions), ``actor``, ``user``, ``from`` and ``to`` (ISO 8601, no offset:
    UTC) and ``q``; a value the log refuses is shown on the page."""

    type: Filter = None
    actor: Filter = None
    user: Filter = None
    since: Annotated[Filter, Field(alias="from")] = None
    to: Filter = None
    q: Filter = None


class ActionQuery(QueryModel):
    """A console action: the project it acts in."""

    strict_names = True
    single_values = True

    project_id: ProjectId


class SignInBody(RequestModel):
    """``POST /console/sign-in``: the operator's e-mail address."""

    email: Email


@dataclass(frozen=True, slots=True)
class SignInSent:
    """The same answer whether or not the address is an operator's (no enumeration): a
    sign-in link goes to each tenant the address is an operator of."""

    sent: bool
    expires_in: int


class SessionBody(RequestModel):
    """``POST /console/session``: the tokens of a sign-in to the tenant's operator project (what
    ``POST /v1/auth/magic-link/verify`` answered the console's landing page)."""

    access_token: Annotated[str, StringConstraints(min_length=1, max_length=4096)]
    refresh_token: Annotated[str, StringConstraints(min_length=1, max_length=256)]


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    """The console session: the operator signed in, and the CSRF token every action sends as
    ``X-CSRF-Token``."""

    operator: Operator
    csrf_token: str


@dataclass(frozen=True, slots=True)
class SignedOut:
    """The console session is revoked and its cookies cleared."""

    signed_out: Literal[True]
