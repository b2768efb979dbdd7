"""SCIM 2.0 provisioning (issue 23; DESIGN.md "admin portal, SCIM, recovery, operators"; events
``scim.user.synced``, ``scim.group.synced``).

* ``scim_tokens``: one per organization (minting another replaces it in place, so the previous
  token stops at once). ``token_hash`` (SHA-256) finds the caller; the token itself is kept
  envelope-encrypted (``token_sealed``, bound to the token's ``sct_`` id; SPEC.md 1). ``store_id``
  names the store whose tuples the organization's groups write (``group:<grp_ id>#member@
  user:<user_ id>``), or none.
* ``scim_users``: what the directory said of a member (``userName``, ``externalId`` and the
  rest of the SCIM resource as given, without ``id``, ``meta`` and ``active``, which come from the
  user and the membership). The row goes with the membership: deleting the membership (or its
  user, or its organization) deletes it. A member without a row is in the SCIM view too, with
  its e-mail address as ``userName``.
* ``scim_groups`` (``grp_``) and ``scim_group_members``: the organization's directory groups
  and their members, who are members of the organization (a membership's removal removes them
  from its groups), each with the ``display`` the directory gave it, if any.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-29
"""

from control_plane.migrate import run_sql

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql("""
CREATE TABLE scim_tokens (
    organization_id text PRIMARY KEY REFERENCES organizations (id) ON DELETE CASCADE,
    id              text NOT NULL UNIQUE,
    project_id      text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    token_hash      bytea NOT NULL UNIQUE,
    token_sealed    bytea NOT NULL,
    store_id        text REFERENCES stores (id) ON DELETE SET NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE scim_users (
    organization_id text NOT NULL,
    user_id         text NOT NULL,
    user_name       text NOT NULL,
    external_id     text,
    resource        jsonb NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, user_id),
    FOREIGN KEY (organization_id, user_id)
        REFERENCES memberships (organization_id, user_id) ON DELETE CASCADE
);
CREATE UNIQUE INDEX scim_users_user_name ON scim_users (organization_id, lower(user_name));

CREATE TABLE scim_groups (
    id              text PRIMARY KEY,
    project_id      text NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    organization_id text NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    display_name    text NOT NULL,
    external_id     text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX scim_groups_display_name ON scim_groups (organization_id, lower(display_name));
CREATE INDEX scim_groups_org ON scim_groups (organization_id, id);

CREATE TABLE scim_group_members (
    group_id        text NOT NULL REFERENCES scim_groups (id) ON DELETE CASCADE,
    organization_id text NOT NULL,
    user_id         text NOT NULL,
    display         text,
    PRIMARY KEY (group_id, user_id),
    FOREIGN KEY (organization_id, user_id)
        REFERENCES memberships (organization_id, user_id) ON DELETE CASCADE
);
CREATE INDEX scim_group_members_user ON scim_group_members (organization_id, user_id);
    """)


def downgrade() -> None:
    run_sql("""
DROP TABLE scim_group_members;
DROP TABLE scim_groups;
DROP TABLE scim_users;
DROP TABLE scim_tokens;
    """)
