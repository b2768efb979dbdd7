"""Passkeys (WebAuthn): a project's relying party, its users' credentials, and the challenges of
ceremonies under way.

* ``webauthn_settings``: one row per project that allows passkeys (``PATCH /v1/projects/me``
  ``webauthn``): the relying-party id and name, the origins a response may come from (several,
  for subdomains), and whether user verification is ``preferred`` or ``required``. A project
  without a row refuses passkey calls.
* ``passkeys``: one row per registered credential (``pk_`` id): the credential id and COSE public
  key the authenticator gave, its signature counter (0 for authenticators that do not count,
  such as synced passkeys), transports, AAGUID, backup eligibility and state, the name the user
  gave it, when it was created and last used. A credential id is unique within a project.
* ``webauthn_challenges``: the challenge of each options call, by the SHA-256 of its value (a
  verify finds it by the value in ``clientDataJSON``), with the ceremony it belongs to, the user
  it was issued for (registration always; login when an email named one) and the name a
  registration asked for. A verify deletes the row whatever its outcome (single use); rows that
  no verify spent are purged after they expire (``control_plane.passkeys.tasks``).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from control_plane.migrate import run_sql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql("""
CREATE TABLE webauthn_settings (
    project_id        text PRIMARY KEY REFERENCES projects (id) ON DELETE CASCADE,
    rp_id             text NOT NULL,
    rp_name           text NOT NULL,
    origins           text[] NOT NULL,
    user_verification text NOT NULL CHECK (user_verification IN ('preferred', 'required')),
    updated_at        timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE passkeys (
    id              text PRIMARY KEY,
    project_id      text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    user_id         text NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    credential_id   bytea NOT NULL,
    public_key      bytea NOT NULL,
    sign_count      bigint NOT NULL DEFAULT 0,
    transports      text[] NOT NULL DEFAULT '{}',
    aaguid          uuid NOT NULL,
    backup_eligible boolean NOT NULL,
    backup_state    boolean NOT NULL,
    name            text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_used_at    timestamptz,
    CONSTRAINT passkeys_project_credential UNIQUE (project_id, credential_id)
);
CREATE INDEX passkeys_user ON passkeys (user_id, id);

CREATE TABLE webauthn_challenges (
    challenge_hash    bytea PRIMARY KEY,
    project_id        text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    ceremony          text NOT NULL CHECK (ceremony IN ('registration', 'authentication')),
    user_id           text REFERENCES users (id) ON DELETE CASCADE,
    name              text,
    user_verification text NOT NULL CHECK (user_verification IN ('preferred', 'required')),
    created_at        timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz NOT NULL
);
CREATE INDEX webauthn_challenges_expiry ON webauthn_challenges (expires_at);
""")


def downgrade() -> None:
    run_sql("""
DROP TABLE webauthn_challenges;
DROP TABLE passkeys;
DROP TABLE webauthn_settings;
""")
