"""The mailbox a per-destination sign-in limit counts (``magic_links.service.destination_bucket``)."""

from __future__ import annotations

import pytest

from control_plane.magic_links.service import destination_bucket


@pytest.mark.parametrize(("address", "bucket"), [
    ("Ann@Example.com", "ann@example.com"),
    ("ann+1@example.com", "ann@example.com"),
    ("ann+a+b@example.com", "ann@example.com"),
    ("+tag@example.com", "+tag@example.com"),  # no base mailbox to fold into
    ("a.n.n@example.com", "a.n.n@example.com"),  # dots matter outside Gmail
    ("A.n.N+news@GoogleMail.com", "ann@gmail.com"),
    ("...@gmail.com", "...@gmail.com"),
])
def test_email_buckets(address: str, bucket: str) -> None:
    assert destination_bucket("email", address) == bucket


def test_a_phone_number_is_its_own_bucket() -> None:
    assert destination_bucket("sms", "+15555550100") == "+15555550100"
