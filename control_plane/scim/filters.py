"""SCIM filters (RFC 7644 3.4.2.2) as SQL: scim2-models parses and checks a filter against the
resource's schema (``ScimFilter``), and :class:`SqlFilter` walks its tree (a ``FilterVisitor``)
into a condition on a row of a listing.

A row of a listing is a JSON document (``View.doc``: the resource as the service shows it, less
what ``View.columns`` gives from columns: ``id``, ``active``, ``meta.*``). An attribute is read
from the document by its canonical name, whatever case the filter wrote it in; a multi-valued
attribute is matched when one of its values is (``EXISTS`` over its elements, or over the rows
``View.arrays`` names). Strings compare case-insensitively unless the schema says the attribute
is ``caseExact`` (``id``, ``externalId``), as RFC 7643 2.2 has it; a value of another JSON type
than the attribute's matches nothing. Every leaf is two-valued (an absent attribute is not equal,
and ``not`` of it holds), as RFC 7644 3.4.2.2's table reads.
"""

from __future__ import annotations

import datetime
import decimal
from dataclasses import dataclass, field
from typing import Any, Final

from scim2_models import Extension, InvalidFilterException, Path, ScimFilter
from scim2_models.path import (
    AttributeBinding,
    AttrPath,
    CompareOperator,
    Comparison,
    FilterVisitor,
    LogicalExpr,
    LogicalOperator,
    Not,
    Present,
    ValuePath,
)

from common.db import Params

_EMPTY: Final = "('null'::jsonb, '\"\"'::jsonb, '[]'::jsonb, '{}'::jsonb)"


@dataclass(frozen=True, slots=True)
class Column:
    """An attribute kept in a column: its SQL expression and the kind of value (``text``,
    ``text_exact``, ``boolean``, ``timestamptz``)."""

    sql: str
    kind: str


@dataclass(frozen=True, slots=True)
class View:
    """How a listing's rows look to a filter: ``doc``, the SQL of a row's JSON document;
    ``columns``, attributes read from columns instead (lowercased dotted names); ``arrays``,
    multi-valued attributes whose values are rows of their own (lowercased name to the SQL of
    ``FROM ... AS e(v)`` with ``v`` each value as JSON)."""

    model: Any
    doc: str
    columns: dict[str, Column] = field(default_factory=dict)
    arrays: dict[str, str] = field(default_factory=dict)


def _like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _names(binding: AttributeBinding) -> tuple[str, list[str]]:
    """The JSON key of the schema holding the attribute ("" for the resource's own) and the
    canonical names of the attribute and its sub-attribute."""
    schema = str(binding.model.__schema__)  # type: ignore[attr-defined]
    tail = binding.urn[len(schema) + 1:] if binding.urn.startswith(schema + ":") else binding.urn
    return (schema if _is_extension(binding.model) else ""), tail.split(".")


def _is_extension(model: Any) -> bool:
    return isinstance(model, type) and issubclass(model, Extension)


