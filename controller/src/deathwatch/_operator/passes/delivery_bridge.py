"""Between the verdicts and the sinks' outboxes (delivery/): the event a sink is owed for a
sandbox, built from its record as it is now (`outgoing`), and an event's end recorded on its
verdict so that no leader sends it again (`delivered`). Free functions on the Core; no I/O.
"""

from __future__ import annotations

from deathwatch._api.verdict_document import document as verdict_document
from deathwatch._operator.delivery.events import Outgoing
from deathwatch._operator.delivery.events import outgoing as make_outgoing
from deathwatch._operator.delivery.outbox import Ended, Owed
from deathwatch._operator.judging import documents
from deathwatch._operator.memory.core import Core, event_time
from deathwatch._operator.writing.writer import LOW


def compose(core: Core, uid: str, sink: str, owed: Owed) -> Outgoing | None:
    """The event a sink is owed for this sandbox, as it is now (None: nothing is)."""
    record = core.records.get(uid)
    track = record.track if record is not None else None
    box = core.deliveries.sinks.get(sink)
    if record is None or track is None or box is None:
        return None
    if not box.sink.wants(record.namespace, track.state):
        return None
    rules = core.deathwatches.get(record.deathwatch)
    owner = record.agent_sandbox
    ref = core.agent_sandboxes.ref(record.namespace, owner) if owner is not None else None
    status = documents.verdict_status(track, record.node, record.deleted_at, record.shield,
                                      record.shield_since, ref, record.transitions,
                                      record.marks)  # fmt: skip
    labels = (documents.verdict_object(record.namespace, record.name, rules, record.uid, ref,
                                       documents.verdict_labels(core.shards.slot(record.uid))
                                       )["metadata"]["labels"]
              if rules is not None else {})  # fmt: skip
    name = rules.name if rules is not None else None
    doc = verdict_document(record.namespace, record.name, name, status, labels)
    return make_outgoing(sink, core.deliveries.cluster, doc, record.transitions,
                         event_time(track, core.clock))  # fmt: skip


def delivered(core: Core, ended: Ended) -> None:
    """An event sent to an end (delivered, refused, given up): recorded on its verdict, so
    that no leader sends it again."""
    record = core.records.get(ended.uid)
    if record is None:
        return
    record.marks = {**record.marks, ended.mark.sink: ended.mark}
    core.owe(record)
    track = record.track
    rules = core.deathwatches.get(record.deathwatch)
    if track is not None and rules is not None and record.persisted:
        core.writer.want(core.verdict(track, record, rules, priority=LOW))
