"""Users of a project: create (idempotent on the email), list, show, update, delete (SPEC.md 2
"User", 4 rule 5)."""
