"""The documentation holds: its links resolve, every setting is documented, and the README's shell
blocks run.

* **Links**: every relative link of README.md, docs/**/*.md, bench/*.md and
  clients/python/README.md (inline ``[text](path#anchor)``, images, reference definitions)
  names a file or folder of the repository, and an ``#anchor`` names a heading of the target
  markdown file by GitHub's slug (lower-case, punctuation but ``-`` and ``_`` dropped, each space
  a ``-``, repeats ``-1``, ``-2``...). http(s) and mailto links are not followed.
* **Settings**: every variable of ``common.settings.Settings`` has a row in docs/settings.md
  whose default is the code's, every ``SERVICE_*`` name the page gives is one the service reads,
  and every variable the code reads directly (``os.environ``) is on the page.
* **README shell blocks**: the first ``sh`` block is the two commands ``make run`` and ``make
  test``; every later one runs, in order in one bash, as a reader following the README would,
  against ``authio serve`` started here on a database of its own (``TOKEN=`` and ``BASE=`` lines
  replaced by its bootstrap token and URL), with ``set -euo pipefail`` and ``curl`` failing on
  an HTTP error. Each ``# -> {...}`` comment is compared with the last JSON value the commands
  above it printed: the keys and values it gives (``...`` ends an object or array that may hold
  more, stands for any value, or inside a string for any text).
* **The walkthrough on the docs pages**: its blocks that go on from the Quickstart's variables and
  run offline in seconds (``WALKTHROUGH``) run the same way after the README's.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import shutil
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from aiohttp import ClientSession

from common.settings import Settings
from tests.fixtures.database import migrated_database
from tests.fixtures.installs import debian_packages
from tests.fixtures.service import BOOTSTRAP_TOKEN, ROOT, serve_process

SETTINGS_PAGE = ROOT / "docs" / "settings.md"
CODE_PACKAGES = ("common", "engine", "control_plane", "devtools")
# Read from the environment by the code but the operating system's, not the service's.
NOT_SETTINGS = frozenset({"PATH"})


def markdown_files(root: Path = ROOT) -> list[Path]:
    """The pages whose links must hold: README.md, docs/**/*.md, bench/*.md and the Python
    client's README."""
    found = [root / "README.md", *sorted((root / "docs").rglob("*.md")), *sorted((root / "bench").glob("*.md")),
             root / "clients" / "python" / "README.md"]
    return [p for p in found if p.is_file()]


# --- markdown reading ------------------------------------------------------------------------

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([^\s`]*)")


@dataclass
class Block:
    """A fenced code block: its info string (``sh``), first line number (1-based, the line after
    the fence) and its lines."""

    lang: str
    line: int
    lines: list[str]
    page: str = "README.md"


def split_fences(text: str, page: str = "README.md") -> tuple[list[tuple[int, str]], list[Block]]:
    """``text``'s lines outside fenced code blocks (``(line number, line)``) and its blocks (of
    ``page``, the repository path they are said to be from)."""
    prose: list[tuple[int, str]] = []
    blocks: list[Block] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        m = _FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                blocks.append(Block(m.group(2).lower(), number + 1, [], page))
            else:
                prose.append((number, line))
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2):
            fence = None
        else:
            blocks[-1].lines.append(line)
    return prose, blocks


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading's text, before numbering repeats: the rendered text
    (links as their text, no code ticks, emphasis stars or HTML tags) lower-cased, every
    character but letters, digits, marks, ``-``, ``_`` and spaces dropped, each space a ``-``."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\([^)]*\)", r"\1", heading.strip())
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    kept = (c for c in text.lower()
            if c.isalnum() or c in "-_ " or unicodedata.category(c).startswith("M"))
    return "".join(kept).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor of a markdown page: its headings' slugs (ATX and setext; repeats numbered
    ``-1``, ``-2``... as GitHub does) and the ``id``/``name`` of its HTML elements."""
    prose, _ = split_fences(text)
    seen: dict[str, int] = {}
    found: set[str] = set()

    def add(heading: str) -> None:
        base = slug = github_slug(heading)
        while slug in seen:
            seen[base] += 1
            slug = f"{base}-{seen[base]}"
        seen[slug] = 0
        found.add(slug)

    previous: tuple[int, str] | None = None
    for number, line in prose:
        if m := re.match(r"^ {0,3}#{1,6}(?:\s+(.*?))?(?:\s+#+)?\s*$", line):
            add(m.group(1) or "")
        elif (re.match(r"^ {0,3}(=+|-+)\s*$", line) and previous is not None
              and previous[0] == number - 1 and previous[1].strip()
              and not previous[1].lstrip().startswith(("|", "#", "-", "*", ">"))):
            add(previous[1])
        found.update(re.findall(r"""<[a-zA-Z][^>]*?\s(?:id|name)=["']([^"']+)["']""", line))
        previous = (number, line)
    return found


_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'(][^)]*)?\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?")
_SKIPPED = re.compile(r"^(?:https?|mailto):", re.IGNORECASE)


def links(text: str) -> Iterator[tuple[int, str]]:
    """The link targets of a markdown page outside code (``(line number, target)``)."""
    prose, _ = split_fences(text)
    for number, line in prose:
        line = _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        for m in _INLINE_LINK.finditer(line):
            yield number, m.group(1)
        if ref := _REFERENCE.match(line):
            yield number, ref.group(1)


def dead_links(source: Path, root: Path = ROOT) -> list[str]:
    """The relative links of the markdown file ``source`` that do not resolve within ``root``,
    each as ``"<line>: <target>: <why>"``; empty when all do."""
    text = source.read_text(encoding="utf-8")
    dead = []
    pages: dict[Path, set[str]] = {}
    for number, target in links(text):
        if _SKIPPED.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        path_part = unquote(path_part.partition("?")[0])
        if not path_part:
            resolved = source
        elif path_part.startswith("/"):
            resolved = root / path_part.lstrip("/")
        else:
            resolved = source.parent / path_part
        resolved = resolved.resolve()
        why = None
        if not target:
            why = "empty link"
        elif not resolved.is_relative_to(root.resolve()):
            why = "outside the repository"
        elif not resolved.exists():
            why = "no such file or folder"
        elif anchor:
            if resolved.suffix.lower() == ".md" and resolved.is_file():
                if resolved not in pages:
                    pages[resolved] = anchors(resolved.read_text(encoding="utf-8"))
                if unquote(anchor) not in pages[resolved]:
                    why = f"no heading of {resolved.relative_to(root.resolve())} has the anchor #{anchor}"
            elif not (resolved.is_file() and re.fullmatch(r"L\d+(?:-L\d+)?", anchor)):
                why = "an anchor into a file that is not markdown"
        if why:
            dead.append(f"{number}: {target}: {why}")
    return dead


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page: Path) -> None:
    """Every relative link of the page names a file or folder of the repository, and its
    anchor a heading of the target page."""
    dead = dead_links(page)
    assert not dead, f"{page.relative_to(ROOT)}: dead links:\n  " + "\n  ".join(dead)


def test_link_checker_finds_dead_links(tmp_path: Path) -> None:
    """The checker on a scratch repository: good links pass, each kind of dead one is named."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "# The page\n\n## Set-up: the `authio` command!\n\n## Set-up: the `authio` command!\n\n"
        "Intro\n=====\n\n```sh\n# not a heading\n```\n<a id=\"custom\"></a>\n", encoding="utf-8")
    (tmp_path / "src.py").write_text("x = 1\n", encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "# Top\n\n"
        "[ok](docs/page.md) [ok](docs/page.md#set-up-the-authio-command) "
        "[ok](docs/page.md#set-up-the-authio-command-1) [ok](docs/page.md#intro) "
        "[ok](docs/page.md#custom) [ok](#top) [ok](docs/) [ok](src.py#L1) ![ok](src.py) "
        "[ok](https://example.com/nowhere) [ok](mailto:a@example.com) `[code](nowhere.md)`\n"
        "[dead](docs/missing.md)\n"
        "[dead](docs/page.md#not-a-heading)\n"
        "[dead](#set-up)\n"
        "[dead](../outside.md)\n"
        "[dead](src.py#intro)\n"
        "[ref]: docs/gone.md\n"
        "```sh\n[in a block](nowhere.md)\n```\n", encoding="utf-8")
    dead = dead_links(tmp_path / "README.md", tmp_path)
    assert [d.split(":")[0] + ":" + d.split(":")[1] for d in dead] == [
        "4: docs/missing.md", "5: docs/page.md#not-a-heading", "6: #set-up", "7: ../outside.md",
        "8: src.py#intro", "9: docs/gone.md"], dead


def test_github_slugs() -> None:
    """GitHub's anchors of some real headings."""
    assert github_slug("Users, organizations and sign-in") == "users-organizations-and-sign-in"
    assert github_slug("The `authio` command") == "the-authio-command"
    assert github_slug("Past one machine: engines sharded by store") == "past-one-machine-engines-sharded-by-store"
    assert github_slug("1. The services serve HTTPS") == "1-the-services-serve-https"
    assert github_slug("Storage: PostgreSQL and Redis") == "storage-postgresql-and-redis"
    assert github_slug("[Linked](x.md) *and* SERVICE_HOST") == "linked-and-service_host"
    assert github_slug("Sign-in with Google, GitHub & Apple") == "sign-in-with-google-github--apple"


# --- settings --------------------------------------------------------------------------------


def setting_variables() -> dict[str, Any]:
    """Each variable ``Settings`` reads, with the field's default."""
    found = {}
    for field in Settings.model_fields.values():
        alias = field.validation_alias
        choices = getattr(alias, "choices", None)
        assert choices, f"a Settings field without its variable: {field}"
        found[str(choices[0])] = field.default
    return found


def environ_reads(root: Path = ROOT) -> set[str]:
    """The variables the service's code reads itself: ``os.environ.get("X")``,
    ``os.environ["X"]``, ``os.getenv("X")`` in common, engine, control_plane and devtools."""
    found: set[str] = set()
    for package in CODE_PACKAGES:
        for path in (root / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                name: ast.expr | None = None
                if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
                    func = ast.unparse(node.func)
                    if func in ("os.environ.get", "os.getenv", "environ.get", "getenv"):
                        name = node.args[0]
                elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("os.environ", "environ"):
                    name = node.slice
                if isinstance(name, ast.Constant) and isinstance(name.value, str):
                    found.add(name.value)
    return found - NOT_SETTINGS


def table_rows(text: str) -> Iterator[tuple[list[str], str]]:
    """Each table row of a page as (the variables named in backticks in its first cell, its
    second cell)."""
    prose, _ = split_fences(text)
    for _, line in prose:
        if not line.startswith("|") or re.match(r"^\|[\s:|-]+\|?\s*$", line):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[0])
        if names and len(cells) > 1:
            yield names, cells[1]


def default_problem(default: Any, cell: str) -> str | None:
    """Why the table cell ``cell`` does not give ``default`` (None: it does, or there is nothing
    to compare: no default)."""
    if default is None:
        return None
    text = cell.replace("`", "")
    if isinstance(default, bool):
        word = "true" if default else "false"
        return None if re.search(rf"\b{word}\b", text, re.IGNORECASE) else f"not {word}"
    if isinstance(default, int | float):
        numbers = re.findall(r"\d+(?:\.\d+)?", re.sub(r"(?<=\d),(?=\d{3})", "", text))
        if not numbers:
            return f"no number (the code's: {default})"
        return None if float(numbers[0]) == float(default) else f"{numbers[0]}, the code's is {default}"
    default = str(default)
    if default == "":
        return None if re.search(r"\b(empty|unset)\b", text) else "not empty/unset, as the code's is"
    if re.search(rf"(?<![\w/]){re.escape(default)}(?![\w/])", text):
        return None
    return f"not {default!r}, the code's"


def settings_problems(page: str, variables: dict[str, Any], read_directly: set[str]) -> list[str]:
    """What the settings page ``page`` gets wrong: a variable of ``variables`` (name: default)
    without a row or with another default, a ``SERVICE_*`` name the service does not read, a
    variable of ``read_directly`` not on the page."""
    problems = []
    rows: dict[str, list[str]] = {}
    for names, cell in table_rows(page):
        parts = [p.strip() for p in cell.split(" / ")]
        for i, name in enumerate(names):
            rows.setdefault(name, []).append(parts[i] if len(parts) == len(names) else cell)
    missing = sorted(set(variables) - set(rows))
    if missing:
        problems.append("no row for " + ", ".join(missing))
    for name, default in variables.items():
        for cell in rows.get(name, []):
            if why := default_problem(default, cell):
                problems.append(f"{name}: the default {cell!r} is {why}")
    unknown = sorted({n for n in re.findall(r"\bSERVICE_[A-Z0-9_]*[A-Z0-9]\b", page)} - set(variables))
    if unknown:
        problems.append("not read by the service: " + ", ".join(unknown))
    absent = sorted(n for n in read_directly if not re.search(rf"(?<![\w]){re.escape(n)}(?![\w])", page))
    if absent:
        problems.append("read by the code but not on the page: " + ", ".join(absent))
    return problems


def test_every_setting_is_documented() -> None:
    """docs/settings.md has a row for every variable of Settings, with the code's default; names
    no ``SERVICE_*`` variable the service does not read; and names every variable the code
    reads itself."""
    problems = settings_problems(SETTINGS_PAGE.read_text(encoding="utf-8"), setting_variables(), environ_reads())
    assert not problems, "docs/settings.md:\n  " + "\n  ".join(problems)


def test_settings_check_finds_gaps() -> None:
    """The check on a made-up page: a missing row, a wrong default, an unknown name and an
    undocumented direct read are each named; a right page passes."""
    variables = {"PORT": 8080, "SERVICE_RATIO": 1.0, "SERVICE_MODE": "on", "SERVICE_FLAG": False,
                 "SERVICE_LIST": "", "SERVICE_OPTIONAL": None, "SERVICE_A": 900, "SERVICE_B": 5}
    good = ("| variable | default | meaning |\n|---|---|---|\n| `PORT` | 8080 | port |\n"
            "| `SERVICE_RATIO` | 1 | r |\n| `SERVICE_MODE` | `on` | m |\n| `SERVICE_FLAG` | `false` | f |\n"
            "| `SERVICE_LIST` | empty | l |\n| `SERVICE_OPTIONAL` | unset | o |\n"
            "| `SERVICE_A` / `SERVICE_B` | 900 / 5 | a, b |\n\n`HOME` is read too.\n")
    assert settings_problems(good, variables, {"HOME"}) == []
    bad = (good.replace("| `PORT` | 8080 | port |\n", "")
           .replace("| 1 | r", "| 0.5 | r").replace("`on`", "`off`").replace("`false`", "`true`")
           .replace("900 / 5", "900 / 6").replace("| empty |", "| `x` |")
           + "`SERVICE_GONE` was removed.\n")
    assert settings_problems(bad, variables, {"HOME", "AUTHIO_X"}) == [
        "no row for PORT",
        "SERVICE_RATIO: the default '0.5' is 0.5, the code's is 1.0",
        "SERVICE_MODE: the default '`off`' is not 'on', the code's",
        "SERVICE_FLAG: the default '`true`' is not false",
        "SERVICE_LIST: the default '`x`' is not empty/unset, as the code's is",
        "SERVICE_B: the default '6' is 6, the code's is 5",
        "not read by the service: SERVICE_GONE",
        "read by the code but not on the page: AUTHIO_X",
    ]


def test_environ_reads_are_found() -> None:
    """The direct reads the page must cover include those known to be in the code."""
    assert {"PORT", "DATABASE_URL", "REDIS_URL", "AUTHIO_API_KEY", "AUTHIO_BASE_URL"} <= environ_reads()


# --- the README's shell blocks ---------------------------------------------------------------

MARKER = "@@authio-docs-check {}@@"


@dataclass
class Expectation:
    """A ``# -> ...`` comment: where it is (``README.md:81``), its text, and the check it
    follows."""

    where: str
    text: str
    check: int


class _Any:
    def __repr__(self) -> str:
        return "..."


ANY = _Any()


@dataclass
class Open:
    """An object or array written with a trailing ``...``: it may hold more."""

    value: dict[str, Any] | list[Any]


@dataclass
class Wild:
    """A string written with ``...`` in it: any text there."""

    pattern: str


class _Parser:
    """A JSON value as the README writes one, with ``...`` for what it leaves out."""

    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def skip(self) -> None:
        while self.at < len(self.text) and self.text[self.at].isspace():
            self.at += 1

    def peek(self, token: str) -> bool:
        self.skip()
        return self.text.startswith(token, self.at)

    def take(self, token: str) -> None:
        if not self.peek(token):
            raise ValueError(f"expected {token!r} at {self.text[self.at:self.at + 20]!r}")
        self.at += len(token)

    def value(self) -> Any:
        if self.peek("..."):
            self.at += 3
            return ANY
        if self.peek("{"):
            return self.container("{", "}")
        if self.peek("["):
            return self.container("[", "]")
        if self.peek('"'):
            m = re.compile(r'"(?:[^"\\]|\\.)*"').match(self.text, self.at)
            if not m:
                raise ValueError("an unterminated string")
            self.at = m.end()
            s = json.loads(m.group(0))
            return Wild(s) if "..." in s else s
        m = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null").match(self.text, self.at)
        if not m:
            raise ValueError(f"no JSON value at {self.text[self.at:self.at + 20]!r}")
        self.at = m.end()
        return json.loads(m.group(0))

    def container(self, start: str, end: str) -> Any:
        self.take(start)
        items: Any = {} if start == "{" else []
        more = False
        while not self.peek(end):
            if self.peek("..."):
                self.at += 3
                more = True
            elif start == "{":
                key = self.value()
                if not isinstance(key, str):
                    raise ValueError("an object key that is not a plain string")
                self.take(":")
                items[key] = self.value()
            else:
                items.append(self.value())
            if not self.peek(end):
                self.take(",")
        self.take(end)
        return Open(items) if more else items


def parse_expected(text: str) -> Any:
    """The object or array a ``# ->`` comment gives (what follows it is a remark). Raises
    ValueError for anything else (``# -> 302 to the redirect_uri`` is not compared)."""
    if not text.lstrip().startswith(("{", "[")):
        raise ValueError(f"not a JSON object or array: {text!r}")
    return _Parser(text).value()


def mismatches(expected: Any, actual: Any, where: str = "$") -> list[str]:
    """How ``actual`` (parsed JSON) differs from ``expected`` (:func:`parse_expected`), one line
    per difference naming its place (``$.resolution_path[1]``)."""
    if expected is ANY:
        return []
    if isinstance(expected, Open) or isinstance(expected, dict | list):
        items = expected.value if isinstance(expected, Open) else expected
        more = isinstance(expected, Open)
        if isinstance(items, dict):
            if not isinstance(actual, dict):
                return [f"{where}: an object expected, got {actual!r}"]
            found = [m for k, v in items.items() for m in (
                mismatches(v, actual[k], f"{where}.{k}") if k in actual else [f"{where}.{k}: missing"])]
            extra = sorted(set(actual) - set(items))
            if extra and not more:
                found.append(f"{where}: unexpected keys {extra}")
            return found
        if not isinstance(actual, list):
            return [f"{where}: an array expected, got {actual!r}"]
        if len(actual) < len(items) or (len(actual) > len(items) and not more):
            return [f"{where}: {len(actual)} items, {len(items)} expected: {actual!r}"]
        return [m for i, v in enumerate(items) for m in mismatches(v, actual[i], f"{where}[{i}]")]
    if isinstance(expected, Wild):
        pattern = ".*".join(re.escape(p) for p in expected.pattern.split("..."))
        if isinstance(actual, str) and re.fullmatch(pattern, actual, re.DOTALL):
            return []
        return [f"{where}: {actual!r} is not {expected.pattern!r}"]
    if type(expected) is not type(actual) and not (
            isinstance(expected, int | float) and isinstance(actual, int | float)
            and not isinstance(actual, bool) and not isinstance(expected, bool)):
        return [f"{where}: {actual!r}, {expected!r} expected"]
    return [] if expected == actual else [f"{where}: {actual!r}, {expected!r} expected"]


def json_values(output: str) -> list[Any]:
    """The JSON objects and arrays printed in ``output``, in order."""
    decoder = json.JSONDecoder()
    found, at = [], 0
    while at < len(output):
        if output[at] in "{[":
            try:
                value, end = decoder.raw_decode(output, at)
            except ValueError:
                at += 1
                continue
            found.append(value)
            at = end
        else:
            at += 1
    return found


def sh_blocks(text: str, page: str = "README.md") -> list[Block]:
    """The ``sh`` (or ``bash``) blocks of ``page``, whose text is ``text``, in order."""
    return [b for b in split_fences(text, page)[1] if b.lang in ("sh", "bash", "shell")]


# curl failing on an HTTP error with the answer's body. The development mailbox is read again
# (for up to 10 s) while it is empty: the outbox worker delivers a message just after the request
# that queued it, before a person types the next command, not always before a script's.
_CURL = """curl() {
  if [[ "$*" == */v1/dev/mailbox* ]]; then
    local out _
    for _ in $(seq 100); do
      out=$(command curl --fail-with-body -sS "$@") || { printf '%s' "$out"; return 22; }
      [[ "$out" == *'"data":[]'* ]] || break
      sleep 0.1
    done
    printf '%s' "$out"
  else
    command curl --fail-with-body -sS "$@"
  fi
}"""


def script(blocks: list[Block], *, token: str, base: str) -> tuple[str, list[Expectation]]:
    """One bash script running ``blocks`` in order: strict (``set -euo pipefail``; ``curl`` as
    :data:`_CURL` has it), ``TOKEN=``/``BASE=`` lines replaced, and a marker line
    printed before each block and before each ``# ->`` comment, so that the output between two
    markers is that of the commands between them. Returns it with the expectations (their text
    continued over the comment lines that follow until its brackets close; the README's
    ``http://127.0.0.1:8080`` and ``http://localhost:8080`` given ``base``'s port)."""
    out = ["set -euo pipefail", _CURL]
    port = base.rpartition(":")[2]
    expectations: list[Expectation] = []
    check = 0

    def mark() -> None:
        nonlocal check
        check += 1
        out.append(f"printf '\\n%s\\n' '{MARKER.format(check)}'")

    for block in blocks:
        mark()
        lines = block.lines
        i = 0
        while i < len(lines):
            line = lines[i]
            if re.match(r"^TOKEN=", line):
                line = f"TOKEN='{token}'"
            elif re.match(r"^BASE=", line):
                line = f"BASE='{base}'"
            elif m := re.match(r"^\s*#\s*->\s*(.*)$", line):
                text, first = m.group(1), i
                while _open_brackets(text) > 0 and i + 1 < len(lines) and lines[i + 1].lstrip().startswith("#"):
                    i += 1
                    text += " " + lines[i].lstrip()[1:].strip()
                mark()
                expectations.append(Expectation(f"{block.page}:{block.line + first}",
                                                re.sub(r"(http://(?:127\.0\.0\.1|localhost)):8080\b",
                                                       rf"\1:{port}", text), check))
            out.append(line)
            i += 1
    mark()
    return "\n".join(out) + "\n", expectations


def _open_brackets(text: str) -> int:
    """How many ``{``/``[`` of ``text`` are still open (outside strings)."""
    depth = 0
    for token in re.findall(r'"(?:[^"\\]|\\.)*"|[{}\[\]]', text):
        depth += {"{": 1, "[": 1, "}": -1, "]": -1}.get(token, 0)
    return depth


def check_output(stdout: str, expectations: list[Expectation]) -> tuple[list[str], int]:
    """Each expectation against the last JSON value printed just before it (between the marker
    before it and the one before that). Returns the failures (naming the README line) and how
    many expectations were compared (a comment that is not a JSON value is not comparable)."""
    parts = re.split(r"\n?@@authio-docs-check (\d+)@@\n", stdout)
    printed = {int(parts[i]): parts[i - 1] for i in range(1, len(parts), 2)}
    failures, compared = [], 0
    for e in expectations:
        try:
            expected = parse_expected(e.text)
        except ValueError:
            continue
        compared += 1
        values = json_values(printed.get(e.check, ""))
        if not values:
            failures.append(f"{e.where}: # -> {e.text}\n    no JSON printed: {printed.get(e.check, '')!r}")
            continue
        if found := mismatches(expected, values[-1]):
            failures.append(f"{e.where}: # -> {e.text}\n    got {json.dumps(values[-1])}\n    "
                            + "\n    ".join(found))
    return failures, compared


def test_output_comparison() -> None:
    """The ``# ->`` comparison: the keys and values given must match, ``...`` leaves room."""
    written = parse_expected('{"written":2,"deleted":0,"revision":1,...}')
    assert mismatches(written, {"written": 2, "deleted": 0, "revision": 1, "store_id": "s"}) == []
    assert mismatches(written, {"written": 2, "deleted": 0, "revision": 2}) == ["$.revision: 2, 1 expected"]
    assert mismatches(written, {"written": 2, "revision": 1}) == ["$.deleted: missing"]
    assert mismatches(written, [1]) == ["$: an object expected, got [1]"]
    closed = parse_expected('{"a":1}')
    assert mismatches(closed, {"a": 1, "b": 2}) == ["$: unexpected keys ['b']"]
    assert mismatches(parse_expected('{"allowed":true,...}'), {"allowed": False}) == [
        "$.allowed: False, True expected"]
    assert mismatches(parse_expected('{"n":1,...}'), {"n": True}) == ["$.n: True, 1 expected"]
    assert mismatches(parse_expected('{"n":1.0}'), {"n": 1}) == []
    check = parse_expected('{"allowed":true,"resolution_path":["a#b@c", "d"],"revision":1,...}')
    assert mismatches(check, {"allowed": True, "resolution_path": ["a#b@c", "d"], "revision": 1}) == []
    assert mismatches(check, {"allowed": True, "resolution_path": ["a#b@c"], "revision": 1}) == [
        "$.resolution_path: 1 items, 2 expected: ['a#b@c']"]
    token = parse_expected('{"token":"scim_...","base_url":"http://x/scim/v2","expires_at":...,"ids":[...]}'
                           '   # or "intent":"scim"')
    actual = {"token": "scim_abc", "base_url": "http://x/scim/v2", "expires_at": 3, "ids": [1, 2]}
    assert mismatches(token, actual) == []
    assert mismatches(token, {**actual, "token": "tok_abc"}) == ["$.token: 'tok_abc' is not 'scim_...'"]
    assert mismatches(parse_expected('["a", ...]'), ["a", "b"]) == []
    assert mismatches(parse_expected('["a", ...]'), ["b"]) == ["$[0]: 'b', 'a' expected"]
    with pytest.raises(ValueError):
        parse_expected("302 to the redirect_uri")


def test_script_checks_each_expectation() -> None:
    """A made-up README block through :func:`script` and :func:`check_output` without a service:
    the outputs are cut at the markers, multi-line comments are read whole, a differing output
    fails naming its line, and the TOKEN/BASE lines are replaced."""
    page = ("```sh\nmake run\n```\n\n```sh\nTOKEN=<the token>\nBASE=http://127.0.0.1:8080\n"
            "echo '{\"n\":1,\"url\":\"http://127.0.0.1:8080/x\"}'\n# -> {\"n\":1,\"url\":\"http://127.0.0.1:8080/x\",...}\n"
            "echo noise; printf '%s' '{\"path\":[\"a\",'; echo '\"b\"]}'\n# -> {\"path\":[\n#      \"a\",\"b\"]}\n"
            "echo '{\"n\":3}'\n# -> {\"n\":2,...}\n# not a continuation\necho '[1]'\n# -> 204 No Content\n```\n")
    blocks = sh_blocks(page)
    text, expectations = script(blocks[1:], token="t0k", base="http://127.0.0.1:9")
    assert "TOKEN='t0k'" in text and "BASE='http://127.0.0.1:9'" in text
    assert [(e.where, e.text) for e in expectations] == [
        ("README.md:9", '{"n":1,"url":"http://127.0.0.1:9/x",...}'), ("README.md:11", '{"path":[ "a","b"]}'),
        ("README.md:14", '{"n":2,...}'), ("README.md:17", "204 No Content")]
    stdout = ("\n@@authio-docs-check 1@@\n" '{"n":1,"url":"http://127.0.0.1:9/x"}\n'
              "\n@@authio-docs-check 2@@\n" 'noise\n{"path":["a","b"]}\n'
              "\n@@authio-docs-check 3@@\n" '{"n":3}\n'
              "\n@@authio-docs-check 4@@\n" "[1]\n" "\n@@authio-docs-check 5@@\n")
    failures, compared = check_output(stdout, expectations)
    assert compared == 3
    assert failures == ['README.md:14: # -> {"n":2,...}\n    got {"n": 3}\n    $.n: 3, 2 expected']
    _, [local] = script(sh_blocks('```sh\necho\n# -> {"a":"http://localhost:8080/p","b":"http://127.0.0.1:80800"}\n```\n'),
                        token="t", base="http://127.0.0.1:9")
    assert local.text == '{"a":"http://localhost:9/p","b":"http://127.0.0.1:80800"}'


def test_readme_first_block_is_the_two_commands() -> None:
    """The README's first ``sh`` block is ``make run`` and ``make test`` (comments aside): what
    ``make test`` is, so it is not run here."""
    first = sh_blocks((ROOT / "README.md").read_text(encoding="utf-8"))[0]
    commands = [line.partition("#")[0].strip() for line in first.lines if line.partition("#")[0].strip()]
    assert commands == ["make run", "make test"], first.lines


@pytest.fixture(scope="module")
def docs_database_url(database_url: str) -> Iterator[str]:
    """A database of this module's own, for its ``authio serve`` (the suite's in-process
    service would otherwise deliver its messages)."""
    with migrated_database(database_url, "docs") as url:
        yield url


async def run_blocks(http: ClientSession, database_url: str, redis_url: str, redis_prefix: str,
                     blocks: list[Block]) -> tuple[list[str], int]:
    """Run ``blocks`` as :func:`script` makes them against an ``authio serve`` of their own on
    ``database_url`` (the bootstrap token set, no other set-up); fails the test when bash does
    not exit 0 within 120 s. Returns :func:`check_output`'s failures and count."""
    debian_packages(["curl"], present=lambda: shutil.which("curl") is not None,
                    needed_by="the README's shell blocks")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "SERVICE_")) and k not in ("PORT", "DATABASE_URL", "REDIS_URL")}
    env.update(DATABASE_URL=database_url, REDIS_URL=redis_url, SERVICE_REDIS_PREFIX=redis_prefix + "docs:",
               SERVICE_BOOTSTRAP_TOKEN=BOOTSTRAP_TOKEN, SERVICE_KMS_KEY=os.environ["SERVICE_KMS_KEY"],
               SERVICE_PG_POOL_MAX="4", OTEL_EXPORTER="none", SERVICE_LOG_LEVEL="WARNING")
    async with serve_process(http, env) as served:
        text, expectations = script(blocks, token=BOOTSTRAP_TOKEN, base=f"http://127.0.0.1:{served.port}")
        shell_env = {k: v for k, v in os.environ.items() if not k.startswith(("SERVICE_", "AUTHIO_"))}
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", text, cwd=ROOT, env=shell_env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            stdout_b, stderr_b = await asyncio.wait_for(proc.communicate(), 120)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            pytest.fail(f"the shell blocks did not end within 120 s: {served.logs()}")
    stdout, stderr = stdout_b.decode(errors="replace"), stderr_b.decode(errors="replace")
    assert proc.returncode == 0, (f"bash exited {proc.returncode}\nstdout:\n{stdout}\nstderr:\n{stderr}\n"
                                  f"service log:\n{served.logs()}")
    return check_output(stdout, expectations)


