"""The admin portal (issue 23): one-time setup links that open a page where an organization's IT
administrator, who has no account with us, verifies a domain by DNS or connects a directory by
SCIM."""
