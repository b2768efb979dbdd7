"""``deploy/Dockerfile`` built with Debian's buildah and run: the image's configuration, the
unprivileged user, ``authio migrate`` against a database of this test, both services serving
``/healthz`` and ``/readyz`` on their ports, and the image's health check telling a serving
container from one that serves nothing.

No Docker engine runs on this machine, so the builder is buildah (Debian's package, installed
with mmdebstrap when missing, as the other tests install their peers), as root, with the ``vfs``
storage driver and ``chroot`` isolation (no overlay mounts or user namespaces needed); the
containers share the host's network, so they reach the test's PostgreSQL and Redis on the
loopback address and the test reaches their ports.

The base image is a stand-in. This machine reaches no container registry (only the Python, Debian
and npm package registries): ``buildah from docker.io/library/python:3.11-slim-bookworm`` fails
at once because the registry's name does not resolve ("no such host"). So the test makes the
base ``deploy/Dockerfile`` names, from Debian 12's own packages (mmdebstrap, minbase): CPython
3.11 (``python3``, ``python3-venv``: Debian's build rather than python.org's), ``python`` on the
PATH as the official image has it, and this machine's CA bundle (pip reaches PyPI through it),
and builds the Dockerfile on it with ``--build-arg PYTHON_IMAGE``: every instruction of the
Dockerfile runs as written, the wheel is built and installed with ``constraints.txt`` from PyPI.
The stand-in is kept in buildah's storage between runs, named by a hash of the CA bundle (made
in about 30 s); the image under test is built afresh by each run and removed after it: 72 s to
3.5 minutes here, by how busy the two cores were. The whole module takes 2 to 5 minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from control_plane.migrate import alembic_config
from devtools import DevServicesError
from tests.fixtures.database import DEFAULT_PG, created_database
from tests.fixtures.installs import debian_packages, tell
from tests.fixtures.redis import DEFAULT_REDIS
from tests.fixtures.service import ROOT, free_ports

BUILDAH = ["buildah", "--storage-driver", "vfs"]
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BUILD_TIMEOUT_S = 900
KMS_KEY = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="  # 32 bytes, base64


def buildah(*args: str, timeout: float = 120, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    """Run buildah with ``args``; its output captured, its exit status not checked."""
    return subprocess.run([*BUILDAH, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=env)


CANNOT_RUN = "making mounts private to mount namespace"
"""buildah's refusal to run any container (a ``RUN`` step, ``buildah run``) where ``/`` is not a
mount point of its mount namespace, as inside a plain ``chroot`` (a fresh Debian root made by
debootstrap and entered with chroot, the way the project's newcomer check runs ``make test``):
its chroot isolation remounts ``/`` private, which the kernel refuses there (EINVAL). A machine
or container booted normally has ``/`` as a mount. Issue 24 asks for the image to be built where
a container builder can run and for the reason where none can: the tests then skip with
buildah's own words."""


def checked(done: subprocess.CompletedProcess[str]) -> str:
    """``done``'s standard output, or the test failed with its command and last lines (skipped
    when buildah cannot run containers on this machine at all: :data:`CANNOT_RUN`)."""
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        if CANNOT_RUN in tail:
            said = next(line for line in tail.splitlines() if CANNOT_RUN in line)
            pytest.skip(f"buildah cannot run a container on this machine (/ is not a mount point "
                        f"of its mount namespace): {said}")
        pytest.fail(f"{' '.join(map(str, done.args))} exited {done.returncode}:\n{tail}",
                    pytrace=False)
    return done.stdout


def stand_in_base() -> str:
    """The name of the stand-in for python:3.11-slim-bookworm (module docstring), made when
    missing."""
    digest = hashlib.sha256(CA_BUNDLE.read_bytes()).hexdigest()[:12]
    name = f"localhost/authio-test-python:3.11-slim-bookworm-{digest}"
    if buildah("inspect", "--type", "image", name).returncode == 0:
        return name
    tell("the container image tests: making a stand-in python:3.11-slim-bookworm from Debian 12's "
         "packages (once per machine, about 30 s)")
    with tempfile.TemporaryDirectory(prefix="authio-base-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        checked(subprocess.run(
            ["mmdebstrap", "--variant=minbase", "--mode=root", "--format=tar",
             "--include=python3,python3-venv,ca-certificates", "bookworm", str(rootfs)],
            capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL))
        container = checked(buildah("from", "scratch")).strip()
        try:
            checked(buildah("add", container, str(rootfs), "/", timeout=300))
            checked(buildah("copy", container, str(CA_BUNDLE), str(CA_BUNDLE)))
            checked(buildah("run", "--isolation", "chroot", container, "--",
                            "ln", "-s", "/usr/bin/python3", "/usr/local/bin/python"))
            checked(buildah("config", "--env", "LANG=C.UTF-8",
                            "--env", "PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
                            "--env", f"PIP_CERT={CA_BUNDLE}", "--cmd", "python3", container))
            checked(buildah("commit", container, name, timeout=300))
        finally:
            buildah("rm", container)
    return name


