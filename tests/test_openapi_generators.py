"""docs/openapi.json generates whole clients: with openapi-python-client (Python) and with the npm
openapi-typescript (TypeScript types), every operation and every answer model, without a warning.

What a new user would run, on the committed document:

* ``openapi-python-client generate --path docs/openapi.json --config
  docs/openapi-python-client.yaml --meta none`` (its post hooks, ruff on the generated code, left
  out here: formatting is not the document's business and doubles the time). Any line of its
  output other than ``Generating ...`` is a warning and fails the test; so does an operation of
  the document without its module (``api/<tag>/<operationId>.py``), or a JSON success response a
  module does not parse. The package is then imported, every module of it.
* ``openapi-typescript docs/openapi.json -o schema.d.ts`` (the version pinned in
  ``tests/openapi_typescript/package-lock.json``, installed with ``npm ci`` under ``.run/``, with
  Debian's ``nodejs`` and ``npm`` when missing): any output besides its banner fails, and every
  path and every operation id must be in the types, which ``tsc --strict`` must compile.

openapi-python-client is a development dependency of the project (``pyproject.toml``'s dev
extra); the test fails, saying so, when it is not installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from devtools import DevServicesError
from tests.fixtures.installs import debian_packages, npm_packages, tell

ROOT = Path(__file__).resolve().parents[1]
DOCUMENT = ROOT / "docs" / "openapi.json"
PYTHON_CONFIG = ROOT / "docs" / "openapi-python-client.yaml"
TS_SOURCE = Path(__file__).resolve().parent / "openapi_typescript"
TS_DIR = ROOT / ".run" / "peers" / "openapi-typescript"
TS_VERSION = json.loads((TS_SOURCE / "package.json").read_text())["dependencies"]["openapi-typescript"]
"""Why 7.13.0: the 7.x line runs on Node.js 18 (Debian 12's is 18.19), and so does every package
of its lock file, the strictest being @redocly/openapi-core (``node >=18.17.0``); tried on
18.20 and 20.20, with the same output."""
MIN_NODE: tuple[int, int] = (18, 17)
PACKAGE = "authio_generated"
JSON_MEDIA = re.compile(r"^application/(?:[\w.+-]+\+)?json$")


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return json.loads(DOCUMENT.read_bytes())


def _operations(document: dict[str, Any]) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """Every operation by its id: its tag, ``METHOD path``, and the operation object."""
    out: dict[str, tuple[str, str, dict[str, Any]]] = {}
    for path, item in document["paths"].items():
        for method, op in item.items():
            assert op["operationId"] not in out, f"{op['operationId']} is not unique"
            assert len(op["tags"]) == 1, f"{method} {path}: one tag per operation"
            out[op["operationId"]] = (op["tags"][0], f"{method.upper()} {path}", op)
    return out


def test_operation_ids_read_as_method_names(document: dict[str, Any]) -> None:
    ops = _operations(document)
    assert all(re.fullmatch(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*", name) for name in ops), sorted(ops)
    for name, route in [("create_user", "POST /v1/users"), ("list_users", "GET /v1/users"),
                        ("update_user", "PATCH /v1/users/{user_id}"),
                        ("create_organization", "POST /v1/organizations"),
                        ("check_permission", "POST /v1/stores/{store_id}/check"),
                        ("batch_check", "POST /v1/stores/{store_id}/batch-check"),
                        ("verify_passkey_login", "POST /v1/auth/passkey/login/verify"),
                        ("refresh_session", "POST /v1/sessions/refresh")]:
        assert ops[name][1] == route
    tags = {tag["name"] for tag in document["tags"]}
    assert {tag for tag, _, _ in ops.values()} == tags
    titles = [schema.get("title") for schema in document["components"]["schemas"].values()]
    assert titles == list(document["components"]["schemas"]), "each component titled by its name"


def _tool(name: str) -> str:
    found = shutil.which(name, path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[dev]' (it is a dev dependency)")
    return found


def test_openapi_python_client_generates_every_operation(document: dict[str, Any],
                                                         tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(PYTHON_CONFIG.read_text() + "post_hooks: []\n")
    out = tmp_path / PACKAGE
    began = time.monotonic()
    run = subprocess.run(
        [_tool("openapi-python-client"), "generate", "--path", str(DOCUMENT), "--output-path",
         str(out), "--meta", "none", "--config", str(config)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, stdin=subprocess.DEVNULL)
    said = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    assert run.returncode == 0 and said == [f"Generating {out}"], "\n".join(said)
    tell(f"openapi-python-client: {time.monotonic() - began:.1f} s")

    generated = {(module.parent.name, module.stem) for module in (out / "api").glob("*/*.py")
                 if module.stem != "__init__"}
    ops = _operations(document)
    assert generated == {(tag, name) for name, (tag, _, _) in ops.items()}
    for name, (tag, route, op) in ops.items():
        source = (out / "api" / tag / f"{name}.py").read_text()
        for status, response in op["responses"].items():
            if status.startswith("2") and any(JSON_MEDIA.match(media)
                                              for media in response.get("content", {})):
                assert f"response.status_code == {status}:" in source, f"{route}: {status}"

    # Each component a class of its own, named by its title, and the package imports.
    models = sorted({schema["title"] for schema in document["components"]["schemas"].values()
                     if schema.get("type") == "object" and "properties" in schema})
    check = f"""
import importlib, json, pkgutil, sys
import {PACKAGE}, {PACKAGE}.api, {PACKAGE}.models
modules = [m.name for m in pkgutil.walk_packages({PACKAGE}.api.__path__, "{PACKAGE}.api.")]
for name in modules:
    module = importlib.import_module(name)
    if not module.__file__.endswith("__init__.py"):
        assert callable(module.sync_detailed) and callable(module.asyncio_detailed), name
missing = [m for m in json.loads(sys.argv[1]) if not hasattr({PACKAGE}.models, m)]
assert not missing, missing
print(len(modules))
"""
    run = subprocess.run([sys.executable, "-c", check, json.dumps(models)], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path, stdin=subprocess.DEVNULL,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert run.returncode == 0, run.stderr[-4000:]
    assert int(run.stdout.split()[-1]) >= len(ops)


def _node_version(node: str) -> tuple[int, int]:
    text = subprocess.run([node, "--version"], capture_output=True, text=True, check=False,
                          timeout=30).stdout.strip()
    found = re.fullmatch(r"v(\d+)\.(\d+)\..*", text)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def ensure_openapi_typescript() -> Path:
    """:data:`TS_DIR` with the packages of ``tests/openapi_typescript/package-lock.json``
    installed (``npm ci``, again only when the lock file changes), Node.js and npm first when
    missing. Raises :class:`devtools.DevServicesError` when they cannot be installed or the
    Node.js found is older than :data:`MIN_NODE`."""
    debian_packages(["nodejs", "npm"], present=lambda: bool(shutil.which("node") and shutil.which("npm")),
                    needed_by="the OpenAPI generator tests")
    node = str(shutil.which("node"))
    if _node_version(node) < MIN_NODE:
        raise DevServicesError(
            f"openapi-typescript {TS_VERSION} needs Node.js {'.'.join(map(str, MIN_NODE))} or "
            f"later; {node} is older: install a newer nodejs (Debian 12's is 18.19)")
    return npm_packages(TS_SOURCE, TS_DIR, needed_by="the OpenAPI generator tests",
                        what=f"openapi-typescript {TS_VERSION}")


def test_openapi_typescript_types_every_path(document: dict[str, Any], tmp_path: Path) -> None:
    where = ensure_openapi_typescript()
    out = tmp_path / "schema.d.ts"
    began = time.monotonic()
    run = subprocess.run(
        [str(where / "node_modules" / ".bin" / "openapi-typescript"), str(DOCUMENT), "-o", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, stdin=subprocess.DEVNULL)
    said = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    assert run.returncode == 0 and len(said) == 2, "\n".join(said)
    assert said[0] == f"✨ openapi-typescript {TS_VERSION}" and said[1].startswith("🚀 "), said
    tell(f"openapi-typescript: {time.monotonic() - began:.1f} s")

    types = out.read_text()
    paths = types[types.index("export interface paths {"):types.index("export type webhooks")]
    missing = [path for path in document["paths"] if f'\n    "{path}": {{' not in paths]
    assert missing == []
    operations = types[types.index("export interface operations {"):]
    missing = [name for name in _operations(document) if f"\n    {name}: {{" not in operations]
    assert missing == []
    for name in ("UserPage", "JsonValue", "JsonObject", "Error"):
        assert f"\n        {name}: " in types, name

    run = subprocess.run([str(where / "node_modules" / ".bin" / "tsc"), "--noEmit", "--strict",
                          str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
