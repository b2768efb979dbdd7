"""Sessions: sign-in completion, organization context, refresh token rotation, revocation, and
the access tokens they hand out (SPEC.md 2, 3)."""