def migrations_head() -> str:
    """The newest migration of the working tree (alembic's head)."""
    from alembic.script import ScriptDirectory

    return str(ScriptDirectory.from_config(alembic_config("postgresql:///unused")).get_current_head())


HEAD_AT_BUILD: dict[str, str] = {}
"""The working tree's migrations head as the image was built, by image name (the tree may gain
a migration while the tests run, from another change in progress)."""


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    """The image of ``deploy/Dockerfile``, built from the working tree; removed afterwards."""
    def present() -> bool:
        return shutil.which("buildah") is not None and shutil.which("mmdebstrap") is not None

    try:
        debian_packages(["buildah", "mmdebstrap"], present=present,
                        needed_by="the container image tests", size="about 60 packages")
    except DevServicesError as exc:
        pytest.fail(str(exc), pytrace=False)
    name = f"localhost/authio-test:{secrets.token_hex(4)}"
    with open(Path(tempfile.gettempdir()) / "authio-image-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one stand-in made at a time
        base = stand_in_base()
    HEAD_AT_BUILD[name] = migrations_head()
    tell("the container image tests: building deploy/Dockerfile with buildah (about 2 minutes)")
    started = time.monotonic()
    checked(buildah("build", "--isolation", "chroot", "--format", "docker", "--pull=never",
                    "--layers=false", "--build-arg", f"PYTHON_IMAGE={base}",
                    "-f", str(ROOT / "deploy" / "Dockerfile"), "-t", name, str(ROOT),
                    timeout=BUILD_TIMEOUT_S))
    tell(f"the container image tests: built in {time.monotonic() - started:.0f} s")
    try:
        yield name
    finally:
        buildah("rmi", "--force", name)


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[str]:
    """A working container of the image (buildah's), removed afterwards: one for the module,
    since each is a whole copy of the image with the vfs driver (seconds on a busy machine). The
    tests write nothing into it."""
    name = checked(buildah("from", "--pull=never", image)).strip()
    try:
        yield name
    finally:
        buildah("rm", name)


def run(container: str, *command: str, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``command`` in ``container`` as the image's user, with ``env`` on top of the image's."""
    flags = [f"--env={k}={v}" for k, v in (env or {}).items()]
    return buildah("run", "--isolation", "chroot", *flags, container, "--", *command,
                   timeout=timeout)


@pytest.fixture(scope="module")
def empty_database() -> Iterator[str]:
    """A database of this module's own, created empty and dropped afterwards."""
    with created_database(os.environ.get("DATABASE_URL", DEFAULT_PG), "image") as url:
        yield url


@pytest.fixture(scope="module")
def migrated_by_the_image(container: str, empty_database: str) -> tuple[str, str]:
    """``empty_database`` after the image's ``authio migrate``; (its URL, the command's output)."""
    done = run(container, "authio", "migrate", env={"DATABASE_URL": empty_database})
    return empty_database, checked(done)


def test_the_image_is_configured_for_both_services(image: str) -> None:
    info: dict[str, Any] = json.loads(checked(buildah("inspect", "--type", "image", image)))
    config = info["Docker"]["config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["authio"] and config["Cmd"] == ["serve"]
    assert set(config["ExposedPorts"]) == {"8080/tcp", "8081/tcp"}
    assert config["Healthcheck"]["Test"] == ["CMD", "python", "/opt/authio/healthcheck.py"]
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["SERVICE_HOST"] == "0.0.0.0" and env["PYTHONUNBUFFERED"] == "1"
    assert env["PATH"].startswith("/opt/authio/bin:")


def test_the_image_holds_the_installed_wheel_only(container: str) -> None:
    done = run(container, "python", "-c", (
        "import importlib.util, os, control_plane, engine;"
        "print(os.getuid(), control_plane.__file__, importlib.util.find_spec('pip') is None,"
        " os.path.exists('/src'), os.path.exists('/wheels'))"))
    uid, where, no_pip, sources, wheels = checked(done).split()
    assert uid == "10001"  # not root
    assert where == "/opt/authio/lib/python3.11/site-packages/control_plane/__init__.py"
    assert (no_pip, sources, wheels) == ("True", "False", "False")
    assert "serve" in checked(run(container, "authio", "--help"))


def test_authio_migrate_in_the_image_brings_a_database_to_the_head(
        image: str, container: str, migrated_by_the_image: tuple[str, str]) -> None:
    url, output = migrated_by_the_image
    assert "migrations applied" in output
    head = checked(run(container, "python", "-c", (
        "from alembic.script import ScriptDirectory;"
        "from control_plane.migrate import alembic_config;"
        "print(ScriptDirectory.from_config(alembic_config('postgresql:///unused'))"
        ".get_current_head())"))).strip()
    assert head == HEAD_AT_BUILD[image]  # the image carries the tree's migrations

    async def version() -> str:
        connection = await asyncpg.connect(url)
        try:
            return str(await connection.fetchval("SELECT version_num FROM alembic_version"))
        finally:
            await connection.close()

    assert asyncio.run(version()) == head


@contextlib.contextmanager
def serving(container: str, command: list[str], env: dict[str, str]) -> Iterator[None]:
    """``command`` running in ``container`` until the block ends, then SIGTERM (buildah passes
    it on), and SIGKILL to the process group this test started if it is still there after 30 s.
    A failure inside the block is told with the command's last lines of output."""
    flags = [f"--env={k}={v}" for k, v in env.items()]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([*BUILDAH, "run", "--isolation", "chroot", *flags, container,
                                 "--", *command], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield
        except BaseException as exc:
            stop(proc)
            log.seek(0)
            tail = "\n".join(log.read().decode(errors="replace").splitlines()[-40:])
            pytest.fail(f"{exc}\n--- {' '.join(command)} in the container said:\n{tail}",
                        pytrace=False)
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to ``proc``, then SIGKILL to its process group after 30 s."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def status(url: str) -> int | None:
    """The status ``url`` answers, None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def wait_for(url: str, want: int, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while (got := status(url)) != want:
        if time.monotonic() > deadline:
            pytest.fail(f"{url} answered {got}, not {want}, within {within:g} s")
        time.sleep(0.2)


@pytest.mark.parametrize("target", ["engine", "control-plane"])
def test_each_service_serves_its_port_and_the_health_check_sees_it(
        container: str, migrated_by_the_image: tuple[str, str], target: str) -> None:
    url, _ = migrated_by_the_image
    port, engine_port = free_ports(2)
    env = {"DATABASE_URL": url, "REDIS_URL": os.environ.get("REDIS_URL", DEFAULT_REDIS),
           "SERVICE_REDIS_PREFIX": f"authio-image-{secrets.token_hex(4)}:",
           "PORT": str(port), "SERVICE_ENGINE_PORT": str(engine_port), "OTEL_EXPORTER": "none",
           "SERVICE_KMS_KEY": KMS_KEY, "SERVICE_BASE_URL": "https://auth.example.com"}
    served = engine_port if target == "engine" else port
    command = ["authio", "serve", target] + (["--workers", "1"] if target == "engine" else [])
    health = ["python", "/opt/authio/healthcheck.py"]
    assert run(container, *health, env=env).returncode == 1  # nothing serves yet
    with serving(container, command, env):
        wait_for(f"http://127.0.0.1:{served}/readyz", 200)
        assert status(f"http://127.0.0.1:{served}/healthz") == 200
        assert status(f"http://127.0.0.1:{port if target == 'engine' else engine_port}/healthz") \
            is None  # the other service's port: one service per container
        checked(run(container, *health, env=env))
    assert run(container, *health, env=env).returncode == 1
