"""``devtools.apt``: what a person sees while apt-get installs a test peer or a server.

The progress lines are read from apt-get's real output (a transcript of Debian 12's apt-get
installing ``cowsay`` and ``sl``, output to a pipe as the tests see it). The end-to-end tests put
a stand-in ``apt-get`` first on ``PATH``: the real one would change the machine, and what is
tested is ours (reading the output while it comes, the heartbeat, the error, the exit), not
apt's. They need root, as :func:`devtools.apt_install` does (CI runs as root).
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from devtools import DevServicesError, apt_install
from devtools.apt import AptProgress

UPDATE = """\
Get:1 http://deb.debian.org/debian bookworm InRelease [151 kB]
Get:2 http://deb.debian.org/debian bookworm-updates InRelease [55.4 kB]
Get:3 http://deb.debian.org/debian-security bookworm-security InRelease [34.8 kB]
Fetched 241 kB in 0s (621 kB/s)
Reading package lists...
"""

INSTALL = """\
Reading package lists...
Building dependency tree...
Reading state information...
The following additional packages will be installed:
  libtext-charwidth-perl
The following NEW packages will be installed:
  cowsay libtext-charwidth-perl sl
0 upgraded, 3 newly installed, 0 to remove and 126 not upgraded.
Need to get 44.0 kB of archives.
After this operation, 198 kB of additional disk space will be used.
Get:1 http://deb.debian.org/debian bookworm/main amd64 libtext-charwidth-perl amd64 0.04-11 [9496 B]
Get:2 http://deb.debian.org/debian bookworm/main amd64 cowsay all 3.03+dfsg2-8 [21.4 kB]
Get:3 http://deb.debian.org/debian bookworm/main amd64 sl amd64 5.02-1+b1 [13.2 kB]
debconf: delaying package configuration, since apt-utils is not installed
Fetched 44.0 kB in 0s (560 kB/s)
Selecting previously unselected package libtext-charwidth-perl:amd64.
(Reading database ... 5%(Reading database ... 100%(Reading database ... 115040 files and directories \
currently installed.)
Preparing to unpack .../libtext-charwidth-perl_0.04-11_amd64.deb ...
Unpacking libtext-charwidth-perl:amd64 (0.04-11) ...
Selecting previously unselected package cowsay.
Preparing to unpack .../cowsay_3.03+dfsg2-8_all.deb ...
Unpacking cowsay (3.03+dfsg2-8) ...
Selecting previously unselected package sl.
Preparing to unpack .../sl_5.02-1+b1_amd64.deb ...
Unpacking sl (5.02-1+b1) ...
Setting up sl (5.02-1+b1) ...
Setting up libtext-charwidth-perl:amd64 (0.04-11) ...
Setting up cowsay (3.03+dfsg2-8) ...
Processing triggers for man-db (2.11.2-2) ...
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_each_phase_is_said_once_with_the_install_size() -> None:
    said: list[str] = []
    clock = Clock()
    update = AptProgress(said.append, clock=clock)
    for line in UPDATE.splitlines(keepends=True):
        update.feed(line)
    assert said == []  # the package lists' downloads are not phases of an install
    install = AptProgress(said.append, clock=clock)
    for line in INSTALL.splitlines(keepends=True):
        install.feed(line)
    assert said == ["apt-get: downloading 3 packages, 44.0 kB",
                    "apt-get: unpacking 3 packages",
                    "apt-get: setting up 3 packages"]


def test_a_quiet_phase_is_reported_every_heartbeat_with_how_far_it_got() -> None:
    said: list[str] = []
    clock = Clock()
    progress = AptProgress(said.append, heartbeat_s=15, clock=clock)
    lines = INSTALL.splitlines()
    for line in lines[: lines.index("Unpacking cowsay (3.03+dfsg2-8) ...") + 1]:
        progress.feed(line)
    said.clear()
    clock.now += 14
    progress.beat()
    assert said == []
    clock.now += 2
    progress.beat()
    assert said == ["apt-get: unpacking, 2 of 3 packages, 16 s"]
    clock.now += 10
    progress.beat()  # 10 s after the last line said: quiet
    assert len(said) == 1
    clock.now += 5
    progress.beat()
    assert said[-1] == "apt-get: unpacking, 2 of 3 packages, 31 s"


def test_rounds_of_unpacking_and_setting_up_are_said_once_and_counted_across() -> None:
    """dpkg takes a long list in rounds (Debian 12's chromium: unpack 140, set up, unpack the
    rest, set up): each phase is said once, and the heartbeat counts every round."""
    said: list[str] = []
    clock = Clock()
    progress = AptProgress(said.append, heartbeat_s=15, clock=clock)
    progress.feed("0 upgraded, 4 newly installed, 0 to remove and 0 not upgraded.")
    for line in ("Unpacking a (1) ...", "Unpacking b (1) ...", "Setting up a (1) ...",
                 "Setting up b (1) ...", "Unpacking c (1) ..."):
        progress.feed(line)
    clock.now += 15
    progress.beat()
    progress.feed("Unpacking d (1) ...")
    progress.feed("Setting up c (1) ...")
    assert said == ["apt-get: unpacking 4 packages", "apt-get: setting up 4 packages",
                    "apt-get: unpacking, 3 of 4 packages, 15 s"]


def test_upgrades_count_and_an_empty_install_says_so() -> None:
    said: list[str] = []
    progress = AptProgress(said.append, clock=Clock())
    progress.feed("2 upgraded, 5 newly installed, 0 to remove and 0 not upgraded.")
    progress.feed("Need to get 1,234 kB/2,000 kB of archives.")
    progress.feed("Get:1 http://deb.debian.org/debian bookworm/main amd64 a amd64 1 [1 kB]")
    assert said == ["apt-get: downloading 7 packages, 1,234 kB"]
    nothing: list[str] = []
    AptProgress(nothing.append, clock=Clock()).feed(
        "0 upgraded, 0 newly installed, 0 to remove and 126 not upgraded.")
    assert nothing == ["apt-get: nothing to install"]


# --- apt_install end to end, with a stand-in apt-get --------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="apt_install runs only as root")


def _stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    """An ``apt-get`` first on ``PATH`` that runs ``body`` (sh), with the transcripts beside
    it; it records each command line in ``calls``."""
    (tmp_path / "update.txt").write_text(UPDATE)
    (tmp_path / "install.txt").write_text(INSTALL)
    script = tmp_path / "apt-get"
    script.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\ncd {tmp_path}\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


@needs_root
def test_a_silent_apt_get_is_reported_while_it_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = _stand_in(tmp_path, monkeypatch, """\
case "$1" in
  update) cat update.txt ;;
  install) head -n 20 install.txt; sleep 2.5; tail -n +21 install.txt ;;
esac""")
    said: list[str] = []
    apt_install(["cowsay", "sl"], log=said.append, unable="{why} {wanted}", heartbeat_s=1)
    calls = (where / "calls").read_text().splitlines()
    assert calls == ["update", "install -y --no-install-recommends -o DPkg::Lock::Timeout=600 cowsay sl"]
    assert said[0] == "apt-get: updating the package lists"
    assert said[1].startswith("apt-get: updating the package lists: done in ")
    assert said[2] == "apt-get: installing cowsay sl"
    assert said[3] == "apt-get: downloading 3 packages, 44.0 kB"
    assert said[4] == "apt-get: unpacking 3 packages"
    # The 2.5 s of silence after the first package was unpacked is filled at least twice.
    beats = [line for line in said if line.startswith("apt-get: unpacking, 1 of 3 packages, ")]
    assert len(beats) >= 2, said
    assert "apt-get: setting up 3 packages" in said
    assert said[-1].startswith("apt-get: installing cowsay sl: done in ")


@needs_root
def test_a_failure_carries_apt_gets_last_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_in(tmp_path, monkeypatch, """\
case "$1" in
  update) cat update.txt ;;
  install) echo 'E: Unable to locate package no-such-package' >&2; exit 100 ;;
esac""")
    with pytest.raises(DevServicesError) as caught:
        apt_install(["no-such-package"], log=lambda line: None, unable="{why} {wanted}")
    message = str(caught.value)
    assert "apt-get install -y --no-install-recommends" in message
    assert "failed with exit status 100" in message
    assert message.endswith("E: Unable to locate package no-such-package")


@needs_root
def test_a_daemon_holding_the_output_does_not_hold_the_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package's postinst may start a server that inherits apt-get's output; apt_install
    returns once apt-get exits, not when that server closes the pipe."""
    _stand_in(tmp_path, monkeypatch, """\
case "$1" in
  update) cat update.txt ;;
  install) cat install.txt; sleep 60 & echo $! > daemon.pid ;;
esac""")
    began = time.monotonic()
    try:
        apt_install(["cowsay"], log=lambda line: None, unable="{why} {wanted}")
        assert time.monotonic() - began < 10
    finally:
        os.kill(int((tmp_path / "daemon.pid").read_text()), 15)
