"""The risk engine and step-up (issue 19).

* ``risk_policies``: a project's policy (thresholds on 0 to 100, each signal enabled or not with
  its weight); a project without a row has the documented default (``control_plane.risk``).
* ``risk_decisions``: one row per scored sign-in (``rd_``): every signal evaluated with whether
  it fired, its contribution and its reason, the score, the decision, and the inputs the signals
  saw (address, device, place, counts). ``session_id`` is the session the sign-in started, or
  its step-up did; a deleted user's decisions stay, without the user (SPEC.md 4 rule 2).
* ``step_up_challenges``: a challenged sign-in (``chal_``), waiting for a fresh passkey
  assertion or a step-up magic link of the same user; single use (``status`` leaves ``pending``
  once), and unusable past ``expires_at``. It keeps what the session it ends in needs: the
  sign-in's method and the organization an invitation gave.
* ``risk_known``: what a user's successful sign-ins came from: devices (fingerprints), networks
  and countries. ``risk_last_locations``: where and when the last one happened (impossible
  travel). Both go with the user.
* ``magic_link_tokens`` and ``webauthn_challenges`` may belong to a step-up challenge
  (``step_up_id``; purpose ``step_up`` for a link).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28
"""

from control_plane.migrate import run_sql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql("""
CREATE TABLE risk_policies (
    project_id          text PRIMARY KEY REFERENCES projects (id) ON DELETE CASCADE,
    threshold_challenge integer NOT NULL CHECK (threshold_challenge BETWEEN 0 AND 100),
    threshold_block     integer NOT NULL CHECK (threshold_block BETWEEN 0 AND 100),
    signals             jsonb NOT NULL,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CHECK (threshold_challenge < threshold_block)
);

CREATE TABLE risk_decisions (
    id          text PRIMARY KEY,
    project_id  text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    user_id     text REFERENCES users (id) ON DELETE SET NULL,
    session_id  text,
    method      text NOT NULL,
    score       integer NOT NULL CHECK (score BETWEEN 0 AND 100),
    decision    text NOT NULL CHECK (decision IN ('allow', 'challenge', 'block')),
    signals     jsonb NOT NULL,
    reasons     text[] NOT NULL,
    inputs      jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX risk_decisions_project ON risk_decisions (project_id, id DESC);
CREATE INDEX risk_decisions_user ON risk_decisions (project_id, user_id, id DESC);

CREATE TABLE step_up_challenges (
    id              text PRIMARY KEY,
    project_id      text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    user_id         text NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    decision_id     text NOT NULL REFERENCES risk_decisions (id) ON DELETE CASCADE,
    method          text NOT NULL,
    organization_id text REFERENCES organizations (id) ON DELETE SET NULL,
    status          text NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'satisfied', 'failed')),
    satisfied_by    text CHECK (satisfied_by IN ('passkey', 'magic_link')),
    session_id      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    used_at         timestamptz
);
CREATE INDEX step_up_challenges_user ON step_up_challenges (user_id);
CREATE INDEX step_up_challenges_expiry ON step_up_challenges (expires_at);

CREATE TABLE risk_known (
    user_id    text NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    kind       text NOT NULL CHECK (kind IN ('device', 'network', 'country')),
    value      text NOT NULL,
    first_seen timestamptz NOT NULL DEFAULT now(),
    last_seen  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, kind, value)
);
CREATE INDEX risk_known_last_seen ON risk_known (last_seen);

CREATE TABLE risk_last_locations (
    user_id      text PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
    ip           text,
    country      text,
    city         text,
    latitude     double precision NOT NULL,
    longitude    double precision NOT NULL,
    signed_in_at timestamptz NOT NULL
);

ALTER TABLE magic_link_tokens
    ADD COLUMN step_up_id text REFERENCES step_up_challenges (id) ON DELETE CASCADE,
    DROP CONSTRAINT magic_link_tokens_purpose_check,
    ADD CONSTRAINT magic_link_tokens_purpose_check
        CHECK (purpose IN ('signin', 'enrollment', 'invitation', 'step_up')),
    ADD CONSTRAINT magic_link_tokens_step_up CHECK ((purpose = 'step_up') = (step_up_id IS NOT NULL));
ALTER TABLE webauthn_challenges
    ADD COLUMN step_up_id text REFERENCES step_up_challenges (id) ON DELETE CASCADE;
    """)


def downgrade() -> None:
    run_sql("""
ALTER TABLE webauthn_challenges DROP COLUMN step_up_id;
DELETE FROM magic_link_tokens WHERE purpose = 'step_up';
ALTER TABLE magic_link_tokens
    DROP CONSTRAINT magic_link_tokens_step_up,
    DROP CONSTRAINT magic_link_tokens_purpose_check,
    ADD CONSTRAINT magic_link_tokens_purpose_check
        CHECK (purpose IN ('signin', 'enrollment', 'invitation')),
    DROP COLUMN step_up_id;
DROP TABLE risk_last_locations;
DROP TABLE risk_known;
DROP TABLE step_up_challenges;
DROP TABLE risk_decisions;
DROP TABLE risk_policies;
    """)
