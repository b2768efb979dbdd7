"""SCIM 2.0 provisioning (RFC 7643/7644): an organization's directory syncs its users and groups."""
