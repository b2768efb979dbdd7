"""Passkeys (WebAuthn): registration for a signed-in user, usernameless or email-first login that
signs in like a magic link, and a user's passkeys (issue 11; DESIGN.md "Paths and shapes")."""
