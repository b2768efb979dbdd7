"""OAuth and OpenID Connect sign-in (issue 11).

* ``oauth_providers``: a project's configured providers, by name (``google``, ``github``,
  ``microsoft``, ``apple``, or any other name for a generic OpenID Connect provider, which has an
  ``issuer``). The client secret is sealed by the KMS (``control_plane.kms``, bound to the
  project and name), never stored or answered in the clear.
* ``oauth_states``: one row per started authorization (RFC 6749 4.1.1), keyed by the SHA-256 of
  its ``state``; it holds the PKCE ``code_verifier`` (RFC 7636), the OpenID Connect ``nonce``,
  the application's ``redirect_uri`` and the SHA-256 of the browser binding cookie. A callback
  deletes the row it uses (single use); rows past ``expires_at`` are refused and purged.
* ``oauth_identities``: ``(project, provider, issuer, subject) -> user``: how a returning
  sign-in finds its user. A subject is unique only at its issuer (OIDC Core 2), so a generic
  provider configured again with another issuer starts a namespace of its own (``issuer`` is
  ``''`` for the fixed providers, whose issuers do not change). Deleting the user deletes its identities.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from control_plane.migrate import run_sql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql("""
CREATE TABLE oauth_providers (
    project_id            text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name                  text NOT NULL,
    kind                  text NOT NULL CHECK (kind IN ('google', 'github', 'microsoft', 'apple', 'oidc')),
    client_id             text NOT NULL,
    client_secret_sealed  bytea NOT NULL,
    redirect_uris         text[] NOT NULL,
    scopes                text[] NOT NULL,
    issuer                text,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, name)
);

CREATE TABLE oauth_states (
    state_hash     bytea PRIMARY KEY,
    project_id     text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    provider       text NOT NULL,
    redirect_uri   text NOT NULL,
    code_verifier  text NOT NULL,
    nonce          text NOT NULL,
    browser_hash   bytea NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL
);
CREATE INDEX oauth_states_expires ON oauth_states (expires_at);

CREATE TABLE oauth_identities (
    project_id    text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    provider      text NOT NULL,
    issuer        text NOT NULL,
    subject       text NOT NULL,
    user_id       text NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    email         text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, provider, issuer, subject)
);
CREATE INDEX oauth_identities_user ON oauth_identities (user_id);
    """)


def downgrade() -> None:
    run_sql("""
DROP TABLE oauth_identities;
DROP TABLE oauth_states;
DROP TABLE oauth_providers;
    """)
