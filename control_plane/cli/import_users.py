"""``authio import <provider> --file PATH``: users from another identity provider's export, and
``authio import descope --input PATH``: the multi-tenant importer, which also makes each tenant
an organization and each tenant role a membership (``control_plane.imports.tenants``) (SPEC.md 4
"Import tool"; DESIGN.md "CLI login and import").

Prints a progress bar with rate and ETA on a terminal (standard error), plain progress lines
every few seconds otherwise; then, on standard output, the skip reasons and errors, the note
that organizations are not imported (rule 5; the multi-tenant importer's organizations and
memberships tallies instead), and as the very last line ``created N, existed N, skipped N,
errored N`` (the users). Exit status 0, 1 when anything errored (or the run stopped), 2 for bad
usage (an unknown format, a changed file without ``--force``, no credentials)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any, Final

import aiohttp
import platformdirs
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)

from control_plane.cli.login import Credentials, LoginError, load
from control_plane.imports import cursor as cursors
from control_plane.imports import formats, tenants
from control_plane.imports.client import ImportAborted, ServiceClient, message
from control_plane.imports.run import (
    UsersApi,
    concurrency_for,
    records,
    run,
    summary,
)

PLAIN_EVERY_SECONDS: Final = 5.0
NOT_IMPORTED: Final = (
    "Organizations and connection metadata are not imported (only users are): recreate each "
    "organization with POST /v1/organizations and its members with POST "
    "/v1/organizations/{id}/memberships (docs/imports.md).")


class BarReporter:
    """A rich progress bar on standard error (a terminal)."""

    def __init__(self, total: int) -> None:
        self._bar = Progress(TextColumn("importing"), BarColumn(), MofNCompleteColumn(),
                             TaskProgressColumn(), TextColumn("{task.fields[rate]}/s"),
                             TimeRemainingColumn(), TextColumn("{task.fields[tally]}"),
                             console=None, transient=False, redirect_stdout=False)
        self._task = self._bar.add_task("import", total=total, rate="0", tally="")
        self._started = time.monotonic()
        self._bar.start()

    def advance(self, done: int, tally: dict[str, int]) -> None:
        rate = done / max(1e-3, time.monotonic() - self._started)
        self._bar.update(self._task, completed=done, rate=f"{rate:,.0f}",
                         tally=f"created {tally['created']:,} existed {tally['existed']:,}")

    def note(self, message: str) -> None:
        self._bar.console.print(message)

    def close(self) -> None:
        self._bar.stop()


class PlainReporter:
    """Progress lines on standard error every :data:`PLAIN_EVERY_SECONDS` (not a terminal)."""

    def __init__(self, total: int) -> None:
        self._total, self._started, self._last = total, time.monotonic(), 0.0

    def advance(self, done: int, tally: dict[str, int]) -> None:
        now = time.monotonic()
        if now - self._last < PLAIN_EVERY_SECONDS and done < self._total:
            return
        self._last = now
        rate = done / max(1e-3, now - self._started)
        eta = (self._total - done) / rate if rate > 0 else 0.0
        print(f"progress: {done:,}/{self._total:,} records, {rate:,.0f}/s, about {eta:,.0f} s "
              f"left ({tally['created']:,} created, {tally['existed']:,} existed, "
              f"{tally['skipped']:,} skipped, {tally['errored']:,} errored)",
              file=sys.stderr, flush=True)

    def note(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def live_path(source_project_id: str) -> Path:
    """Where live mode keeps the origin project's export: the user's cache directory."""
    folder = Path(platformdirs.user_cache_dir("authio"))
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in source_project_id)[:100]
    return folder / f"descope-{safe}.json"


async def fetch_live(credentials: Credentials, source_project_id: str, token: str,
                     path: Path) -> None:
    """Live mode (SPEC.md 4 rule 6): hand the origin's management token to the service (sealed
    there, for 24 hours at most), download the origin project's export through it into the
    file ``path`` (mode 0600), and delete the credential whatever happened. A re-run downloads
    again to the same place, so an unchanged origin resumes. Raises LiveError."""
    base = credentials.base_url
    headers = {"Authorization": f"Bearer {credentials.api_key}"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=120),
                                     headers=headers) as http:
        async with http.post(f"{base}/v1/imports/credentials", json={
                "provider": "descope", "source_project_id": source_project_id,
                "token": token}) as r:
            made = await r.json(content_type=None)
            if r.status != 201:
                raise LiveError(f"the service refused the live token ({message(made, r.status)})")
        credential = f"{base}/v1/imports/credentials/{made['id']}"
        try:
            async with http.get(f"{credential}/export") as r:
                if r.status != 200:
                    problem = message(await r.json(content_type=None), r.status)
                    raise LiveError(f"the origin could not be read ({problem})")
                tmp = path.with_name(path.name + ".tmp")
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as f:
                    async for chunk in r.content.iter_chunked(1 << 16):
                        f.write(chunk)
                os.replace(tmp, path)
        except aiohttp.ClientPayloadError:
            raise LiveError("the origin's export was cut short; run the command again") from None
        finally:
            async with http.delete(credential):
                pass


class LiveError(Exception):
    """Live mode could not get the origin's export; the message says why."""


