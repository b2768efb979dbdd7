"""Webhooks: endpoints subscribed to audit events, signed deliveries with retries (DESIGN.md
"webhooks")."""
