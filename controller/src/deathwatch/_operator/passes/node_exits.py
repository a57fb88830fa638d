"""A container's exit heard on its node (ADR 0028), judged: the pass the exits Leases' sink
(sources/exits.py) hands each exit to, with its pod as a fresh read showed it. Free functions
on the Core; no I/O."""

from __future__ import annotations

from deathwatch._engine import memory, nodeexit
from deathwatch._engine.nodeexit import NodeExit
from deathwatch._engine.podview import PodView
from deathwatch._operator.memory.core import Core
from deathwatch._operator.passes import pods


def exited(core: Core, exit: NodeExit, pod: PodView, version: str,
           received: float | None = None) -> str:  # fmt: skip
    """A container's exit heard on its node, `pod` as the API holds it now: judged by the
    engine beside what the read shows, and settled as every input is. What came of it:
    judged, not-watched (not a tracked sandbox's running container), kubelet (its report is
    needed: the engine abstained, or the verdict was final already)."""
    record = core.records.get(pod.uid)
    rules = core.deathwatches.get(record.deathwatch) if record is not None else None
    if record is None or rules is None or record.memory is None:
        return "not-watched"
    if record.memory.track.state.terminal:
        return "kubelet"
    core.records.newer(pod.uid, version)
    core.records.observe(pod, listed=False)
    deletion = pods.deletion_cause(core, record, pod, deleted=False)
    step = memory.exited(record.memory, pod, exit, core.clock(), core.policies, core.deadlines,
                         deletion)  # fmt: skip
    if step is None:
        return "kubelet" if nodeexit.watched(pod, exit) is not None else "not-watched"
    core.settle(step, record, rules, received)
    return "judged"
