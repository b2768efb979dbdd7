"""``common.db.Params``: placeholders allocated in order, bound by name."""

from __future__ import annotations

import pytest

from common.db import Params


def test_named_placeholders_repeat_and_bind_in_order() -> None:
    p = Params()
    sql = f"SELECT {p['b']}, {p['a']}, {p['b']}"
    assert sql == "SELECT $1, $2, $1"
    assert p.bind({"a": 1, "b": 2}) == [2, 1]
    with pytest.raises(KeyError, match="unknown parameters \\['c'\\]"):
        p.bind({"a": 1, "b": 2, "c": 3})
    with pytest.raises(KeyError):
        p.bind({"a": 1})


def test_bind_from_takes_what_the_statement_uses_of_shared_values() -> None:
    p = Params()
    _ = p["x"], p["y"]
    assert p.bind_from({"y": "Y", "unused": 0, "x": "X"}) == ["X", "Y"]
    with pytest.raises(KeyError):
        p.bind_from({"x": "X"})


def test_values_and_names_do_not_mix() -> None:
    p = Params()
    assert p(10) == "$1" and p(11) == "$2" and p.values == [10, 11]
    with pytest.raises(TypeError):
        p["name"]
