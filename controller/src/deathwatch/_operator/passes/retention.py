"""The verdicts of pods gone for longer than their DeathWatch's retention, deleted, but for
those a sink is still owed (until the sink's maxAge: then given up, said on the verdict,
counted). Free functions on the Core; no I/O.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import structlog

from deathwatch._api.resources import DeliveryMark, DeliveryOutcome
from deathwatch._operator.delivery.events import event_id
from deathwatch._operator.delivery.outbox import Ended
from deathwatch._operator.memory.core import Core
from deathwatch._operator.passes.delivery_bridge import delivered
from deathwatch._operator.writing.writer import LOW, Desired

log = structlog.get_logger("deathwatch.controller")


def retire(core: Core) -> int:
    """Delete what retention lets go; returns how many."""
    now = core.clock()
    given_up = expire_deliveries(core, now)
    retired = 0
    for record in core.records.ended_ones():
        track = record.track
        if track is None or record.deleted_at is None or not track.state.terminal:
            continue
        if core.deliveries.owes(record.uid) or record.uid in given_up:
            continue  # still owed (what is owed lives on the verdict), or its Expired
            # mark just wanted: said on the verdict before it goes, at the next round
        rules = core.deathwatches.get(record.deathwatch)
        retention = rules.retention if rules else timedelta(0)
        declared = track.evidence.declared_at if track.evidence else record.deleted_at
        if now < max(record.deleted_at, declared) + retention:
            continue
        if record.persisted:
            core.writer.want(Desired(*record.verdict, delete=record.uid, priority=LOW,
                                     slot=core.shards.slot(record.uid)))  # fmt: skip
        core.forget(record)
        retired += 1
    return retired


def expire_deliveries(core: Core, now: datetime) -> set[str]:
    """Events owed longer than their sink's maxAge: given up, each said on its verdict."""
    given_up = set()
    for sink, uid, owed in core.deliveries.expired(now):
        given_up.add(uid)
        record = core.records.get(uid)
        if record is None:
            core.deliveries.forget(uid)
            continue
        age = (now - owed.since).total_seconds()
        log.error("event given up: owed longer than its sink's maxAge", sink=sink,
                  namespace=record.namespace, pod=record.name, uid=uid,
                  state=str(owed.state), owed_seconds=round(age))  # fmt: skip
        core.metrics.delivery_events.labels(sink, "expired").inc()
        mark = DeliveryMark(
            sink=sink, id=event_id(uid, owed.state, owed.sequence), sequence=owed.sequence,
            state=owed.state, outcome=DeliveryOutcome.EXPIRED, at=now,
            message=f"owed for {age:.0f}s, past the sink's maxAge",
        )  # fmt: skip
        core.deliveries.sinks[sink].drop(uid)
        if record.track is not None:
            delivered(core, Ended(uid, mark))
    return given_up
