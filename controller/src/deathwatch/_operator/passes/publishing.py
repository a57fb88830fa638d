"""Each DeathWatch's status, wanted once a second (the writer sends only what changed), and
the gauges; the counts are kept as sandboxes change (summary.py), so this costs the same
with 30 or 30,000 of them. Sharded, each shard writes its part and shard 0 the totals too
(ADR 0025): shard 0 once a second, as one unsharded process; every other shard's counts at
most every PART_EVERY (what it says of itself, its leader and its slots, at once), so three
shards cost 1.4 status writes a second under churn, not 3 (#43). Also what a crash could
have left unannounced (`unannounced_deaths`). The pass's methods, on what it uses
(`StatusPass`); no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

import structlog

from deathwatch._api.resources import (
    DW_PLURAL,
    ConditionStatus,
    DeathWatchKey,
    ShardPart,
    to_document,
)
from deathwatch._engine.verdict import State
from deathwatch._operator.delivery.outbox import Deliveries
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.leadership.rivals import Rivals
from deathwatch._operator.memory.core import Firewall
from deathwatch._operator.memory.deathwatches import DeathWatches
from deathwatch._operator.memory.records import Records
from deathwatch._operator.reporting import deathwatch_status, pod_events
from deathwatch._operator.reporting.pod_events import KubeEvent
from deathwatch._operator.reporting.summary import Summaries
from deathwatch._operator.shards.filter import ShardFilter
from deathwatch._operator.shards.slots import describe as slots_text
from deathwatch._operator.writing.desired import LOW, Desired
from deathwatch._operator.writing.writer import Writer

log = structlog.get_logger("deathwatch.controller")
# Dead verdicts younger than this get their Event re-posted at start and takeover (under the
# API server's default 1 h Event TTL, so an Event that was posted still exists and is a 409)
EVENT_RECONCILE_WINDOW: Final = timedelta(minutes=50)
# a shard other than 0: how often its counts may be written; the totals shard 0 sums from
# them are then right within this and a second
PART_EVERY: Final = timedelta(seconds=5)


@dataclass(frozen=True)
class Liveness:
    """What a DeathWatch's status says beyond the counts: `fresh()`, whether every pod stream
    delivered something lately (None: unknown); `stale_after`, the seconds that takes (for
    the condition's message); `leader()`, who holds the Lease."""

    fresh: Callable[[], bool | None] = lambda: True
    stale_after: float = 60.0
    leader: Callable[[], str | None] = lambda: None


@dataclass(frozen=True, slots=True)
class StatusPass:
    """What status publishing uses: the DeathWatches, their records and counts, the firewall
    as last read, the outboxes (their backlogs), the shard filter (this shard's part), the
    writer, the metrics and the clock."""

    deathwatches: DeathWatches
    records: Records
    summaries: Summaries
    firewall: Firewall
    deliveries: Deliveries
    shards: ShardFilter
    writer: Writer
    metrics: Metrics
    clock: Callable[[], datetime]
    rivals: Rivals | None = None  # other releases sharing what this one holds (ADR 0038)

    def publish(self, liveness: Liveness) -> None:
        """Want the status of every DeathWatch, and set the gauges."""
        now, fresh = self.clock(), liveness.fresh()
        reading = self.firewall.reading
        coverage = reading.coverage()
        leader = liveness.leader()
        keys = list(self.deathwatches)
        backlogs = self.deliveries.backlogs(keys) if self.deliveries else None
        sharded = self.shards.sharded
        conflicts = self.rivals.messages() if self.rivals is not None else None
        for key in keys:
            try:
                conditions = deathwatch_status.deathwatch_conditions(
                    self.deathwatches.conditions.get(key, ()), now,
                    invalid=self.deathwatches.invalid.get(key), fresh=fresh,
                    stale_after=liveness.stale_after, firewall=reading,
                    backlogs=backlogs.get(key, []) if backlogs is not None else None,
                    conflicts=conflicts,
                )  # fmt: skip
                self.deathwatches.conditions[key] = conditions
                if sharded and self.shards.spec.index != 0:
                    # its part only: the whole status (shard 0's to write) is not computed here
                    part = self.own_part(key, leader)
                    if not self.part_due(key, part, now):
                        continue
                    document = {"shards": [to_document(part)]}
                else:
                    rules = self.deathwatches.get(key)
                    generation = rules.generation if rules else None
                    status = deathwatch_status.deathwatch_status(
                        self.summaries[key], coverage, conditions, generation, leader
                    )
                    document = (self.shard_status(key, status, generation, leader) if sharded
                                else to_document(status))  # fmt: skip
            except Exception:
                self.metrics.handler_errors.labels("publish").inc()
                log.exception("deathwatch status not computed", namespace=key[0], deathwatch=key[1])
                continue
            manager = f"deathwatch-shard-{self.shards.spec.index}" if sharded else None
            self.writer.want(Desired(DW_PLURAL, *key, status=document, priority=LOW,
                                     apply_as=manager))  # fmt: skip
        metrics, summaries = self.metrics, self.summaries
        for state in State:
            metrics.tracked.labels(str(state)).set(summaries.states[state])
        if self.firewall.coverage is not None:
            for cs in ConditionStatus:
                metrics.shielded.labels(str(cs)).set(summaries.shields[cs])
        metrics.node_sandboxes.clear()  # a node with none left has no series
        for (node, shielded), count in summaries.nodes.items():
            metrics.node_sandboxes.labels(node, shielded).set(count)
        metrics.write_backlog.set(self.writer.backlog)
        for name, box in self.deliveries.sinks.items():
            oldest = box.oldest()
            metrics.delivery_backlog.labels(name).set(len(box.owed))
            metrics.delivery_oldest.labels(name).set(
                (now - oldest).total_seconds() if oldest is not None else 0.0
            )
            metrics.delivery_unanswered.labels(name).set(box.unanswered)

    def own_part(self, key: DeathWatchKey, leader: str | None) -> ShardPart:
        """This shard's part of the DeathWatch's status."""
        return deathwatch_status.shard_part(self.summaries[key], self.shards.spec.index,
                                    slots_text(self.shards.owned()), leader)  # fmt: skip

    def part_due(self, key: DeathWatchKey, part: ShardPart, now: datetime) -> bool:
        """Whether a shard other than 0 wants its part written now: its first, what it says of
        the shard (its leader, its slots) at once, its counts at most every PART_EVERY. Noted
        when it is."""
        said = self.shards.said.get(key)
        due = (said is None or (said[1].leader, said[1].slots) != (part.leader, part.slots)
               or (said[1] != part and now - said[0] >= PART_EVERY))  # fmt: skip
        if due:
            self.shards.said[key] = (now, part)
        return due

    def shard_status(self, key: DeathWatchKey, whole: Any, generation: int | None,
                     leader: str | None) -> dict[str, Any]:  # fmt: skip
        """Sharded, shard 0: its part of the DeathWatch's status, and the totals of every part
        (and the conditions, computed from what it sees: ADR 0025)."""
        mine = self.own_part(key, leader)
        parts = [*self.shards.parts.get(key, {}).values(), mine]
        return to_document(deathwatch_status.sharded_status(parts, whole.firewall, whole.conditions,
                                                    generation))  # fmt: skip

    def unannounced_deaths(self, window: timedelta = EVENT_RECONCILE_WINDOW) -> list[KubeEvent]:
        """The SandboxDead Event of every Dead verdict declared within `window`: what a crash (or
        a leader losing its lease) between a verdict and its Event could have left unsaid. Older
        ones are left alone: the API server has expired their Events (--event-ttl)."""
        since = self.clock() - window
        out = []
        for record in self.records:
            track = record.track
            if (
                track is not None
                and track.state is State.DEAD
                and track.evidence is not None
                and track.evidence.declared_at >= since
            ):
                out.append(pod_events.dead_event(track))
        return out
