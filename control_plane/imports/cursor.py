"""The import's cursor file (SPEC.md 4 "Import tool" rule 1): ``<file>.authio-import.cursor``
beside the export, keyed on (provider, file, size), so a re-run resumes where the last one
stopped and a changed file is noticed.

It holds the resume point ``next_index`` (every record below it is done), the records done
above it (``done_above``: requests finish out of order, at most the run's concurrency of them),
and the tally so far, so the last line of a resumed run counts the whole file. It is replaced
atomically (write, fsync, rename): a kill at any moment leaves the previous or the next
version, never a torn one. A run that reaches the end deletes it, so the next run of the same
file starts over (and finds every user ``existed``)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

SUFFIX: Final = ".authio-import.cursor"
VERSION: Final = 1


class CursorMismatch(Exception):
    """The cursor beside the file was written for another provider, path or size."""


@dataclass(slots=True)
class Cursor:
    """Progress of one import of one file."""

    provider: str
    file: str
    size: int
    next_index: int = 0
    done_above: dict[int, str] = field(default_factory=dict)
    tally: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("created", "existed", "skipped", "errored"), 0))
    reasons: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def is_done(self, index: int) -> bool:
        return index < self.next_index or index in self.done_above


def path_for(file: Path) -> Path:
    return file.with_name(file.name + SUFFIX)


def key_of(provider: str, file: Path) -> tuple[str, str, int]:
    return provider, str(file.resolve()), file.stat().st_size


def load(provider: str, file: Path, *, force: bool) -> Cursor:
    """The cursor of ``file`` (a fresh one when none). Raises CursorMismatch when it was
    written for another (provider, file, size) and not ``force`` (which resumes at its point
    anyway, under the new key); ValueError when it is not a cursor file."""
    provider, name, size = key_of(provider, file)
    path = path_for(file)
    if not path.exists():
        return Cursor(provider, name, size)
    try:
        raw: dict[str, Any] = orjson.loads(path.read_bytes())
        saved = Cursor(raw["provider"], raw["file"], int(raw["size"]), int(raw["next_index"]),
                       {int(k): str(v) for k, v in raw["done_above"].items()},
                       dict(raw["tally"]), dict(raw["reasons"]), list(raw["errors"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        raise ValueError(f"{path} is not an import cursor; delete it to start over") from None
    if (saved.provider, saved.file, saved.size) != (provider, name, size) and not force:
        raise CursorMismatch(
            f"{path} belongs to an import of {saved.file} ({saved.provider}, {saved.size:,} "
            f"bytes), stopped at record {saved.next_index:,}; this is {name} ({provider}, "
            f"{size:,} bytes): the file changed since. Run again with --force to resume at "
            f"record {saved.next_index:,} anyway, or delete the cursor to start over.")
    saved.provider, saved.file, saved.size = provider, name, size
    return saved


def save(file: Path, cursor: Cursor) -> None:
    """Replace the cursor of ``file`` atomically."""
    path = path_for(file)
    tmp = path.with_name(path.name + ".tmp")
    data = asdict(cursor)
    data["done_above"] = {str(k): v for k, v in cursor.done_above.items()}
    data["version"] = VERSION
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(data))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remove(file: Path) -> None:
    path_for(file).unlink(missing_ok=True)
