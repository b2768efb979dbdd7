"""Compliance (DESIGN.md "compliance"): data-subject requests, incidents with their notification
deadlines, and maintenance windows."""
