"""The shard a pod belongs to: the hash (Go's hash/fnv on the same vectors; the apiserver
lane asks Go itself), the slots each of N shards owns, and the selector as the API server
writes it back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deathwatch._operator import sharding

# `go run` of hash/fnv.New64a over these strings (tests/apiserver/test_shards.py runs it live)
GO_FNV1A64 = {
    "": 0xCBF29CE484222325,
    "a": 0xAF63DC4C8601EC8C,
    "foobar": 0x85944171F73967E8,
    "3f1c2a9e-8b7d-4c6e-9f10-2a3b4c5d6e7f": 0x51B7BCB5B376665A,
    "00000000-0000-0000-0000-000000000000": 0x7C384C6218F299F1,
    "ffffffff-ffff-ffff-ffff-ffffffffffff": 0x7718F1B2F3CDD331,
    "team-a": 0xDE90A3717D1252D6,
    "ü": 0x0AC20A07B71807EA,
}


def test_the_hash_is_gos_fnv1a64_and_the_slot_its_top_six_bits() -> None:
    for value, expected in GO_FNV1A64.items():
        assert sharding.fnv1a64(value) == expected, value
    assert sharding.slot_of("3f1c2a9e-8b7d-4c6e-9f10-2a3b4c5d6e7f") == 0x51B7BCB5B376665A >> 58


@pytest.mark.parametrize("shards", [1, 2, 3, 4, 5, 7, 64])
def test_n_shards_partition_the_slots_in_runs(shards: int) -> None:
    owned = [sharding.assign(i, shards) for i in range(shards)]
    assert sorted(s for o in owned for s in o) == list(range(64))  # each slot exactly once
    assert all(len(sharding.runs(o)) == 1 for o in owned)  # one range each: one shardRange()
    assert max(map(len, owned)) - min(map(len, owned)) <= 1
    with pytest.raises(ValueError, match="expected 0 <= shard < shards"):
        sharding.assign(shards, shards)


def test_the_selector_is_what_the_api_server_echoes() -> None:
    assert sharding.selector(range(64)) == ""
    assert sharding.selector(sharding.assign(0, 2)) == (
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"
    )
    assert sharding.selector(sharding.assign(3, 4)) == (
        "shardRange(object.metadata.uid, '0xc000000000000000', '0x10000000000000000')"
    )
    # a reshard's holes: one range per run, joined as the server joins them
    assert sharding.selector({0, 1, 5}) == (
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x0800000000000000') || "
        "shardRange(object.metadata.uid, '0x1400000000000000', '0x1800000000000000')"
    )


@given(st.frozensets(st.integers(0, 63)))
def test_slots_read_back_from_their_description(slots: frozenset[int]) -> None:
    assert sharding.parse(sharding.describe(slots)) == slots


@given(st.uuids())
def test_a_uid_is_in_the_range_of_its_slot(uid: object) -> None:
    text = str(uid)
    slot = sharding.slot_of(text)
    low, high = slot << 58, (slot + 1) << 58
    assert low <= sharding.fnv1a64(text) < high


def test_a_bad_slot_description_names_the_part() -> None:
    with pytest.raises(ValueError, match="'64' is outside 0-63"):
        sharding.parse("0-3,64")
    with pytest.raises(ValueError, match="'x' is not a slot"):
        sharding.parse("x")
