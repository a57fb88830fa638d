"""Who owns which slots, across shards and reshards: pure decisions over what the shards'
Leases say (ADR 0025). No I/O: the elector writes this replica's claim on its Lease at every
renewal (`claim_annotations`), a loop reads the others' (`read_claim`), and `handover` says
what to gain and what to give up.

Every shard leader says on its Lease which shard it is (`i/N`), the epoch of its config (the
Helm release's revision: a reshard always comes with a newer one) and the slots it owns now,
i.e. writes. A Lease is *live* while its holder renews it, timed on our clock from when we
saw each renewal (the elector's rule); a released or expired Lease claims nothing.

- A slot this shard is assigned (`assign(i, N)`) is *gained* once no other live Lease claims
  it: an earlier owner has said it gave it up, or let its Lease expire.
- A slot this shard owns is *given up* as soon as a live shard of a newer epoch is assigned
  it. The caller fences first (nothing more is written for the slot), then says so on its
  Lease; only then may the newer shard gain it. So no slot ever has two writers, and each
  write of an earlier owner that was already on the wire meets the term fencing of every
  write (ADR 0011): a newer writer's status moves the resourceVersion past it.
- While neither happens (a slot whose old owner still holds it, or a reshard that left a
  slot to nobody yet), the slot is judged in memory by whoever is assigned it, its writes
  owed, as a standby's are.

A live Lease of the same epoch with another shard count is a misconfiguration (a reshard
whose epoch was not raised): nothing it claims is gained, and it is said on /readyz.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from deathwatch._operator.shards.slots import SLOTS, assign, describe, parse

SHARD, EPOCH, SLOTS_OWNED = "deathwatch.dev/shard", "deathwatch.dev/epoch", "deathwatch.dev/slots"
LEASE_LABEL = "deathwatch.dev/controller-lease"  # every shard's Lease: listed by it
ALL = frozenset(range(SLOTS))


@dataclass(frozen=True, slots=True)
class Spec:
    """This process's place: shard `index` of `count`, configured at `epoch`."""

    index: int = 0
    count: int = 1
    epoch: int = 0

    def __post_init__(self) -> None:
        assign(self.index, self.count)  # raises for a shard outside 0..count-1
        if self.epoch < 0:
            raise ValueError(f"shard epoch {self.epoch}: expected a number >= 0")

    @property
    def slots(self) -> frozenset[int]:
        return assign(self.index, self.count)

    @property
    def sharded(self) -> bool:
        return self.count > 1

    def lease(self, base: str) -> str:
        """Its Lease: the controller's own name for one shard, as today; `base-shard-i`."""
        return base if not self.sharded else f"{base}-shard-{self.index}"

    def term(self, lease_term: int) -> int:
        """The writing term of its Lease's term: unique across the shards' Leases."""
        return lease_term * 64 + self.index if self.sharded else lease_term


@dataclass(frozen=True, slots=True)
class SlotClaim:
    """One shard Lease as last read."""

    lease: str
    holder: str | None
    shard: int
    shards: int
    epoch: int
    owned: frozenset[int]
    live: bool

    @property
    def assigned(self) -> frozenset[int]:
        return assign(self.shard, self.shards)


def claim_annotations(spec: Spec, owned: Iterable[int]) -> dict[str, str]:
    return {SHARD: f"{spec.index}/{spec.count}", EPOCH: str(spec.epoch),
            SLOTS_OWNED: describe(owned)}  # fmt: skip


def read_claim(lease: Mapping[str, Any], live: bool) -> SlotClaim | None:
    """A shard Lease read back (None: not one, or unreadable: it then claims nothing, which a
    live holder corrects at its next renewal)."""
    meta, spec = lease.get("metadata") or {}, lease.get("spec") or {}
    notes = meta.get("annotations") or {}
    try:
        shard_text, _, count_text = str(notes[SHARD]).partition("/")
        shard, shards, epoch = int(shard_text), int(count_text), int(notes[EPOCH])
        owned = parse(str(notes.get(SLOTS_OWNED, "")))
        assign(shard, shards)
    except (KeyError, ValueError):
        return None
    holder = spec.get("holderIdentity") or None
    return SlotClaim(str(meta.get("name", "")), holder, shard, shards, epoch, owned,
                 live and holder is not None)  # fmt: skip


@dataclass(frozen=True)
class Handover:
    gain: frozenset[int]  # assigned, and nobody live claims them: ours from now
    give_up: frozenset[int]  # ours, and a newer epoch's live shard is assigned them
    waiting: Mapping[int, str] = field(default_factory=dict)  # assigned, held by (lease)
    conflict: str | None = None  # a same-epoch Lease with another shard count


def handover(
    spec: Spec, owned: frozenset[int], claims: Iterable[SlotClaim], own_lease: str
) -> Handover:
    others = [c for c in claims if c.live and c.lease != own_lease]
    held: dict[int, str] = {}
    for c in others:
        for s in c.owned:
            held.setdefault(s, c.lease)
    newer = frozenset(s for c in others if c.epoch > spec.epoch for s in c.assigned)
    strays = [c for c in others if c.epoch == spec.epoch and c.shards != spec.count]
    conflict = (
        f"{strays[0].lease} is shard {strays[0].shard}/{strays[0].shards} at the same epoch "
        f"{strays[0].epoch}" if strays else None
    )  # fmt: skip
    contested = frozenset(s for c in strays for s in c.assigned)
    wanted = spec.slots - owned - newer - contested
    gain = frozenset(s for s in wanted if s not in held)
    waiting = {s: held[s] for s in sorted(wanted) if s in held}
    return Handover(gain, owned & newer, waiting, conflict)
