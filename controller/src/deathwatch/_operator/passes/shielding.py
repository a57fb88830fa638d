"""The firewall agents' coverage Leases, and each live sandbox's Shielded judged again when
its node's claim changes or goes stale with no event (once a tick). The pass's methods, on
what it uses (`ShieldPass`); no I/O (the Leases are read by reads.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from deathwatch._engine.engine import Step
from deathwatch._operator.memory.coverage import Coverage
from deathwatch._operator.memory.deathwatches import DeathWatches
from deathwatch._operator.memory.records import Records
from deathwatch._operator.passes.tail import Tail


@dataclass(frozen=True, slots=True)
class ShieldPass:
    """What the shield pass uses: the agents' coverage (None: no firewall configured), the
    records on each node and their DeathWatches, the tail and the clock."""

    coverage: Coverage | None
    records: Records
    deathwatches: DeathWatches
    tail: Tail
    clock: Callable[[], datetime]

    def on_coverage(self, leases: Iterable[Mapping[str, Any]]) -> int:
        """The Leases as just listed; returns how many nodes claim coverage."""
        if self.coverage is None:
            return 0
        self.coverage.read(leases, self.clock())
        return len(self.coverage.claims)

    def reshield(self) -> None:
        """Judge again the live sandboxes on the nodes whose claim changed or expired (all of
        them when the Leases became readable or unreadable); a verdict is written for each
        shield that changed."""
        if self.coverage is None:
            return
        nodes = self.coverage.changed_nodes()
        if nodes is not None and not nodes:
            return
        records = list(self.records) if nodes is None else self.records.on_nodes(nodes)
        for record in records:
            track = record.track
            rules = self.deathwatches.get(record.deathwatch)
            if track is None or rules is None or not record.persisted:
                continue
            if track.state.terminal and record.shield is not None:
                continue
            record.judged_for = None  # judge it afresh
            shield = self.tail.shield(record, rules)
            if shield != record.shield:
                self.tail.settle(Step(track), record, rules, shield=shield)