def readme_blocks() -> list[Block]:
    """The README's ``sh`` blocks after the first (the two commands)."""
    blocks = sh_blocks((ROOT / "README.md").read_text(encoding="utf-8"))[1:]
    assert any(re.match(r"^TOKEN=", line) for b in blocks for line in b.lines), \
        "no README block sets TOKEN= (the Quickstart)"
    return blocks


async def test_readme_shell_blocks_run(http: ClientSession, docs_database_url: str, redis_url: str,
                                       redis_prefix: str) -> None:
    """Every ``sh`` block of the README after the first runs with bash against ``authio serve``,
    and every comparable ``# ->`` comment matches what the commands above it printed."""
    failures, compared = await run_blocks(http, docs_database_url, redis_url, redis_prefix, readme_blocks())
    assert not failures, "a # -> comment differs from the output:\n" + "\n".join(failures)
    assert compared >= 2, f"only {compared} '# ->' comments were compared"


# The walkthrough's blocks on the docs pages that go on from the Quickstart's variables and run
# here (offline, in seconds): the page and a text of the block (its first sh block holding it).
WALKTHROUGH = (("docs/sign-in.md", "# 5. "), ("docs/scim.md", "/scim-token"), ("docs/portal.md", "/v1/portal/links"))


def walkthrough_blocks() -> list[Block]:
    """The :data:`WALKTHROUGH` blocks, in its order; fails naming one no longer found."""
    found = []
    for page, text in WALKTHROUGH:
        blocks = [b for b in sh_blocks((ROOT / page).read_text(encoding="utf-8"), page)
                  if any(text in line for line in b.lines)]
        assert blocks, f"{page}: no sh block holds {text!r} any more (tests/test_docs.py WALKTHROUGH)"
        found.append(blocks[0])
    return found


async def test_walkthrough_blocks_run(http: ClientSession, docs_database_url: str, redis_url: str,
                                      redis_prefix: str) -> None:
    """The walkthrough's runnable blocks on the docs pages, after the Quickstart: users,
    organizations and sign-in by magic link through the development mailbox (steps 5 to 7), a
    SCIM token and an admin portal link; their ``# ->`` comments match the output."""
    failures, compared = await run_blocks(http, docs_database_url, redis_url, redis_prefix,
                                          readme_blocks() + walkthrough_blocks())
    assert not failures, "a # -> comment differs from the output:\n" + "\n".join(failures)
    assert compared >= 5, f"only {compared} '# ->' comments were compared"
