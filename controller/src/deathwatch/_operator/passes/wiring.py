"""Each pass handed the parts it uses, once: the memory's (memory/core.py), the writer, the
outboxes, the metrics, the engine's policies, the clock. Every pass's dependencies are the
fields of its own class; nothing reaches them through anything else."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from deathwatch._engine.contract import Policies
from deathwatch._engine.timeutil import UTC
from deathwatch._operator.delivery.outbox import Deliveries
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.memory.core import Core
from deathwatch._operator.passes.delivery_bridge import DeliveryPass
from deathwatch._operator.passes.node_exits import NodeExitPass
from deathwatch._operator.passes.owners import OwnerPass
from deathwatch._operator.passes.pods import PodPass
from deathwatch._operator.passes.publishing import StatusPass
from deathwatch._operator.passes.retention import RetentionPass
from deathwatch._operator.passes.shielding import ShieldPass
from deathwatch._operator.passes.tail import Tail
from deathwatch._operator.passes.takeover import Takeover
from deathwatch._operator.passes.verdict_watch import VerdictPass
from deathwatch._operator.writing.writer import Writer


class Passes:
    """One of each pass, on one memory."""

    def __init__(
        self,
        core: Core,
        *,
        writer: Writer,
        metrics: Metrics,
        policies: Policies,
        deliveries: Deliveries | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        deliveries = deliveries if deliveries is not None else Deliveries(None)
        self.core, self.writer, self.metrics, self.deliveries = core, writer, metrics, deliveries
        self.clock = clock
        records, deathwatches, sandboxes = core.records, core.deathwatches, core.agent_sandboxes
        self.tail = tail = Tail(
            records=records, summaries=core.summaries, agent_sandboxes=sandboxes,
            coverage=core.coverage, shards=core.shards, writer=writer, deliveries=deliveries,
            metrics=metrics, wake=core.wake, clock=clock,
        )  # fmt: skip
        self.pods = PodPass(records, deathwatches, sandboxes, policies, core.deadlines, tail,
                            metrics, clock)  # fmt: skip
        self.node_exits = NodeExitPass(records, deathwatches, policies, core.deadlines,
                                       self.pods, tail, clock)  # fmt: skip
        self.owners = OwnerPass(deathwatches, records, core.summaries, sandboxes, core.shards,
                                writer, tail)  # fmt: skip
        self.verdicts = VerdictPass(records, deathwatches, sandboxes, core.summaries, policies,
                                    core.deadlines, writer, deliveries, core.shards, metrics,
                                    tail, core.wake)  # fmt: skip
        self.status = StatusPass(deathwatches, records, core.summaries, core.firewall,
                                 deliveries, core.shards, writer, metrics, clock,
                                 core.rivals)  # fmt: skip
        self.bridge = DeliveryPass(records, deathwatches, sandboxes, deliveries, core.shards,
                                   writer, tail, clock)  # fmt: skip
        self.retention = RetentionPass(records, deathwatches, deliveries, self.bridge,
                                       core.shards, writer, metrics, tail, clock)  # fmt: skip
        self.shielding = ShieldPass(core.coverage, records, deathwatches, tail, clock)
        self.takeover = Takeover(writer, deliveries, self.status, self.verdicts)
