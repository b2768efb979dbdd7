"""Tenancy: bootstrap (the first tenant, project and key), the calling key's project, and API
keys (SPEC.md 2, 4 rule 1, 5)."""
