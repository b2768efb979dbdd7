"""``authio login`` and ``authio logout``: the device authorization grant (RFC 8628) against a
control plane, and the credentials file (DESIGN.md "CLI login and import").

The credentials file is an INI file ``credentials`` in ``platformdirs.user_config_dir("authio")``
(on Linux ``$XDG_CONFIG_HOME/authio/``, else ``~/.config/authio/``), mode 0600, one section per
profile (``default`` unless ``--profile``) holding ``base_url``, ``api_key``, ``project_id`` and
``key_id``. ``AUTHIO_BASE_URL`` and ``AUTHIO_API_KEY`` override it (CI has no file).
"""

from __future__ import annotations

import asyncio
import configparser
import os
import sys
import time
import webbrowser
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import platformdirs

DEFAULT_PROFILE: Final = "default"
DEFAULT_BASE_URL: Final = "http://localhost:8080"
CLIENT_ID: Final = "authio-cli"
GRANT_TYPE: Final = "urn:ietf:params:oauth:grant-type:device_code"
TIMEOUT: Final = aiohttp.ClientTimeout(total=30)


class LoginError(Exception):
    """The login (or logout) did not happen; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """Where the tool talks to and with which key."""

    base_url: str
    api_key: str
    project_id: str | None = None
    key_id: str | None = None


def credentials_path() -> Path:
    return Path(platformdirs.user_config_dir("authio")) / "credentials"


def _read(path: Path) -> configparser.ConfigParser:
    config = configparser.ConfigParser(interpolation=None)
    if path.exists():
        config.read(path, encoding="utf-8")
    return config


def _write(path: Path, config: configparser.ConfigParser) -> None:
    """Replace ``path`` atomically with ``config``, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        config.write(f)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o600)  # an existing .tmp kept its mode through O_CREAT
    os.replace(tmp, path)


def load(profile: str | None) -> Credentials:
    """The credentials of ``profile`` (default ``default``), with ``AUTHIO_BASE_URL`` and
    ``AUTHIO_API_KEY`` taking precedence. Raises LoginError when there is no key."""
    name = profile or DEFAULT_PROFILE
    config = _read(credentials_path())
    section = dict(config[name]) if config.has_section(name) else {}
    env_key = os.environ.get("AUTHIO_API_KEY")
    key = env_key or section.get("api_key")
    if not key:
        again = "" if name == DEFAULT_PROFILE else f" --profile {name}"
        raise LoginError(f"not signed in (profile {name!r}): run `authio login{again}`, or set "
                         "AUTHIO_API_KEY")
    url = os.environ.get("AUTHIO_BASE_URL") or section.get("base_url") or DEFAULT_BASE_URL
    ours = {} if env_key else section  # the file's ids describe the file's key only
    return Credentials(url.rstrip("/"), key, ours.get("project_id"), ours.get("key_id"))


def save(profile: str, credentials: Credentials) -> Path:
    path = credentials_path()
    config = _read(path)
    config[profile] = {k: v for k, v in (
        ("base_url", credentials.base_url), ("api_key", credentials.api_key),
        ("project_id", credentials.project_id), ("key_id", credentials.key_id)) if v}
    _write(path, config)
    return path


