"""Which sandboxes this process judges (ADR 0025), asked by every pass: its slots, what its
leader writes now, and the other shards' parts of each DeathWatch's status."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from deathwatch._api.resources import ShardPart
from deathwatch._operator.shards.slot_claims import Spec
from deathwatch._operator.shards.slots import slot_of


@dataclass
class ShardFilter:
    """Which sandboxes this process judges (ADR 0025): with one shard, all of them; sharded,
    the pods whose uid falls in its slots. `owned()` says which of those its leader writes
    now. It holds the shards' parts of each DeathWatch's status; what it drops is counted by
    the tail (`Tail.mine`), where a pass asks (the API server filters the pod watch where it
    can; this runs anyway)."""

    spec: Spec = field(default_factory=Spec)
    owned: Callable[[], frozenset[int]] = lambda: frozenset(range(64))
    # the other shards' parts of each DeathWatch's status, as they wrote them (shard 0 sums)
    parts: dict[tuple[str, str], dict[int, ShardPart]] = field(default_factory=dict)
    # this shard's own part of each, as it last wanted it written, and when (publishing.py)
    said: dict[tuple[str, str], tuple[datetime, ShardPart]] = field(default_factory=dict)

    @property
    def assigned(self) -> frozenset[int] | None:
        """Its slots; None with one shard (every slot, no filter)."""
        return self.spec.slots if self.spec.sharded else None

    @property
    def sharded(self) -> bool:
        return self.spec.sharded

    def mine(self, uid: str | None) -> bool:
        assigned = self.assigned
        return assigned is None or (bool(uid) and slot_of(uid or "") in assigned)

    def slot(self, uid: str) -> int | None:
        """Its slot when sharded (its verdicts carry it as a label), else None."""
        return slot_of(uid) if self.spec.sharded else None
