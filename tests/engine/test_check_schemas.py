"""The engine's hand-written body parser and the check models of the OpenAPI document are the
same contract: over generated bodies, the parser accepts exactly what the models accept, with
the same values (engine.schemas says why there are two)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from common.errors import InvalidRequest
from engine.checks import _parse_batch, _parse_check
from engine.schemas import MAX_BATCH, BatchCheckRequest, CheckRequest

# Strings near the tuple formats: valid parts, and each way one can be wrong.
OBJECTS = ["doc:1", "group:eng", "user:anne@example.com", "doc", "doc:", ":1", "doc:a b",
           "doc:*", "doc:1#x", "d" * 65 + ":1", "doc:\x00"]
RELATIONS = ["viewer", "member", "can_view", "", "1view", "view er", "a" * 65, "view#er"]
USERS = ["user:anne", "group:eng#member", "user:*", "user:", "nocolon", "user:a#b#c",
         "group:x#mem ber", "user:a\n"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False),
                    st.text(max_size=3), st.just([]), st.just({}))

tuple_keys = st.one_of(
    st.fixed_dictionaries({"object": st.sampled_from(OBJECTS),
                           "relation": st.sampled_from(RELATIONS),
                           "user": st.sampled_from(USERS)}),
    st.dictionaries(st.sampled_from(["object", "relation", "user", "z"]),
                    st.one_of(st.sampled_from(OBJECTS + USERS), SCALARS), max_size=4),
    SCALARS,
)
consistencies = st.one_of(
    st.none(),
    st.fixed_dictionaries({"at_least_revision": st.one_of(st.integers(-2, 10**12), SCALARS)}),
    st.dictionaries(st.sampled_from(["at_least_revision", "x"]), SCALARS, max_size=2),
    SCALARS,
)
checks = st.one_of(
    st.fixed_dictionaries({"tuple_key": tuple_keys}),
    st.fixed_dictionaries({"tuple_key": tuple_keys}, optional={"consistency": consistencies}),
    st.dictionaries(st.sampled_from(["tuple_key", "consistency", "extra"]),
                    st.one_of(tuple_keys, consistencies), max_size=3),
    SCALARS,
)


def _model_check(body: Any) -> tuple[str, str, str, int | None] | None:
    try:
        m = CheckRequest.model_validate(body)
    except ValidationError:
        return None
    revision = m.consistency.at_least_revision if m.consistency else None
    return m.tuple_key.object, m.tuple_key.relation, m.tuple_key.user, revision


@settings(max_examples=3000, deadline=None)
@given(checks)
def test_a_check_body_is_accepted_alike(body: Any) -> None:
    fields: list[dict[str, str]] = []
    parsed = _parse_check(body, fields)
    assert parsed == _model_check(body), (body, fields)
    assert (parsed is None) == bool(fields)


@settings(max_examples=1000, deadline=None)
@given(st.fixed_dictionaries(
    {"checks": st.one_of(st.lists(checks, max_size=3), SCALARS)},
    optional={"consistency": consistencies, "extra": SCALARS}))
def test_a_batch_envelope_is_accepted_alike(body: dict[str, Any]) -> None:
    """The envelope: a bad item is that item's error, not the call's, so items are compared one
    by one (test above) and the envelope with valid items in their place."""
    items = body["checks"]
    envelope = {**body, "checks": ([{"tuple_key": {"object": "doc:1", "relation": "viewer",
                                                   "user": "user:anne"}}] * len(items)
                                   if isinstance(items, list) else items)}
    try:
        parsed: Any = _parse_batch(envelope)
    except InvalidRequest:
        parsed = None
    try:
        m = BatchCheckRequest.model_validate(envelope)
        modelled: Any = (m.checks and envelope["checks"],
                         m.consistency.at_least_revision if m.consistency else None)
    except ValidationError:
        modelled = None
    assert parsed == modelled, envelope


@pytest.mark.parametrize("size", [0, 1, MAX_BATCH, MAX_BATCH + 1])
def test_batch_size_bounds_agree(size: int) -> None:
    item = {"tuple_key": {"object": "doc:1", "relation": "viewer", "user": "user:anne"}}
    body = {"checks": [item] * size}
    try:
        _parse_batch(body)
        parsed = True
    except InvalidRequest:
        parsed = False
    try:
        BatchCheckRequest.model_validate(body)
        modelled = True
    except ValidationError:
        modelled = False
    assert parsed == modelled == (1 <= size <= MAX_BATCH)
