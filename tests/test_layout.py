"""The shape of the code base, read from its source (an AST walk; nothing is imported).

* No import circle among the service's modules, counting every import, including those inside
  functions and under ``TYPE_CHECKING`` (which is how circles used to be hidden).
* ``common`` imports neither service, the engine never imports the control plane, and no
  service module imports ``devtools`` (development tooling, never needed at run time).
* A control-plane domain reaches another only through that domain's ``service`` (its rules) or
  ``schemas`` (its types); ``web`` reaches no domain at all. ``app``, ``appkeys`` and ``cli``
  are the wiring above the domains.
* Every domain package has the rooms DESIGN.md gives it, and handlers and rules are named apart:
  a route handler is named for its HTTP method, a rule never is.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "engine", "control_plane", "devtools")
HUBS = {"control_plane.app", "control_plane.appkeys", "control_plane.cli", "control_plane.kms",
        "control_plane.migrate", "control_plane.migrations", "control_plane.web"}
HTTP_METHODS = ("get_", "post_", "put_", "patch_", "delete_")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    is_package = MODULES[module].name == "__init__.py"
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *(node.module.split(".") if node.module else [])])


def _imports(module: str) -> Iterator[str]:
    """Every module of ours that ``module`` imports, anywhere in it."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            names = [f"{target}.{a.name}" for a in node.names] + [target]
        for name in names:
            # ``from pkg import mod`` imports pkg.mod when it is a module, else pkg.
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module:
                yield name


GRAPH = {m: sorted(set(_imports(m))) for m in MODULES}


def _cycle() -> list[str] | None:
    """One import circle, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in GRAPH[m]:
            if state.get(n) == 1:
                return [*stack[stack.index(n):], n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in GRAPH:
        if m not in state and (found := visit(m)):
            return found
    return None


def _package(module: str) -> str:
    return module.split(".")[0]


def _domain(module: str) -> str | None:
    """The control-plane domain of ``module`` (``users``), or None for the hubs and others."""
    parts = module.split(".")
    if parts[0] != "control_plane" or len(parts) < 2:
        return None
    top = ".".join(parts[:2])
    return None if top in HUBS else parts[1]


def test_the_walk_sees_the_code_base() -> None:
    """A guard on the guard: the modules and edges it reasons about exist."""
    assert {"common.http", "engine.graph.search", "control_plane.users.service"} <= set(MODULES)
    assert "control_plane.audit.service" in GRAPH["control_plane.users.service"]
    assert "common.errors" in GRAPH["control_plane.web.auth"]


def test_no_import_circle() -> None:
    assert _cycle() is None, " -> ".join(_cycle() or [])


@pytest.mark.parametrize(("package", "forbidden"), [
    ("common", {"engine", "control_plane", "devtools"}),
    ("engine", {"control_plane", "devtools"}),
    ("control_plane", {"devtools"}),
])
def test_layers(package: str, forbidden: set[str]) -> None:
    wrong = [(m, n) for m, targets in GRAPH.items() if _package(m) == package
             for n in targets if _package(n) in forbidden]
    assert not wrong, wrong


def test_domains_meet_only_through_service_and_schemas() -> None:
    wrong = []
    for m, targets in GRAPH.items():
        mine = _domain(m)
        for n in targets:
            theirs = _domain(n)
            if (m == "control_plane.web" or m.startswith("control_plane.web.")) and theirs is not None:
                wrong.append((m, n))  # web is below every domain
            elif (mine and theirs and mine != theirs and n != f"control_plane.{theirs}"
                  and n.rpartition(".")[2] not in ("service", "schemas")):
                wrong.append((m, n))  # (a package itself: its __init__, which holds nothing)
    assert not wrong, wrong


DOMAINS = sorted({d for m in MODULES if (d := _domain(m))})


@pytest.mark.parametrize("domain", DOMAINS)
def test_every_domain_has_its_rooms(domain: str) -> None:
    rooms = {m.rpartition(".")[2] for m in MODULES if _domain(m) == domain}
    assert {"endpoints", "schemas", "service"} <= rooms, rooms


def _functions(module: str) -> list[ast.AsyncFunctionDef | ast.FunctionDef]:
    tree = ast.parse(MODULES[module].read_text())
    return [n for n in tree.body if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef)]


def _is_route(fn: ast.AsyncFunctionDef | ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Call) and getattr(d.func, "id", getattr(d.func, "attr", ""))
               in ("endpoint", "route") for d in fn.decorator_list)


@pytest.mark.parametrize("domain", DOMAINS)
def test_handlers_and_rules_are_named_apart(domain: str) -> None:
    handlers = [f for f in _functions(f"control_plane.{domain}.endpoints") if _is_route(f)]
    assert handlers
    assert [f.name for f in handlers if not f.name.startswith(HTTP_METHODS)] == []
    rules = [f.name for f in _functions(f"control_plane.{domain}.service")
             if not f.name.startswith("_")]
    assert [name for name in rules if name.startswith(HTTP_METHODS)] == []


def test_no_type_checking_imports() -> None:
    """Types the code needs are imported for real (circles cannot hide behind them)."""
    users = [m for m in MODULES if "TYPE_CHECKING" in MODULES[m].read_text()]
    assert users == []
