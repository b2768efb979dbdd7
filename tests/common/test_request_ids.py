"""Request ids (``common.ids.new_request_id``): the cheap, monotonic ULIDs the envelope gives a
request that came without a usable ``X-Request-Id`` (issue 12, the check path)."""

from __future__ import annotations

import re
import time

from ulid import ULID

from common.ids import encode_ulid, new_request_id

REQ_ID = re.compile(r"^req_[0-9a-hjkmnp-tv-z]{26}$")


def test_request_ids_are_ulids_of_now_unique_and_increasing() -> None:
    before = time.time()
    ids = [new_request_id() for _ in range(50_000)]  # spans several milliseconds
    after = time.time()
    assert all(REQ_ID.match(i) for i in ids)
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    for rid in (ids[0], ids[-1]):  # a real ULID carrying the time it was made
        stamp = ULID.from_str(rid[4:].upper()).timestamp
        assert before - 0.002 <= stamp <= after + 0.002
    # The cached parts spell what a full encoding of the same 128 bits spells.
    rid = new_request_id()
    raw = ((new_request_id.ms << 80) | new_request_id.rand).to_bytes(16, "big")
    assert rid == "req_" + encode_ulid(raw)


def test_a_carry_past_the_cached_part_is_spelled() -> None:
    new_request_id()
    new_request_id.rand = (1 << 20) - 2  # the next increments cross the 20 bits spelled per id
    new_request_id.ms += 10_000  # held in "the same millisecond" (as if the clock went back)
    first, second, third = new_request_id(), new_request_id(), new_request_id()
    assert first < second < third
    assert (first[-4:], second[-4:], third[-4:]) == ("zzzz", "0000", "0001")
    assert first[:14] == second[:14] == third[:14]  # one millisecond's stamp
    randoms = [int(ULID.from_str(rid[4:].upper())) & ((1 << 80) - 1) for rid in (first, second,
                                                                                 third)]
    assert randoms == [(1 << 20) - 1, 1 << 20, (1 << 20) + 1]
    new_request_id.ms = 0  # the next call starts a fresh millisecond
