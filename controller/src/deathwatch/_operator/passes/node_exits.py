"""A container's exit heard on its node (ADR 0028), judged: the pass the exits Leases' receiver
(sources/exits.py) hands each exit to, with its pod as a fresh read showed it. No I/O."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from deathwatch._engine import memory, nodeexit
from deathwatch._engine.contract import Policies
from deathwatch._engine.memory import Deadlines
from deathwatch._engine.nodeexit import NodeExit
from deathwatch._engine.podview import PodView
from deathwatch._operator.memory.deathwatches import DeathWatches
from deathwatch._operator.memory.records import Records
from deathwatch._operator.passes.pods import PodPass
from deathwatch._operator.passes.tail import Tail


@dataclass(frozen=True, slots=True)
class NodeExitPass:
    """What the node-exit pass uses: the records and the DeathWatches, the engine's policies
    and deadlines, the pod pass (what a deletion means), the clock, and the tail."""

    records: Records
    deathwatches: DeathWatches
    policies: Policies
    deadlines: Deadlines
    pods: PodPass
    tail: Tail
    clock: Callable[[], datetime]

    def exited(self, exit: NodeExit, pod: PodView, version: str,
               received: float | None = None) -> str:  # fmt: skip
        """A container's exit heard on its node, `pod` as the API holds it now: judged by the
        engine beside what the read shows, and settled as every input is. What came of it:
        judged, not-watched (not a tracked sandbox's running container), kubelet (its report
        is needed: the engine abstained, or the verdict was final already)."""
        record = self.records.get(pod.uid)
        rules = self.deathwatches.get(record.deathwatch) if record is not None else None
        if record is None or rules is None or record.memory is None:
            return "not-watched"
        if record.memory.track.state.terminal:
            return "kubelet"
        self.records.newer(pod.uid, version)
        self.records.observe(pod, listed=False)
        deletion = self.pods.deletion_cause(record, pod, deleted=False)
        pod = record.told(pod)  # with the kubelet's Evicted Event, read before the kill
        step = memory.exited(record.memory, pod, exit, self.clock(), self.policies,
                             self.deadlines, deletion)  # fmt: skip
        if step is None:
            return "kubelet" if nodeexit.watched(pod, exit) is not None else "not-watched"
        self.tail.settle(step, record, rules, received)
        return "judged"
