"""The OAuth tests' provider refuses a Node.js it cannot run on, saying what to install, rather
than failing later at start with an error from inside oidc-provider (issue 18: 9.13.3 on
Debian 12's Node.js 18 ended in ``URL.parse is not a function``). Stand-in ``node`` and ``npm``
scripts first on ``PATH`` play an old Node.js: installing one for real would change the
machine."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from devtools import DevServicesError
from tests.oauth.peers import MIN_NODE_MAJOR, OIDC_PROVIDER_VERSION, ensure_node


def _on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, node_version: str) -> None:
    for name, body in (("node", f"echo {node_version}"), ("npm", "echo 9.2.0")):
        script = tmp_path / name
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_a_node_older_than_the_provider_supports_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _on_path(tmp_path, monkeypatch, "v16.20.2")
    with pytest.raises(DevServicesError) as caught:
        ensure_node()
    assert str(caught.value) == (
        f"the OAuth tests run oidc-provider {OIDC_PROVIDER_VERSION}, which needs Node.js "
        f"{MIN_NODE_MAJOR} or later; {tmp_path / 'node'} is v16.20.2: install a newer nodejs "
        "(Debian 12's is 18)")


def test_debian_12s_node_is_enough(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _on_path(tmp_path, monkeypatch, "v18.20.4")
    assert ensure_node() == str(tmp_path / "node")
