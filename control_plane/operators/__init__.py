"""Dashboard operators of a tenant (issue 23) and their operator console at ``/console``."""
