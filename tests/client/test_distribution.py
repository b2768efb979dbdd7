"""``authio-client`` is a light distribution of its own: it declares only ``httpx`` and
``pyjwt[crypto]``, imports none of the server's packages (nor a web framework until its
middleware module is imported), and its wheel carries the package with ``py.typed``."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("asyncpg", "uvloop", "alembic", "aiohttp", "starlette", "fastapi", "redis", "orjson",
               "sqlalchemy", "common", "engine", "control_plane")


def test_it_depends_on_httpx_and_pyjwt_only() -> None:
    required = [r for r in metadata.requires("authio-client") or [] if "extra ==" not in r]
    assert sorted(r.replace(" ", "") for r in required) == ["httpx>=0.27", "pyjwt[crypto]>=2.8"]
    extras = set(metadata.metadata("authio-client").get_all("Provides-Extra") or [])
    assert extras == {"aiohttp", "starlette"}


def test_importing_it_loads_nothing_of_the_server() -> None:
    code = ("import sys, authio_client, authio_client.errors, authio_client.models; "
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(SERVER_ONLY)!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_its_build_carries_the_typed_package() -> None:
    """What setuptools puts in the distribution (``build_py``, as a wheel build does; with the
    virtualenv's setuptools, so no package index is asked)."""
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run(
            [sys.executable, "-c", "import setuptools; setuptools.setup()", "-q", "build_py", "-d", out],
            cwd=ROOT / "clients" / "python", capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        names = {str(p.relative_to(out)) for p in Path(out).rglob("*") if p.is_file()}
    assert {"authio_client/__init__.py", "authio_client/py.typed", "authio_client/starlette.py",
            "authio_client/aiohttp.py"} <= names
    assert all(n.startswith("authio_client/") for n in names), names
