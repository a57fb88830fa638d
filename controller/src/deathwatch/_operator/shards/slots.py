"""Which shard judges which pod: pure functions, no I/O (ADR 0025).

A pod's *slot* is the top six bits of FNV-1a-64 of its uid: one of `SLOTS` (64), fixed for
the pod's life, the same hash the API server's sharded list and watch uses (KEP-5866,
apimachinery `pkg/sharding`: `HashField` is FNV-1a-64 as 16 hex digits) and kube-state-metrics
shards on. N shards own contiguous runs of slots (`assign`); a run is one hash range, so a
shard's selector is one `shardRange()` (more, joined with `||`, only while a reshard leaves
it holes). Moving from N to M shards moves only the slots whose run changed.

`selector` writes the `shardSelector` query parameter exactly as the API server echoes it
back in a sharded list's `metadata.shardInfo.selector` (its `String()`), so the echo can be
compared for equality: present and equal, the server filtered; absent (the gate off, an older
server) or different, the same filter runs here (`owns_uid`), and it runs on watch events
anyway, cheaply, against an API server whose replicas' gates differ.
"""

from __future__ import annotations

from collections.abc import Iterable

SLOTS = 64
SLOT_BITS = 6  # 2**6 = SLOTS
SPACE = 1 << 64  # the hash space: [0, 2^64)
FIELD = "object.metadata.uid"
_OFFSET, _PRIME, _MASK = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


def fnv1a64(value: str) -> int:
    """FNV-1a, 64 bits, of the UTF-8 bytes: Go's `hash/fnv.New64a`."""
    h = _OFFSET
    for byte in value.encode():
        h = ((h ^ byte) * _PRIME) & _MASK
    return h


def slot_of(uid: str) -> int:
    return fnv1a64(uid) >> (64 - SLOT_BITS)


def assign(shard: int, shards: int) -> frozenset[int]:
    """The slots shard `shard` of `shards` owns: a contiguous run, the runs of all shards
    partitioning the 64 slots (as even as 64/N allows)."""
    if not 0 <= shard < shards <= SLOTS:
        raise ValueError(f"shard {shard} of {shards}: expected 0 <= shard < shards <= {SLOTS}")
    return frozenset(range(shard * SLOTS // shards, (shard + 1) * SLOTS // shards))


def runs(slots: Iterable[int]) -> list[tuple[int, int]]:
    """Adjacent slots merged: [(first, last + 1), ...], in order."""
    out: list[tuple[int, int]] = []
    for s in sorted(set(slots)):
        if out and out[-1][1] == s:
            out[-1] = (out[-1][0], s + 1)
        else:
            out.append((s, s + 1))
    return out


def _bound(slot: int) -> str:
    value = slot << (64 - SLOT_BITS)
    return "0x10000000000000000" if value == SPACE else f"0x{value:016x}"


def selector(slots: Iterable[int]) -> str:
    """The `shardSelector` for these slots ("" for all of them: no filter at all)."""
    merged = runs(slots)
    if merged == [(0, SLOTS)]:
        return ""
    return " || ".join(f"shardRange({FIELD}, '{_bound(a)}', '{_bound(b)}')" for a, b in merged)


def label_values(slots: Iterable[int]) -> str:
    """The verdict label selector's value set for these slots: `deathwatch.dev/slot in (...)`."""
    return ",".join(str(s) for s in sorted(set(slots)))


def describe(slots: Iterable[int]) -> str:
    """ "0-15,32-39" for logs, Lease annotations and /readyz."""
    return ",".join(f"{a}" if b == a + 1 else f"{a}-{b - 1}" for a, b in runs(slots))


def parse(text: str) -> frozenset[int]:
    """The inverse of `describe`. Raises ValueError naming what is wrong."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        try:
            a, b = int(first), int(last or first)
        except ValueError:
            raise ValueError(f"slots: {part!r} is not a slot or a range of slots") from None
        if not 0 <= a <= b < SLOTS:
            raise ValueError(f"slots: {part!r} is outside 0-{SLOTS - 1}")
        out.update(range(a, b + 1))
    return frozenset(out)
