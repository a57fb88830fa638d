"""Pods through the engine's memory (`_engine.memory`), as replay and the operator drive it:
one Memory per pod by uid, one Deadlines heap (`Pods`); one pod of them, on a test's clock in
seconds, with the signals it gave (`Judge`). For the engine's tests."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from deathwatch._engine import memory
from deathwatch._engine.contract import Policies, PolicySettings
from deathwatch._engine.engine import SignalKind, Step, Track
from deathwatch._engine.memory import Deadlines, Memory
from deathwatch._engine.nodeexit import NodeExit
from deathwatch._engine.podview import PodView, read_pod
from deathwatch._engine.verdict import Cause
from deathwatch._policies import AUTO, default_registry
from tests.builders import at

AGENT = frozenset({49983})


class Pods:
    def __init__(self, policies: Policies) -> None:
        self.policies = policies
        self.memories: dict[str, Memory] = {}
        self.deadlines = Deadlines()

    @property
    def tracks(self) -> dict[str, Track]:
        return {uid: m.track for uid, m in self.memories.items()}

    def observe(self, pod: PodView, now: datetime, configured: str, settings: PolicySettings,
                deletion: Cause = Cause.DELETED) -> Step:  # fmt: skip
        known, step = memory.observe(self.memories.get(pod.uid), pod, now, self.policies,
                                     configured, settings, self.deadlines, deletion)  # fmt: skip
        self.memories[pod.uid] = known
        return step

    def exited(self, pod: PodView, exit: NodeExit, now: datetime,
               deletion: Cause = Cause.DELETED) -> Step | None:  # fmt: skip
        known = self.memories.get(pod.uid)
        if known is None:
            return None
        return memory.exited(known, pod, exit, now, self.policies, self.deadlines, deletion)

    def remove(self, uid: str, now: datetime, last: PodView | None,
               deletion: Cause = Cause.DELETED) -> Step | None:  # fmt: skip
        known = self.memories.get(uid)
        if known is None:
            return None
        return memory.remove(known, now, last, self.policies, self.deadlines, deletion)

    def _current(self, deadline: datetime, uid: str) -> bool:
        return memory.is_current(self.memories.get(uid), deadline)

    def next_deadline(self) -> datetime | None:
        return self.deadlines.next(self._current)

    def expire_due(self, now: datetime) -> list[Step]:
        due = self.deadlines.take(lambda deadline: deadline <= now, self._current)
        return [memory.expire(self.memories[uid], now, self.policies, self.deadlines)
                for _, uid in due]  # fmt: skip

    def expire_before(self, clock: datetime) -> list[Step]:
        due = self.deadlines.take(lambda deadline: deadline < clock, self._current)
        return [memory.expire(self.memories[uid], deadline, self.policies, self.deadlines)
                for deadline, uid in due]  # fmt: skip


def _noticed(obj: dict[str, Any], notice: str | None) -> PodView:
    view = read_pod(obj)
    return view if notice is None else msgspec.structs.replace(view, eviction_notice=notice)


class Judge:
    """One pod (uid-1) through `Pods`, as the operator and replay drive it."""

    def __init__(
        self,
        policy: str = AUTO,
        multiplier: float = 2.0,
        agent_ports: frozenset[int] = AGENT,
        *,
        sandbox: frozenset[str] = frozenset(),
        vital: frozenset[str] = frozenset(),
    ) -> None:
        """`sandbox`, `vital`: the DeathWatch's containers.sandbox and .vitalSidecars."""
        self.fleet = Pods(default_registry())
        self.policy = policy
        self.settings = PolicySettings(exec_window_multiplier=multiplier, agent_ports=agent_ports,
                                       sandbox_containers=sandbox, vital_sidecars=vital)  # fmt: skip
        self.signals: list[SignalKind] = []

    def see(self, obj: dict[str, Any], now: float, notice: str | None = None) -> Track:
        """`notice`: the message of the kubelet's Evicted Event the controller has read."""
        step = self.fleet.observe(_noticed(obj, notice), at(now), self.policy, self.settings)
        return self._record(step)

    def exit(self, obj: dict[str, Any], exit: NodeExit, now: float,
             deletion: Cause = Cause.DELETED, notice: str | None = None) -> Track | None:  # fmt: skip
        """A node's exit, `obj` the pod as the API holds it then; None: not judged."""
        step = self.fleet.exited(_noticed(obj, notice), exit, at(now), deletion)
        return self._record(step) if step is not None else None

    def tick(self, now: float) -> None:
        for step in self.fleet.expire_due(at(now)):
            self._record(step)

    def delete(self, obj: dict[str, Any] | None, now: float, uid: str = "uid-1") -> Track:
        step = self.fleet.remove(uid, at(now), read_pod(obj) if obj else None)
        assert step is not None
        return self._record(step)

    def _record(self, step: Step) -> Track:
        self.signals.extend(s.kind for s in step.signals)
        return step.track

    @property
    def track(self) -> Track:
        return self.fleet.tracks["uid-1"]
