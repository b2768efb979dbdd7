"""Running the ``authio`` command as a user would: a subprocess with its own config directory."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fixtures.service import Api, Project, eventually

AUTHIO = str(Path(sys.executable).with_name("authio"))
DATA = Path(__file__).resolve().parents[1] / "data" / "imports"


@dataclass
class Ran:
    code: int
    out: str
    err: str

    @property
    def last_line(self) -> str:
        return self.out.rstrip("\n").rsplit("\n", 1)[-1]


def cli_env(config: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTHIO_")}
    env.update(XDG_CONFIG_HOME=str(config), HOME=str(config), NO_COLOR="1", **extra)
    env.pop("DISPLAY", None)
    env.pop("WAYLAND_DISPLAY", None)
    return env


async def authio(*args: str, env: dict[str, str], within: float = 120.0) -> Ran:
    proc = await asyncio.create_subprocess_exec(
        AUTHIO, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), within)
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())


def as_project(project: Project, config: Path) -> dict[str, str]:
    """The environment of a CI job importing into ``project`` (the file overridden)."""
    return cli_env(config, AUTHIO_BASE_URL=project.api.base_url, AUTHIO_API_KEY=project.key)


async def users_of(api: Api) -> list[dict[str, Any]]:
    """Every user of the key's project."""
    found: list[dict[str, Any]] = []
    path = "/v1/users?limit=100"
    while True:
        r = await api.get(path)
        assert r.status == 200, r.body
        found += r.body["data"]
        cursor = r.body.get("next_cursor")
        if not cursor:
            return found
        path = f"/v1/users?limit=100&cursor={cursor}"


def cursor_of(file: Path) -> dict[str, Any] | None:
    """The saved cursor of an import of ``file``, None when there is none."""
    path = Path(f"{file}.authio-import.cursor")
    return json.loads(path.read_text()) if path.exists() else None


def text_and_mode(path: Path) -> tuple[str, int]:
    return path.read_text(), stat.S_IMODE(path.stat().st_mode)


async def kill_after_progress(*args: str, env: dict[str, str], file: Path, beyond: int = 0) -> int:
    """Run ``authio *args``, SIGKILL it as soon as its cursor for ``file`` says it got past
    record ``beyond``, and return where the cursor stands."""
    proc = await asyncio.create_subprocess_exec(AUTHIO, *args, env=env,
                                                stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.DEVNULL)

    async def progressed() -> bool:
        saved = cursor_of(file)
        return saved is not None and saved["next_index"] > beyond
    try:
        await eventually(progressed, within=15, what="progress saved in the cursor")
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
    saved = cursor_of(file)
    assert saved is not None, "the killed run left no cursor"
    return int(saved["next_index"])