class SqlFilter(FilterVisitor[str]):
    """A filter of ``view``'s resource as an SQL condition, its values bound through ``params``.
    Raises InvalidFilterException for what the listing cannot compare."""

    def __init__(self, view: View, params: Params) -> None:
        self.view = view
        self.p = params

    # -- the tree --------------------------------------------------------------------------

    def visit_logical_expr(self, node: LogicalExpr) -> str:
        joiner = " AND " if node.op == LogicalOperator.and_ else " OR "
        return "(" + joiner.join(self.visit(term) for term in node.terms) + ")"

    def visit_not(self, node: Not) -> str:
        return f"(NOT {self.visit(node.expr)})"

    def visit_present(self, node: Present) -> str:
        return self._leaf(node.attr_path, lambda value, kind: _present(value, kind))

    def visit_comparison(self, node: Comparison) -> str:
        return self._leaf(node.attr_path,
                          lambda value, kind: self._compare(value, kind, node.op, node.value))

    def visit_value_path(self, node: ValuePath) -> str:
        binding = self._bind(node.attr_path)
        source = self._elements(binding, node.attr_path)
        inner = _Element(self, binding).visit(node.val_filter)
        return f"EXISTS (SELECT 1 FROM {source} WHERE {inner})"

    # -- attributes ------------------------------------------------------------------------

    def _bind(self, attr_path: AttrPath) -> AttributeBinding:
        binding = Path[self.view.model](str(attr_path)).resolve()  # type: ignore[name-defined]
        if binding is None:
            raise InvalidFilterException(detail=f"'{attr_path}' is not an attribute of the schema")
        return binding

    def _json(self, binding: AttributeBinding, names: list[str]) -> str:
        schema, _ = _names(binding)
        keys = ([schema] if schema else []) + names
        return f"({self.view.doc}) #> {self.p(keys)}::text[]"

    def _elements(self, binding: AttributeBinding, attr_path: AttrPath) -> str:
        """``FROM`` of the values of the multi-valued head attribute, each as ``e.v``."""
        schema, names = _names(binding)
        source = self.view.arrays.get(names[0].lower()) if not schema else None
        if source is not None:
            return source
        array = self._json(binding, names[:1])
        return (f"jsonb_array_elements(CASE WHEN jsonb_typeof({array}) = 'array' "
                f"THEN {array} ELSE '[]'::jsonb END) AS e(v)")

    def _leaf(self, attr_path: AttrPath, condition: Any) -> str:
        binding = self._bind(attr_path)
        schema, names = _names(binding)
        column = self.view.columns.get(".".join(names).lower()) if not schema else None
        if column is not None:
            return f"coalesce({condition(column.sql, column.kind)}, false)"
        kind = _kind(binding)
        if binding.is_multivalued:
            source = self._elements(binding, attr_path)
            value = "e.v" if len(names) == 1 else f"e.v -> {self.p(names[1])}::text"
            if len(names) == 1 and binding.sub_field_name is None and _has_value(binding):
                value = "e.v -> 'value'"  # ``emails eq "x"``: the values' ``value``
            return f"EXISTS (SELECT 1 FROM {source} WHERE coalesce({condition(value, kind)}, false))"
        return f"coalesce({condition(self._json(binding, names), kind)}, false)"

    def _compare(self, value: str, kind: str, op: CompareOperator, operand: Any) -> str:
        p = self.p
        if operand is None:
            absent = f"({value} IS NULL OR {value} = 'null'::jsonb)" if kind.startswith("json") \
                else f"({value} IS NULL)"
            if op == CompareOperator.eq:
                return absent
            if op == CompareOperator.ne:
                return f"(NOT {absent})"
            raise InvalidFilterException(detail=f"null cannot be compared with {op.value}")
        if kind in ("boolean", "json_boolean"):
            if not isinstance(operand, bool) or op not in (CompareOperator.eq, CompareOperator.ne):
                raise InvalidFilterException(detail="a boolean compares with eq or ne to true or false")
            text = value if kind == "boolean" else f"""(CASE WHEN jsonb_typeof({value}) = 'boolean'
                                                      THEN ({value})::boolean END)"""
            return f"({text} {'=' if op == CompareOperator.eq else '<>'} {p(operand)}::boolean)"
        if kind == "json_number":
            if isinstance(operand, bool) or not isinstance(operand, (int, float, decimal.Decimal)):
                raise InvalidFilterException(detail="a number compares with a number")
            text = f"(CASE WHEN jsonb_typeof({value}) = 'number' THEN ({value} #>> '{{}}')::numeric END)"
            return f"({text} {_SQL_OPS[op]} {p(str(operand))}::numeric)"
        if kind == "timestamptz":
            try:
                moment = operand if isinstance(operand, datetime.datetime) else \
                    datetime.datetime.fromisoformat(str(operand).replace("Z", "+00:00"))
            except ValueError:
                raise InvalidFilterException(detail=f"{operand!r} is not a dateTime") from None
            if op in _STRING_OPS:
                raise InvalidFilterException(detail=f"a dateTime does not compare with {op.value}")
            return f"({value} {_SQL_OPS[op]} {p(moment)}::timestamptz)"
        # Strings (and values of other JSON types read as text, which then match no string).
        if isinstance(operand, (dict, list)):
            raise InvalidFilterException(detail="a string compares with a string")
        exact = kind in ("text_exact", "json_text_exact")
        text = value if kind.startswith("text") else \
            f"(CASE WHEN jsonb_typeof({value}) = 'string' THEN {value} #>> '{{}}' END)"
        operand_text = str(operand).lower() if isinstance(operand, bool) else str(operand)
        if not exact:
            text, operand_text = f"lower({text})", operand_text.lower()
        if op in _STRING_OPS:
            pattern = {CompareOperator.co: "%{}%", CompareOperator.sw: "{}%",
                       CompareOperator.ew: "%{}"}[op].format(_like(operand_text))
            return f"({text} LIKE {p(pattern)} ESCAPE '\\')"
        return f"({text} {_SQL_OPS[op]} {p(operand_text)}::text COLLATE \"C\")" \
            if op not in (CompareOperator.eq, CompareOperator.ne) \
            else f"({text} {_SQL_OPS[op]} {p(operand_text)}::text)"


