"""The verdicts of pods gone for longer than their DeathWatch's retention, deleted, but for
those a sink is still owed (until the sink's maxAge: then given up, said on the verdict,
counted). The pass's methods, on what it uses (`RetentionPass`); no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog

from deathwatch._api.resources import DeliveryMark, DeliveryOutcome
from deathwatch._operator.delivery.events import event_id
from deathwatch._operator.delivery.outbox import Deliveries, Ended
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.memory.deathwatches import DeathWatches
from deathwatch._operator.memory.records import Records
from deathwatch._operator.passes.delivery_bridge import DeliveryPass
from deathwatch._operator.passes.tail import Tail
from deathwatch._operator.shards.filter import ShardFilter
from deathwatch._operator.writing.desired import LOW, Desired
from deathwatch._operator.writing.writer import Writer

log = structlog.get_logger("deathwatch.controller")


@dataclass(frozen=True, slots=True)
class RetentionPass:
    """What retention uses: the records and their DeathWatches (each one's retention), the
    outboxes (what is still owed), the bridge (an expiry said on its verdict), the shard
    filter, the writer, the metrics, the tail and the clock."""

    records: Records
    deathwatches: DeathWatches
    deliveries: Deliveries
    bridge: DeliveryPass
    shards: ShardFilter
    writer: Writer
    metrics: Metrics
    tail: Tail
    clock: Callable[[], datetime]

    def retire(self) -> int:
        """Delete what retention lets go; returns how many."""
        now = self.clock()
        given_up = self.expire_deliveries(now)
        retired = 0
        for record in self.records.ended_ones():
            track = record.track
            if track is None or record.deleted_at is None or not track.state.terminal:
                continue
            if self.deliveries.owes(record.uid) or record.uid in given_up:
                continue  # still owed (what is owed lives on the verdict), or its Expired
                # mark just wanted: said on the verdict before it goes, at the next round
            rules = self.deathwatches.get(record.deathwatch)
            retention = rules.retention if rules else timedelta(0)
            declared = track.evidence.declared_at if track.evidence else record.deleted_at
            if now < max(record.deleted_at, declared) + retention:
                continue
            if record.persisted:
                self.writer.want(Desired(*record.verdict, delete=record.uid, priority=LOW,
                                         slot=self.shards.slot(record.uid)))  # fmt: skip
            self.tail.forget(record)
            retired += 1
        return retired

    def expire_deliveries(self, now: datetime) -> set[str]:
        """Events owed longer than their sink's maxAge: given up, each said on its verdict."""
        given_up = set()
        for sink, uid, owed in self.deliveries.expired(now):
            given_up.add(uid)
            record = self.records.get(uid)
            if record is None:
                self.deliveries.forget(uid)
                continue
            age = (now - owed.since).total_seconds()
            log.error("event given up: owed longer than its sink's maxAge", sink=sink,
                      namespace=record.namespace, pod=record.name, uid=uid,
                      state=str(owed.state), owed_seconds=round(age))  # fmt: skip
            self.metrics.delivery_events.labels(sink, "expired").inc()
            mark = DeliveryMark(
                sink=sink, id=event_id(uid, owed.state, owed.sequence), sequence=owed.sequence,
                state=owed.state, outcome=DeliveryOutcome.EXPIRED, at=now,
                message=f"owed for {age:.0f}s, past the sink's maxAge",
            )  # fmt: skip
            self.deliveries.sinks[sink].drop(uid)
            if record.track is not None:
                self.bridge.delivered(Ended(uid, mark))
        return given_up
