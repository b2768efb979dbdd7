"""Compliance (DESIGN.md "compliance"): data-subject requests, and later incidents and
maintenance windows."""