def _fail(message: str, code: int = 2) -> int:
    print(f"authio import: {message}", file=sys.stderr)
    return code


def import_users(provider: str, file: str | None, *, dry_run: bool, rate: float,
                 profile: str | None, force: bool,
                 live: tuple[str, str] | None = None) -> int:
    """The command (module docstring); its exit status. ``live`` is (source project id,
    management token): the file is then downloaded from the origin first."""
    if live is not None:
        try:
            file = str(live_path(live[0]))
            asyncio.run(fetch_live(load(profile), *live, Path(file)))
        except (LiveError, LoginError, aiohttp.ClientError, TimeoutError) as err:
            return _fail(f"live mode: {err}", 2 if isinstance(err, LoginError) else 1)
        print(f"downloaded the origin project {live[0]} to {file}", file=sys.stderr)
    assert file is not None
    path = Path(file)
    if not path.is_file():
        return _fail(f"{file}: no such file")
    if rate <= 0:
        return _fail("--rate-limit-rps must be above 0")
    try:
        fmt = formats.detect(provider, path)
    except formats.UnknownFormat as err:
        return _fail(str(err))
    total = sum(1 for _ in records(fmt, path))
    try:
        cursor = cursors.Cursor(*cursors.key_of(provider, path)) if dry_run else \
            cursors.load(provider, path, force=force)
        credentials = None if dry_run else load(profile)
    except (cursors.CursorMismatch, ValueError, LoginError) as err:
        return _fail(str(err))
    resumed = cursor.next_index
    tty = sys.stderr.isatty()
    reporter: Any = BarReporter(total) if tty else PlainReporter(total)
    print(f"{fmt.name}: {total:,} records" + (", dry run: nothing is sent" if dry_run else "")
          + (f"; resuming at record {resumed + 1:,}" if resumed else ""), file=sys.stderr)

    multi_tenant = provider == tenants.PROVIDER
    extra = tenants.Tally()

    async def go() -> cursors.Cursor:
        concurrency = concurrency_for(rate)
        client = None if credentials is None else ServiceClient(
            credentials.base_url, credentials.api_key, rate=rate, concurrency=concurrency,
            note=reporter.note)
        try:
            orgs = await tenants.organizations(client, formats.tenants(path), extra) \
                if multi_tenant else {}
            done = await run(fmt, path, cursor=cursor,
                             api=None if client is None else UsersApi(client),
                             concurrency=concurrency, reporter=reporter, persist=not dry_run)
            if multi_tenant:
                await tenants.memberships(client, fmt, path, orgs, extra)
            return done
        finally:
            if client is not None:
                await client.close()

    try:
        done = asyncio.run(go())
    except ImportAborted as err:
        reporter.close()
        print(*summary(cursor), sep="\n")
        return _fail(f"{err} (progress kept in {cursors.path_for(path)})", 1)
    except KeyboardInterrupt:
        reporter.close()
        print(*summary(cursor), sep="\n")
        return _fail(f"interrupted; run the same command again to resume (progress kept in "
                     f"{cursors.path_for(path)})", 1)
    reporter.close()
    lines = summary(done)
    print(*lines[:-1], *(extra.lines() if multi_tenant else [NOT_IMPORTED]), lines[-1], sep="\n")
    return 1 if done.tally["errored"] or extra.memberships["errored"] or extra.errors else 0
