"""OAuth 2.0 and OpenID Connect sign-in: provider configuration, the authorization code flow
with PKCE, and the sign-in it ends in (issue 11)."""
