"""Device authorizations of ``authio login`` (issue 22; RFC 8628, DESIGN.md "CLI login and
import").

``device_authorizations`` (``devauth_``): one device authorization request. The CLI holds the
``device_code`` (stored as its SHA-256, ``device_code_hash``: a leaked table grants nothing);
the operator types the ``user_code`` (8 letters of RFC 8628 section 6.1's consonant alphabet,
stored without the hyphen shown) on the approval page. ``status`` goes ``pending``, then
``approved`` (``project_id``, ``scopes`` and the approving key ``approved_by_key_id`` are set) or
``denied``, and an approved one ``redeemed`` once the CLI's poll received its new key
(``key_id``); nothing else moves it. ``interval_seconds`` is the polling interval the CLI was
given, raised by 5 s at each ``slow_down`` (section 3.5), ``last_polled_at`` what that is
measured from. Rows past ``expires_at`` answer ``expired_token`` and are purged a day later.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29
"""

from control_plane.migrate import run_sql

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql("""
CREATE TABLE device_authorizations (
    id                  text PRIMARY KEY,
    device_code_hash    bytea NOT NULL UNIQUE,
    user_code           text NOT NULL UNIQUE,
    client_id           text NOT NULL,
    status              text NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'approved', 'denied', 'redeemed')),
    requested_scopes    text[],
    project_id          text REFERENCES projects (id) ON DELETE CASCADE,
    scopes              text[],
    approved_by_key_id  text,
    key_id              text,
    interval_seconds    integer NOT NULL,
    last_polled_at      timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    expires_at          timestamptz NOT NULL,
    decided_at          timestamptz,
    redeemed_at         timestamptz,
    CHECK ((status = 'pending') = (decided_at IS NULL)),
    CHECK (status NOT IN ('approved', 'redeemed') OR project_id IS NOT NULL),
    CHECK ((status = 'redeemed') = (key_id IS NOT NULL))
);
CREATE INDEX device_authorizations_expires ON device_authorizations (expires_at);
    """)


def downgrade() -> None:
    run_sql("DROP TABLE device_authorizations;")
