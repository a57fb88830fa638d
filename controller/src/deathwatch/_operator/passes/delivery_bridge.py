"""Between the verdicts and the sinks' outboxes (delivery/): the event a sink is owed for a
sandbox, built from its record as it is now (`outgoing`), and an event's end recorded on its
verdict so that no leader sends it again (`delivered`). The pass's methods, on what it uses
(`DeliveryPass`); no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from deathwatch._api.verdict_document import document as verdict_document
from deathwatch._operator.delivery.events import Outgoing
from deathwatch._operator.delivery.events import outgoing as make_outgoing
from deathwatch._operator.delivery.outbox import Deliveries, Ended, Owed
from deathwatch._operator.memory.agent_sandboxes import AgentSandboxes
from deathwatch._operator.memory.deathwatches import DeathWatches
from deathwatch._operator.memory.records import Records
from deathwatch._operator.passes.tail import Tail, event_time
from deathwatch._operator.reporting import sandbox_verdicts
from deathwatch._operator.shards.filter import ShardFilter
from deathwatch._operator.writing.desired import LOW
from deathwatch._operator.writing.writer import Writer


@dataclass(frozen=True, slots=True)
class DeliveryPass:
    """What the bridge uses: the records, their DeathWatches and Sandboxes (an event carries
    the whole verdict), the outboxes, the shard filter (a verdict's labels), the writer, the
    tail and the clock."""

    records: Records
    deathwatches: DeathWatches
    agent_sandboxes: AgentSandboxes
    deliveries: Deliveries
    shards: ShardFilter
    writer: Writer
    tail: Tail
    clock: Callable[[], datetime]

    def compose(self, uid: str, sink: str, owed: Owed) -> Outgoing | None:
        """The event a sink is owed for this sandbox, as it is now (None: nothing is)."""
        record = self.records.get(uid)
        track = record.track if record is not None else None
        box = self.deliveries.sinks.get(sink)
        if record is None or track is None or box is None:
            return None
        if not box.sink.wants(record.namespace, track.state):
            return None
        rules = self.deathwatches.get(record.deathwatch)
        owner = record.agent_sandbox
        ref = self.agent_sandboxes.ref(record.namespace, owner) if owner is not None else None
        status = sandbox_verdicts.verdict_status(
            track, record.node, record.deleted_at, record.shield, record.shield_since, ref,
            record.transitions, record.marks,
        )  # fmt: skip
        slot = sandbox_verdicts.verdict_labels(self.shards.slot(record.uid))
        labels = (sandbox_verdicts.verdict_object(record.namespace, record.name, rules, record.uid,
                                                  ref, slot)["metadata"]["labels"]
                  if rules is not None else {})  # fmt: skip
        name = rules.name if rules is not None else None
        doc = verdict_document(record.namespace, record.name, name, status, labels)
        return make_outgoing(sink, self.deliveries.cluster, doc, record.transitions,
                             event_time(track, self.clock))  # fmt: skip

    def delivered(self, ended: Ended) -> None:
        """An event sent to an end (delivered, refused, given up): recorded on its verdict, so
        that no leader sends it again."""
        record = self.records.get(ended.uid)
        if record is None:
            return
        record.marks = {**record.marks, ended.mark.sink: ended.mark}
        self.tail.owe(record)
        track = record.track
        rules = self.deathwatches.get(record.deathwatch)
        if track is not None and rules is not None and record.persisted:
            self.writer.want(self.tail.verdict(track, record, rules, priority=LOW))
