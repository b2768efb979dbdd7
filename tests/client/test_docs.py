"""The Python code blocks of the client's documentation run, against the service: every
```` ```python ```` block of ``docs/client.md`` and ``clients/python/README.md``, and of the
README's "Use it from your application" section when it has one, each in a fresh namespace
with ``AUTHIO_BASE_URL``, ``AUTHIO_API_KEY`` (a new project's full-access key) and
``AUTHIO_PROJECT_ID`` set. They run in a worker thread: the sync client blocks there while the
service answers on the test's event loop, and ``asyncio.run`` gets a loop of its own."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from tests.fixtures.service import Project

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
SECTION = "## Use it from your application"


def blocks(path: Path, section: str | None = None) -> list[str]:
    text = path.read_text()
    if section is not None:
        if section not in text:
            return []
        text = text.split(section, 1)[1]
        text = re.split(r"^## ", text, maxsplit=1, flags=re.M)[0]
    return BLOCK.findall(text)


CASES = [(f"{p}#{i}", code) for p in ("docs/client.md", "clients/python/README.md")
         for i, code in enumerate(blocks(ROOT / p))]
CASES += [(f"README.md#{i}", code) for i, code in enumerate(blocks(ROOT / "README.md", SECTION))]


def test_the_docs_have_code_to_run() -> None:
    assert len([c for c in CASES if c[0].startswith("docs/")]) >= 5
    assert len([c for c in CASES if c[0].startswith("clients/")]) >= 2


@pytest.mark.parametrize(("where", "code"), CASES, ids=[c[0] for c in CASES])
async def test_a_docs_block_runs(where: str, code: str, project: Project,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTHIO_BASE_URL", project.api.base_url)
    monkeypatch.setenv("AUTHIO_API_KEY", project.key)
    monkeypatch.setenv("AUTHIO_PROJECT_ID", project.id)

    def run() -> None:
        exec(compile(code, where, "exec"), {"__name__": "__docs__"})

    await asyncio.to_thread(run)
