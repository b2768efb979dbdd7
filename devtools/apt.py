"""Installing Debian packages with ``apt-get``, saying how far it got while it works.

A fresh machine installs PostgreSQL and Redis for ``make run`` and ``make test``, and the tests
install their peers (Chromium, Node.js, nginx, Caddy): minutes on a slow mirror, hundreds of
packages. apt-get's own output is a line per package, and inside a test run it goes where pytest
captures it, so a person watching saw nothing for a minute. :func:`apt_install` reads apt-get's
output and tells ``log`` instead:

* a line when each command starts (``updating the package lists``, ``installing chromium
  chromium-driver``) and one when it ends, with its time;
* a line as each phase of the install starts (``downloading 140 packages, 95.3 MB``,
  ``unpacking 140 packages``, ``setting up 140 packages``);
* while a command runs, a line at least every ``heartbeat_s`` seconds with how far it got
  (``unpacking, 57 of 140 packages, 41 s``).

apt-get's lines themselves are kept (the last :data:`TAIL_LINES`) for the error a failure
raises. Standard library only: ``python -m devtools`` runs before the project is installed.
"""

from __future__ import annotations

import collections
import os
import re
import selectors
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable

from devtools.errors import DevServicesError

__all__ = ["AptProgress", "apt_install"]

HEARTBEAT_S = 15.0
"""Longest silence, in seconds, while apt-get works."""
TIMEOUT_S = 1800.0
"""Longest one apt-get command may take (a slow mirror, a lock held by another apt)."""
TAIL_LINES = 25
"""apt-get's last lines that an error carries."""

Log = Callable[[str], None]

_COUNTS = re.compile(r"^(\d+) upgraded, (\d+) newly installed")
_NEED = re.compile(r"^Need to get (\S+ \S+?)(?:/\S+ \S+)? of archives")
# apt-get's per-package lines (the first word or two of each), and the phase each belongs to.
_PHASES = (("Get:", "downloading"), ("Unpacking ", "unpacking"), ("Setting up ", "setting up"))


class AptProgress:
    """Turns apt-get's output, line by line (:meth:`feed`), into the few lines of the module
    docstring, said through ``log`` with the prefix ``apt-get:``. :meth:`beat` is called often
    (on every line and at least once a second); it speaks when nothing was said for
    ``heartbeat_s``. ``clock`` gives seconds (``time.monotonic``; a test passes its own)."""

    def __init__(self, log: Log, *, heartbeat_s: float = HEARTBEAT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.heartbeat_s, self.clock = log, heartbeat_s, clock
        self.started = self.said = clock()
        self.phase = ""
        self.done: dict[str, int] = {}  # packages through each phase so far
        self.total: int | None = None  # packages to install, once apt-get has said
        self.size = ""  # what it has to download, as apt-get wrote it ("95.3 MB")

    def say(self, line: str) -> None:
        self.said = self.clock()
        self.log(f"apt-get: {line}")

    def feed(self, line: str) -> None:
        """One line of apt-get's output (its newline may be left on)."""
        line = line.strip()
        if (m := _COUNTS.match(line)) is not None:
            self.total = int(m[1]) + int(m[2])
            if self.total == 0:
                self.say("nothing to install")
            return
        if (m := _NEED.match(line)) is not None:
            self.size = m[1]
            return
        for prefix, phase in _PHASES:
            if line.startswith(prefix):
                # dpkg unpacks and sets up a long list in several rounds: each phase is said
                # the first time only, and counted across rounds.
                if phase not in self.done and self.total is not None:
                    size = f", {self.size}" if phase == "downloading" and self.size else ""
                    self.say(f"{phase} {self.total} packages{size}")
                self.phase = phase
                self.done[phase] = self.done.get(phase, 0) + 1
                return

    def beat(self) -> None:
        """Say how far the command got, if nothing was said for ``heartbeat_s``."""
        now = self.clock()
        if now - self.said < self.heartbeat_s:
            return
        elapsed = f"{now - self.started:.0f} s"
        if self.total is not None and self.phase:
            self.say(f"{self.phase}, {self.done[self.phase]} of {self.total} packages, {elapsed}")
        elif self.phase == "downloading":
            self.say(f"still working, {self.done[self.phase]} package lists fetched, {elapsed}")
        else:
            self.say(f"still working, {elapsed}")


def apt_install(packages: list[str], *, log: Log, unable: str,
                heartbeat_s: float = HEARTBEAT_S) -> None:
    """Install the Debian ``packages``: ``apt-get update``, then ``apt-get install -y
    --no-install-recommends``, noninteractive, waiting up to 10 minutes for another apt to
    finish and :data:`TIMEOUT_S` for each command. How far it got is told through ``log`` (see
    the module docstring), a line at least every ``heartbeat_s`` seconds.

    Raises :class:`~devtools.errors.DevServicesError` when apt-get fails or takes too long (with
    its last lines), or with ``unable`` (formatted with ``why`` and ``wanted``) when installing
    is impossible here: not root, or no apt-get.
    """
    wanted = " ".join(packages)
    apt_get = shutil.which("apt-get")
    if os.geteuid() != 0 or apt_get is None:
        why = "not running as root" if os.geteuid() != 0 else "apt-get is not available"
        raise DevServicesError(unable.format(why=why, wanted=wanted))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for what, cmd in (
        ("updating the package lists", [apt_get, "update"]),
        (f"installing {wanted}", [apt_get, "install", "-y", "--no-install-recommends",
                                  "-o", "DPkg::Lock::Timeout=600", *packages]),
    ):
        log(f"apt-get: {what}")
        progress = AptProgress(log, heartbeat_s=heartbeat_s)
        _run(cmd, env, progress)
        log(f"apt-get: {what}: done in {progress.clock() - progress.started:.0f} s")


def _run(cmd: list[str], env: dict[str, str], progress: AptProgress) -> None:
    """Run ``cmd``, feeding its output to ``progress``, which beats while apt-get is quiet."""
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env)
    except OSError as exc:
        raise DevServicesError(f"cannot run {shlex.join(cmd)}: {exc}") from exc
    assert proc.stdout is not None
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    deadline = time.monotonic() + TIMEOUT_S
    pending = b""
    # A daemon that a package's postinst starts may inherit the pipe and hold it open after
    # apt-get exits: reading ends when apt-get has exited and the pipe is quiet, not at its end.
    with proc.stdout as out, selectors.DefaultSelector() as selector:
        selector.register(out, selectors.EVENT_READ)
        while True:
            if not selector.select(timeout=1.0):
                if proc.poll() is not None:
                    break
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    raise DevServicesError(f"{shlex.join(cmd)} did not finish within "
                                           f"{TIMEOUT_S:g} s:\n" + "\n".join(tail))
                progress.beat()
                continue
            chunk = os.read(out.fileno(), 65536)
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace").rstrip()
                tail.append(line)
                progress.feed(line)
            progress.beat()
    if pending:
        tail.append(pending.decode(errors="replace").rstrip())
    status = proc.wait()
    if status != 0:
        raise DevServicesError(f"{shlex.join(cmd)} failed with exit status {status}:\n"
                               + "\n".join(tail))
