"""Magic links: single-use sign-in, enrollment and invitation links sent by email or SMS, and
the sign-in that redeems them (SPEC.md 1, 3, 4, 5, 7)."""
