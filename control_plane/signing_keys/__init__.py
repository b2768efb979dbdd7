"""Per-project JWT signing keys: generation (``crypto``, pure), storage, scheduled and manual
rotation (``service``, ``tasks``), the in-memory keyring that signs (``keyring``), and the
public JWKS (``endpoints``). SPEC.md 2 "Access token" and 8, DESIGN.md "signing keys"."""
