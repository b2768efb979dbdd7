"""Development tooling: finding or starting PostgreSQL, Redis and the test peers.

``make run`` and ``make test`` use it (``python -m devtools ensure|exec|stop|...``, see
:mod:`devtools.services`); the test suite uses it for private servers it stops and starts and for
installing Debian packages (:func:`apt_install`). :mod:`devtools.webauthn` is the software
WebAuthn authenticator the tests and the bench share.

The services never import this package: ``common``, ``engine`` and ``control_plane`` run
without it, and it is not part of the ``authio`` distribution (pyproject.toml packages only the
services). It installs packages, creates system users and starts servers, none of which belongs
in a production process.
"""

from devtools.apt import apt_install
from devtools.errors import DevServicesError
from devtools.services import (
    DATABASE_NAME,
    ServiceUrls,
    ensure_services,
    remove_private,
    restart_private_pg,
    stop_private,
)

__all__ = [
    "DATABASE_NAME",
    "DevServicesError",
    "ServiceUrls",
    "apt_install",
    "ensure_services",
    "remove_private",
    "restart_private_pg",
    "stop_private",
]