def _open_browser(url: str) -> bool:
    """Open ``url`` where a graphical browser can (never a text browser inside the terminal
    the code is printed to)."""
    graphical = sys.platform in ("darwin", "win32") or bool(
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    if not graphical:
        return False
    try:
        return webbrowser.open(url, new=2)
    except webbrowser.Error:
        return False


async def _post(http: aiohttp.ClientSession, url: str, form: dict[str, str]) -> tuple[int, Any]:
    async with http.post(url, data=form, headers={"Accept": "application/json"}) as r:
        try:
            return r.status, await r.json(content_type=None)
        except ValueError:
            raise LoginError(f"{url} answered {r.status} with no JSON: is this an authio "
                             "control plane?") from None


async def device_login(base_url: str, *, open_browser: bool = True,
                       out: Any = sys.stdout) -> Credentials:
    """RFC 8628 from the device's side: ask for a code, print it (and open the page where a
    browser can), then poll at the given interval until approved. Raises LoginError when
    denied, expired or refused."""
    base_url = base_url.rstrip("/")
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        try:
            status, code = await _post(http, f"{base_url}/v1/cli/device/code",
                                       {"client_id": CLIENT_ID})
        except (aiohttp.ClientError, TimeoutError) as err:
            raise LoginError(f"cannot reach {base_url} ({err or type(err).__name__}); is the "
                             "service running? "
                             "(--base-url or AUTHIO_BASE_URL names another)") from None
        if status != 200:
            raise LoginError(f"{base_url} refused to start a login ({status}: {code})")
        print(f"To approve this device, open {code['verification_uri']}\n"
              f"and enter the code {code['user_code']}\n"
              f"(or open {code['verification_uri_complete']})", file=out, flush=True)
        if open_browser and _open_browser(code["verification_uri_complete"]):
            print("Opened it in your browser.", file=out, flush=True)
        interval, deadline = int(code["interval"]), time.monotonic() + int(code["expires_in"])
        form = {"grant_type": GRANT_TYPE, "device_code": code["device_code"],
                "client_id": CLIENT_ID}
        while True:
            await asyncio.sleep(interval)
            try:
                status, answer = await _post(http, f"{base_url}/v1/cli/device/token", form)
            except (aiohttp.ClientError, TimeoutError):
                if time.monotonic() > deadline:
                    raise LoginError("the code expired while the service was unreachable; "
                                     "run login again") from None
                continue  # a network failure: poll again at the interval
            if status == 200:
                return Credentials(base_url, answer["access_token"], answer["project_id"],
                                   answer["key_id"])
            error = answer.get("error") if isinstance(answer, dict) else None
            if error == "authorization_pending":
                continue
            if error == "slow_down":
                interval += 5  # RFC 8628 3.5
                continue
            if error == "access_denied":
                raise LoginError("the login was denied on the approval page")
            if error == "expired_token":
                raise LoginError("the code expired before it was approved; run login again")
            if status >= 500 or status == 429:
                continue
            raise LoginError(f"the login failed ({status}: {answer})")


async def revoke(credentials: Credentials) -> bool:
    """Revoke the profile's key on the service (a key may always revoke itself); whether the
    service confirmed it."""
    if not credentials.key_id:
        return False
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http, http.delete(
            f"{credentials.base_url}/v1/api-keys/{credentials.key_id}",
            headers={"Authorization": f"Bearer {credentials.api_key}"}) as r:
        return r.status == 200 or r.status == 401  # 401: already revoked


def login(profile: str | None, base_url: str | None, *, open_browser: bool = True) -> int:
    """``authio login``: exit code 0 when signed in, 1 otherwise."""
    name = profile or DEFAULT_PROFILE
    url = base_url or os.environ.get("AUTHIO_BASE_URL") or DEFAULT_BASE_URL
    try:
        credentials = asyncio.run(device_login(url, open_browser=open_browser))
    except LoginError as err:
        print(f"authio login: {err}", file=sys.stderr)
        return 1
    path = save(name, credentials)
    print(f"Signed in to project {credentials.project_id} with key {credentials.key_id} "
          f"(profile {name!r}, saved in {path}).")
    return 0


def logout(profile: str | None) -> int:
    """``authio logout``: revoke the profile's key and remove the profile; exit code 0, or 1
    when there was nothing to remove."""
    name = profile or DEFAULT_PROFILE
    path = credentials_path()
    config = _read(path)
    if not config.has_section(name):
        print(f"authio logout: no profile {name!r} in {path}", file=sys.stderr)
        return 1
    section = config[name]
    credentials = Credentials(section.get("base_url", DEFAULT_BASE_URL), section.get("api_key", ""),
                              section.get("project_id"), section.get("key_id"))
    try:
        revoked = asyncio.run(revoke(credentials))
    except (aiohttp.ClientError, TimeoutError) as err:
        revoked = False
        print(f"could not reach {credentials.base_url} to revoke the key ({err})", file=sys.stderr)
    config.remove_section(name)
    _write(path, config)
    print(f"Signed out of profile {name!r}" + (
        f"; key {credentials.key_id} revoked." if revoked else
        f"; revoke key {credentials.key_id} yourself (DELETE /v1/api-keys/{{id}})."))
    return 0
