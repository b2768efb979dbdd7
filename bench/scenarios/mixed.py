"""``MixedApplication``: one simulated client doing what an application's traffic does, every
hot path in proportion (tag ``mixed``).

Task weights, per thousand tasks (a task is one request, except a sign-in: send, the mailbox
read and verify; a passkey login: options and verify; an audit listing: up to 4 pages):

| task | weight | what |
|---|---:|---|
| single check | 560 | ``scenarios.checks`` |
| batch check (``AUTHIO_BATCH_SIZE`` checks) | 40 | ``scenarios.checks`` |
| forward auth, session only | 200 | ``scenarios.edge`` |
| forward auth with a permission check | 100 | ``scenarios.edge`` |
| refresh | 40 | ``scenarios.signin`` |
| magic-link sign-in (and sign-out of the previous session) | 15 | ``scenarios.signin`` |
| passkey login | 15 | ``scenarios.passkeys`` |
| audit listing | 15 | ``scenarios.audit`` |
| audit export (``AUTHIO_AUDIT_EXPORT_ROWS``, 10,000) | 1 | ``scenarios.audit`` |
| user created, its webhook fanned out | 14 | ``scenarios.webhooks`` |

So checks dominate (60%), edge validation is next (30%), and at 300 tasks/s there are about 4.5
magic-link sign-ins, 4.5 passkey logins and 4 new users a second. A flow is set up the first time
a user needs it (its sign-in, its passkey, the webhook receiver), so the first seconds carry
those set-up requests, named apart. Settings: those of every scenario above;
``AUTHIO_TASK_RATE`` (tasks/s per simulated user) holds a rate, as ``bench/soak.py`` does.
"""

from __future__ import annotations

from locust import FastHttpUser, tag, task

from scenarios import common
from scenarios.audit import AuditFlow
from scenarios.checks import CheckFlow
from scenarios.edge import EdgeFlow
from scenarios.passkeys import PasskeyFlow
from scenarios.signin import MagicLinkFlow
from scenarios.webhooks import WebhookFlow


class MixedApplication(FastHttpUser):
    """Every hot path in an application's proportions (see the module's table)."""

    weight = 1
    host = common.default_host()
    wait_time = common.wait_time()

    def on_start(self) -> None:
        self._checks: CheckFlow | None = None
        self._edge: EdgeFlow | None = None
        self._signin: MagicLinkFlow | None = None
        self._passkeys: PasskeyFlow | None = None
        self._audit: AuditFlow | None = None
        self._webhooks: WebhookFlow | None = None

    @property
    def checks(self) -> CheckFlow:
        if self._checks is None:
            self._checks = CheckFlow(self.client)
        return self._checks

    @property
    def edge(self) -> EdgeFlow:
        if self._edge is None:
            self._edge = EdgeFlow(self.client)
        return self._edge

    @property
    def signin(self) -> MagicLinkFlow:
        if self._signin is None:
            self._signin = MagicLinkFlow(self.client)
        return self._signin

    @property
    def passkeys(self) -> PasskeyFlow:
        if self._passkeys is None:
            self._passkeys = PasskeyFlow(self.client)
        return self._passkeys

    @property
    def audit(self) -> AuditFlow:
        if self._audit is None:
            self._audit = AuditFlow(self.client)
        return self._audit

    @property
    def webhooks(self) -> WebhookFlow:
        if self._webhooks is None:
            self._webhooks = WebhookFlow(self.client, self.environment, self.host or "")
        return self._webhooks

    @tag("mixed")
    @task(560)
    def check(self) -> None:
        self.checks.check()

    @tag("mixed")
    @task(40)
    def batch_check(self) -> None:
        self.checks.batch_check()

    @tag("mixed")
    @task(200)
    def forward_auth(self) -> None:
        self.edge.forward_auth(with_check=False)

    @tag("mixed")
    @task(100)
    def forward_auth_check(self) -> None:
        self.edge.forward_auth(with_check=True)

    @tag("mixed")
    @task(40)
    def refresh(self) -> None:
        self.signin.refresh_current()

    @tag("mixed")
    @task(15)
    def magic_link_sign_in(self) -> None:
        self.signin.sign_in_again()

    @tag("mixed")
    @task(15)
    def passkey_login(self) -> None:
        self.passkeys.login()

    @tag("mixed")
    @task(15)
    def audit_list(self) -> None:
        self.audit.list_pages()

    @tag("mixed")
    @task(1)
    def audit_export(self) -> None:
        self.audit.export()

    @tag("mixed")
    @task(14)
    def create_user(self) -> None:
        self.webhooks.create_user()
