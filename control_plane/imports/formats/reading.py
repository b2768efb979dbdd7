"""Reading export files: gzip-transparent byte and text streams (a UTF-8 BOM dropped), NDJSON
lines and CSV rows streamed record by record, JSON documents read whole, and the sample of a
file's start that ``detect`` classifies (FORMATS.md; EXPECTED.md A7)."""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, cast

import orjson

GZIP_MAGIC: Final = b"\x1f\x8b"
BOM: Final = codecs.BOM_UTF8
HEAD_BYTES: Final = 1 << 20  # what detect reads: a first record of any real export fits
csv.field_size_limit(1 << 26)  # a jsonb metadata cell may exceed the default 128 KiB


@contextmanager
def binary(path: Path) -> Iterator[IO[bytes]]:
    """The file's bytes, through gzip when it starts with the gzip magic (Auth0 downloads are
    ``.csv.gz``/``.json.gz``; the file name is never looked at)."""
    raw = path.open("rb")
    try:
        magic = raw.read(2)
        raw.seek(0)
        stream: IO[bytes] = raw
        if magic == GZIP_MAGIC:
            stream = cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb"))
        yield stream
    finally:
        raw.close()


def read_all(path: Path) -> bytes:
    """The whole (decompressed) content, a leading BOM dropped."""
    with binary(path) as stream:
        data = stream.read()
    return data[len(BOM):] if data.startswith(BOM) else data


def load_document(path: Path) -> Any:
    """The file as one JSON document (read whole, as JSON exports are)."""
    try:
        return orjson.loads(read_all(path))
    except orjson.JSONDecodeError as error:
        raise ValueError(f"not a JSON document: {error}") from error


def json_array(path: Path, key: str | None, what: str) -> Iterator[tuple[int, str, Any]]:
    """(index, "element N [of key]", value) of the users array of a JSON document: the document
    itself (``key`` None) or its member ``key``. Raises ValueError ``not <what>`` when there is
    no such array."""
    document = load_document(path)
    users = document if key is None else (
        document.get(key) if isinstance(document, dict) else None)
    if not isinstance(users, list):
        raise ValueError(f"not {what}")
    where = "" if key is None else f" of {key}"
    return ((i, f"element {i + 1}{where}", u) for i, u in enumerate(users))


def json_lines(path: Path) -> Iterator[tuple[int, str, Any]]:
    """(index, "line N", parsed value or the ValueError) of each non-blank NDJSON line,
    streaming."""
    index = 0
    with binary(path) as stream:
        for number, line in enumerate(stream, 1):
            if number == 1 and line.startswith(BOM):
                line = line[len(BOM):]
            if not line.strip():
                continue
            try:
                value: Any = orjson.loads(line)
            except orjson.JSONDecodeError as error:
                value = ValueError(f"not JSON: {error}")
            yield index, f"line {number}", value
            index += 1


def csv_rows(path: Path) -> Iterator[tuple[int, list[str] | csv.Error]]:
    """(first line number, cells or the csv.Error) of each non-blank CSV row, streaming; quoted
    newlines stay inside their cell."""
    with binary(path) as stream:
        text = io.TextIOWrapper(stream, encoding="utf-8-sig", newline="")
        reader = csv.reader(text, strict=False)
        line = 1
        while True:
            try:
                cells: list[str] | csv.Error = next(reader)
            except StopIteration:
                return
            except csv.Error as error:
                cells = error
            except UnicodeDecodeError as error:
                raise ValueError(f"line {line}: the file is not UTF-8 text: {error}") from error
            if cells:
                yield line, cells
            line = reader.line_num + 1


def header_key(cell: str) -> str:
    """A column name compared case-insensitively: ``Email Verified`` and ``email-verified``
    are ``email_verified``; an OWASP ``'`` prefix is dropped."""
    return cell.strip().lstrip("'").strip().lower().replace(" ", "_").replace("-", "_")