class _Element(SqlFilter):
    """The filter of a value path (``emails[type eq "work"]``): its attributes are the
    sub-attributes of one value ``e.v``."""

    def __init__(self, outer: SqlFilter, binding: AttributeBinding) -> None:
        super().__init__(outer.view, outer.p)
        self.outer = binding

    def visit_value_path(self, node: ValuePath) -> str:
        raise InvalidFilterException(detail="a value path cannot hold another")

    def _leaf(self, attr_path: AttrPath, condition: Any) -> str:
        _, names = _names(self.outer)
        binding = Path[self.view.model](  # type: ignore[name-defined]
            f"{self.outer.urn}.{attr_path.attr}").resolve()
        if binding is None or attr_path.sub_attr is not None:
            raise InvalidFilterException(
                detail=f"'{attr_path}' is not a sub-attribute of '{names[0]}'")
        _, sub = _names(binding)
        return f"coalesce({condition(f'e.v -> {self.p(sub[-1])}::text', _kind(binding))}, false)"


_STRING_OPS: Final = frozenset({CompareOperator.co, CompareOperator.sw, CompareOperator.ew})
_SQL_OPS: Final = {CompareOperator.eq: "=", CompareOperator.ne: "<>", CompareOperator.gt: ">",
                   CompareOperator.ge: ">=", CompareOperator.lt: "<", CompareOperator.le: "<="}


def _has_value(binding: AttributeBinding) -> bool:
    model = binding.field_type
    return isinstance(model, type) and "value" in getattr(model, "model_fields", {})


def _kind(binding: AttributeBinding) -> str:
    """How a JSON value of the attribute compares."""
    target = binding.target_type
    if binding.sub_field_name is None and _has_value(binding):
        # ``emails eq "x"``: the values' ``value``.
        target = binding.field_type.model_fields["value"].annotation  # type: ignore[union-attr]
    if target is bool:
        return "json_boolean"
    if isinstance(target, type) and issubclass(target, (int, float, decimal.Decimal)):
        return "json_number"
    return "json_text_exact" if binding.case_exact else "json_text"


def _present(value: str, kind: str) -> str:
    if kind.startswith("json"):
        return f"({value} IS NOT NULL AND {value} NOT IN {_EMPTY})"
    if kind.startswith("text"):
        return f"({value} IS NOT NULL AND {value} <> '')"
    return f"({value} IS NOT NULL)"


def condition(view: View, expression: str, params: Params) -> str:
    """The SQL condition of the filter ``expression`` on ``view``'s rows. Raises
    InvalidFilterException (a filter the grammar or the schema refuses)."""
    parsed = ScimFilter[view.model](expression)  # type: ignore[name-defined]
    return SqlFilter(view, params).visit(parsed.ast)
