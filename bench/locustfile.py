"""Locust entry point: the scenarios of bench/scenarios/, one module per hot path.

    .venv/bin/python bench/locust_setup.py --host http://127.0.0.1:8080 --bootstrap-token TOKEN
    .venv/bin/locust -f bench/locustfile.py --headless -u 50 -r 10 -t 60s \\
        --host http://127.0.0.1:8080 --tags mixed --html bench/results/mixed.html \\
        --csv bench/results/mixed

| class | module | tags |
|---|---|---|
| ``SingleCheckUser``, ``BatchCheckUser`` | ``scenarios.checks`` | ``single-check``, ``batch-check``, ``checks`` |
| ``ForwardAuthUser`` | ``scenarios.edge`` | ``edge`` |
| ``MagicLinkUser`` | ``scenarios.signin`` | ``magic-link``, ``refresh``, ``signin`` |
| ``PasskeyUser`` | ``scenarios.passkeys`` | ``passkey`` |
| ``AuditUser`` | ``scenarios.audit`` | ``audit-list``, ``audit-export``, ``audit`` |
| ``WebhookFanoutUser`` | ``scenarios.webhooks`` | ``webhooks`` |
| ``MixedApplication`` | ``scenarios.mixed`` | ``mixed`` |

Pick scenarios with ``--tags`` (or by naming classes after the options). A class none of whose
tasks carries a chosen tag is left out of the run altogether (locust 2.47 would still start its
users, each failing with "No tasks defined"). Without ``--tags`` every class runs, by its weight.
Settings: ``scenarios.common`` and each module's docstring; bench/README.md, section 8.
"""

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # devtools.webauthn

from locust import events
from scenarios.audit import AuditUser
from scenarios.checks import BatchCheckUser, SingleCheckUser
from scenarios.edge import ForwardAuthUser
from scenarios.mixed import MixedApplication
from scenarios.passkeys import PasskeyUser
from scenarios.signin import MagicLinkUser
from scenarios.webhooks import WebhookFanoutUser

__all__ = ["AuditUser", "BatchCheckUser", "ForwardAuthUser", "MagicLinkUser", "MixedApplication",
           "PasskeyUser", "SingleCheckUser", "WebhookFanoutUser"]


def _runs(cls: Any, tags: set[str] | None, exclude: set[str] | None) -> bool:
    """Whether ``cls`` keeps a task under ``--tags``/``--exclude-tags`` (locust's rule)."""
    for t in cls.tasks:
        marks = getattr(t, "locust_tag_set", set())
        if (tags is None or marks & tags) and not (exclude and marks & exclude):
            return True
    return False


@events.init.add_listener
def _drop_untagged_classes(environment: Any, **_: Any) -> None:
    """With ``--tags``/``--exclude-tags``, keep only the classes that still have a task."""
    options = environment.parsed_options
    tags = set(getattr(options, "tags", None) or []) or None
    exclude = set(getattr(options, "exclude_tags", None) or []) or None
    if tags is None and exclude is None:
        return
    kept = [cls for cls in environment.user_classes if _runs(cls, tags, exclude)]
    if not kept:
        raise SystemExit(f"no scenario has a task tagged {sorted(tags or [])}")
    environment.user_classes[:] = kept