def csv_table(path: Path, cell: Callable[[str], str] = lambda c: c
              ) -> Iterator[tuple[int, str, dict[str, str] | ValueError]]:
    """(index, "line N", {header_key(column): cell}) of each data row of a CSV with a header row.
    Columns are found by name, so extra and reordered columns are fine; a row whose width differs
    from the header's (beyond empty trailing cells) is a ValueError in its place."""
    header: list[str] | None = None
    index = 0
    for line, cells in csv_rows(path):
        if header is None:
            if isinstance(cells, csv.Error):
                raise ValueError(f"line {line}: the header row is not CSV: {cells}")
            header = [header_key(c) for c in cells]
            continue
        where = f"line {line}"
        if isinstance(cells, csv.Error):
            yield index, where, ValueError(f"not CSV: {cells}")
        elif len(cells) < len(header) or any(c.strip() for c in cells[len(header):]):
            yield index, where, ValueError(f"{len(cells)} fields where the header has {len(header)}")
        else:
            record: dict[str, str] = {}
            for name, value in zip(header, cells, strict=False):
                record.setdefault(name, cell(value))
            yield index, where, record
        index += 1



# --- what detect looks at -------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Sample:
    """The start of a file, understood just enough to tell formats apart.

    ``kind`` is ``empty``; ``lines`` (NDJSON: ``first`` = the first line's object); ``array`` (a
    JSON array: ``first`` = its first element, None when empty); ``object`` (a JSON object:
    ``key`` = its first array-valued member, ``first`` = that array's first element); ``text``
    (``rows`` = the first two CSV rows); or ``unreadable`` (starts like JSON but is not).
    """

    kind: str
    first: Any = None
    key: str | None = None
    rows: tuple[list[str], ...] = ()


def sample(path: Path) -> Sample:
    """Read the start of ``path`` (gzip-transparent, BOM dropped) and classify it; a file that is
    not UTF-8 text raises UnicodeDecodeError."""
    with binary(path) as stream:
        head = stream.read(HEAD_BYTES)
        whole = len(stream.read(1)) == 0
    if head.startswith(BOM):
        head = head[len(BOM):]
    text = codecs.getincrementaldecoder("utf-8")().decode(head, final=whole)
    start = len(text) - len(text.lstrip())
    if start == len(text):
        return Sample("empty")
    if text[start] == "{":
        line_end = text.find("\n", start)
        if line_end >= 0 or whole:
            try:
                first = orjson.loads(text[start:line_end if line_end >= 0 else len(text)])
            except orjson.JSONDecodeError:
                first = None
            if isinstance(first, dict) and not _document_like(first):
                return Sample("lines", first=first)
        return _object(path, text, start)
    if text[start] == "[":
        return _array(path, text, start)
    rows = []
    for row in csv.reader(io.StringIO(text, newline=""), strict=False):
        if row:
            rows.append(row)
        if len(rows) == 2:
            break
    return Sample("text", rows=tuple(rows))


DOCUMENT_KEYS: Final = ("users", "Users", "tenants")


def _document_like(value: dict[str, Any]) -> bool:
    return any(isinstance(value.get(k), list) for k in DOCUMENT_KEYS)


_DECODER = json.JSONDecoder()


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


def _array(path: Path, text: str, start: int) -> Sample:
    at = _skip(text, start + 1)
    if at < len(text) and text[at] == "]":
        return Sample("array")
    try:
        return Sample("array", first=_DECODER.raw_decode(text, at)[0])
    except ValueError:  # the head ends inside the first element, or it is not JSON
        pass
    try:
        whole = load_document(path)
    except ValueError:
        return Sample("unreadable")
    if not isinstance(whole, list):
        return Sample("unreadable")
    return Sample("array", first=whole[0] if whole else None)


def _object(path: Path, text: str, start: int) -> Sample:
    try:  # the first member, when it is the array of records: {"users": [ {...}
        key, at = _DECODER.raw_decode(text, _skip(text, start + 1))
        at = _skip(text, at)
        if isinstance(key, str) and text[at] == ":":
            at = _skip(text, at + 1)
            if text[at] == "[":
                at = _skip(text, at + 1)
                if text[at] == "]":
                    return Sample("object", key=key)
                return Sample("object", key=key, first=_DECODER.raw_decode(text, at)[0])
    except (ValueError, IndexError):
        pass
    try:
        whole = load_document(path)
    except ValueError:
        return Sample("unreadable")
    if not isinstance(whole, dict):
        return Sample("unreadable")
    for key, value in whole.items():
        if isinstance(value, list):
            return Sample("object", key=key, first=value[0] if value else None)
    return Sample("object")
