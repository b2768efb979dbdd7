"""Organizations of a project, their memberships, and invitations accepted through the invited
person's magic link (SPEC.md 2 slug rule, 3, 4, 6, 7)."""
