"""Passkey login challenges of no project yet: the operator console's usernameless sign-in.

Every operator project has the same relying party (the service's own host), so an operator's
passkey is chosen before the console knows which tenant it signs in to. The console's options
(``POST /console/sign-in/passkey``) store their challenge with ``project_id`` null; the verify
(``POST /console/sign-in/passkey/verify``) finds the operator project by the credential's user
handle (the user's id) and only then spends the challenge there (``passkeys.service.sign_in``
with ``open_challenge``). A challenge of no project is a login's, for no user and no step-up;
no other verify accepts it.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-29
"""

from control_plane.migrate import run_sql

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql("""
ALTER TABLE webauthn_challenges
    ALTER COLUMN project_id DROP NOT NULL,
    ADD CONSTRAINT webauthn_challenges_open CHECK (
        project_id IS NOT NULL
        OR (ceremony = 'authentication' AND user_id IS NULL AND step_up_id IS NULL));
""")


def downgrade() -> None:
    run_sql("""
DELETE FROM webauthn_challenges WHERE project_id IS NULL;
ALTER TABLE webauthn_challenges
    DROP CONSTRAINT webauthn_challenges_open,
    ALTER COLUMN project_id SET NOT NULL;
""")
