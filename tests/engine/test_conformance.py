"""The OpenFGA-derived conformance cases, through the HTTP API (check and batch-check).

Every case of ``tests/data/conformance/openfga/cases.json`` and ``cases_extended.json`` runs in a
store of its own: its tuples are written through ``POST /v1/stores/{id}/write`` (chunks of at most
1,000), then every assertion is checked with ``consistency.at_least_revision`` set to the revision
of the last write, once per assertion through ``/check`` and once per case through
``/batch-check``.

Besides ``allowed``, each answer must be internally consistent: ``resolution`` is ``"none"``
exactly when denied, and an allowed answer's ``resolution_path`` is a real proof chain made of the
case's tuples (``object#relation@user`` steps, each step's user naming the next step's node, the
last step's user being the checked user).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.data import CONFORMANCE
from tests.fixtures.service import Api, Project

CASE_FILES = ("cases.json", "cases_extended.json")
WRITE_CHUNK = 1000


def _load_cases() -> list[Any]:
    params = []
    seen: set[str] = set()
    for name in CASE_FILES:
        cases = json.loads((CONFORMANCE / name).read_text())
        for case in cases:
            case_id = f"{Path(name).stem}:{case['name']}"
            assert case_id not in seen, f"duplicate case name {case_id}"
            seen.add(case_id)
            params.append(pytest.param(case, id=case_id))
    return params


CASES = _load_cases()


def test_suite_is_complete() -> None:
    """Guard against the suite silently shrinking: 15 cases, 43 assertions (see DROPPED.md)."""
    assert len(CASES) == 15
    assert sum(len(p.values[0]["checks"]) for p in CASES) == 43


def _tuple_str(t: dict[str, str]) -> str:
    return f"{t['object']}#{t['relation']}@{t['user']}"


def _split_step(step: str) -> tuple[str, str]:
    """``"object#relation@user"`` -> (``"object#relation"``, ``user``). Ids may hold '@'
    (e-mail addresses) but types and ids never hold '#', and relations never hold '@': the
    object ends at the first '#', the relation at the next '@' (common/tuples.py)."""
    obj, _, rest = step.partition("#")
    relation, _, user = rest.partition("@")
    return f"{obj}#{relation}", user


def _assert_consistent(answer: dict[str, Any], tuples: list[dict[str, str]],
                       assertion: dict[str, Any], min_revision: int) -> None:
    """``answer`` agrees with ``assertion`` and explains itself with a valid proof."""
    what = _tuple_str(assertion)
    assert answer["allowed"] is assertion["allowed"], (what, answer)
    assert isinstance(answer["revision"], int) and answer["revision"] >= min_revision, answer
    path = answer["resolution_path"]
    assert isinstance(path, list), answer
    if not answer["allowed"]:
        assert answer["resolution"] == "none", (what, answer)
        assert path == [], (what, answer)
        return
    assert answer["resolution"] in ("direct", "userset"), (what, answer)
    assert path, (what, answer)  # the suite has no self-defining (O#R on O) assertions
    stored = {_tuple_str(t) for t in tuples}
    node = f"{assertion['object']}#{assertion['relation']}"
    for i, step in enumerate(path):
        assert step in stored, (what, f"step {i} {step!r} is not a tuple of the case", answer)
        step_node, step_user = _split_step(step)
        assert step_node == node, (what, f"step {i} starts at {step_node!r}, expected {node!r}", answer)
        node = step_user
    assert node == assertion["user"], (what, "proof does not end at the checked user", answer)
    assert answer["resolution"] == ("direct" if len(path) == 1 else "userset"), (what, answer)


def test_path_steps_with_at_signs_in_ids() -> None:
    """The proof check itself: '@' in the object id and in the user id of a step."""
    tuples = [{"object": "doc:q3@finance", "relation": "viewer", "user": "group:ops@acme#member"},
              {"object": "group:ops@acme", "relation": "member", "user": "user:anne@example.com"}]
    assertion = {"object": "doc:q3@finance", "relation": "viewer",
                 "user": "user:anne@example.com", "allowed": True}
    answer: dict[str, Any] = {"allowed": True, "resolution": "userset", "revision": 1,
                              "resolution_path": [_tuple_str(t) for t in tuples]}
    assert _split_step(answer["resolution_path"][0]) == ("doc:q3@finance#viewer",
                                                          "group:ops@acme#member")
    _assert_consistent(answer, tuples, assertion, 1)


async def _store_with_tuples(api: Api, case: dict[str, Any]) -> tuple[str, int]:
    r = await api.post("/v1/stores", {"name": f"conformance {case['name']}"[:200]})
    assert r.status == 201, r.body
    store_id = r.body["id"]
    revision = r.body.get("revision", 0)
    tuples = case["tuples"]
    for start in range(0, len(tuples), WRITE_CHUNK):
        chunk = [{k: t[k] for k in ("object", "relation", "user")}
                 for t in tuples[start:start + WRITE_CHUNK]]
        w = await api.post(f"/v1/stores/{store_id}/write", {"writes": chunk})
        assert w.status == 200, w.body
        assert w.body["written"] == len(chunk), w.body
        revision = w.body["revision"]
    return store_id, revision


def _check_body(c: dict[str, Any], revision: int) -> dict[str, Any]:
    return {"tuple_key": {"object": c["object"], "relation": c["relation"], "user": c["user"]},
            "consistency": {"at_least_revision": revision}}


@pytest.mark.parametrize("case", CASES)
async def test_case_check(project: Project, case: dict[str, Any]) -> None:
    store_id, revision = await _store_with_tuples(project.api, case)
    for assertion in case["checks"]:
        r = await project.api.post(f"/v1/stores/{store_id}/check", _check_body(assertion, revision))
        assert r.status == 200, (_tuple_str(assertion), r.status, r.body)
        _assert_consistent(r.body, case["tuples"], assertion, revision)
        assert r.body["request_id"] == r.headers["X-Request-Id"]


@pytest.mark.parametrize("case", CASES)
async def test_case_batch_check(project: Project, case: dict[str, Any]) -> None:
    store_id, revision = await _store_with_tuples(project.api, case)
    body = {"checks": [_check_body(a, revision) for a in case["checks"]]}
    r = await project.api.post(f"/v1/stores/{store_id}/batch-check", body)
    assert r.status == 200, r.body
    results = r.body["results"]
    assert len(results) == len(case["checks"]), r.body
    assert r.body["revision"] >= revision, r.body
    for assertion, result in zip(case["checks"], results, strict=True):
        assert "error" not in result, (_tuple_str(assertion), result)
        _assert_consistent(result, case["tuples"], assertion, revision)
