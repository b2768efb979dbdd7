"""The admin portal (issue 23; SPEC.md 3, 5 rule 7 and 7: ``token_consumed``, ``token_expired``,
``token_invalid_or_expired``) and the domains an organization verified through it.

``portal_links`` (``plk_``): a one-time setup link an application made for one organization and
one ``intent`` (``scim`` or ``domain_verification``). Only the SHA-256 of its token is kept
(``token_hash``); opening the link consumes it in one statement (``consumed_at``) and starts the
portal session bound to it: the SHA-256 of the session token (``session_hash``) and its end
(``session_expires_at``). A link is consumed exactly when it has a session. Links go with their
organization; housekeeping deletes them a day after their token or session ended.

``organization_domains``: a domain an organization claimed (``challenge``: the TXT record value
proving control, random) and, once the record was found, ``verified_at``. A domain is verified by
one organization of a project at most (``organization_domains_verified``); several may claim it
meanwhile, each with its own challenge.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-29
"""

from control_plane.migrate import run_sql

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql("""
CREATE TABLE portal_links (
    id                  text PRIMARY KEY,
    project_id          text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    organization_id     text NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    intent              text NOT NULL CHECK (intent IN ('scim', 'domain_verification')),
    token_hash          bytea NOT NULL UNIQUE,
    expires_at          timestamptz NOT NULL,
    consumed_at         timestamptz,
    session_hash        bytea UNIQUE,
    session_expires_at  timestamptz,
    created_by          text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    CHECK ((consumed_at IS NULL) = (session_hash IS NULL)),
    CHECK ((session_hash IS NULL) = (session_expires_at IS NULL))
);
CREATE INDEX portal_links_organization ON portal_links (organization_id);
CREATE INDEX portal_links_ended ON portal_links (coalesce(session_expires_at, expires_at));

CREATE TABLE organization_domains (
    organization_id  text NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    domain           text NOT NULL,
    project_id       text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    challenge        text NOT NULL,
    verified_at      timestamptz,
    checked_at       timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, domain)
);
CREATE UNIQUE INDEX organization_domains_verified ON organization_domains (project_id, domain)
    WHERE verified_at IS NOT NULL;
    """)


def downgrade() -> None:
    run_sql("""
DROP TABLE organization_domains;
DROP TABLE portal_links;
    """)
