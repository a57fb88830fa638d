"""Drive the engine over recorded pod events and summarise what it concluded.

The clock is the latest instant the recording itself proves: the maximum over every object
so far of its creation, condition transitions, container start/finish times and deletion
request (deletionTimestamp minus the grace period, since the API stores the deadline).
Suspect windows that close before the clock are judged at their own deadline, as a live
controller's timer would; windows still open when the stream ends are judged at the final
clock.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from deathwatch._engine import memory
from deathwatch._engine.engine import Step, Track
from deathwatch._engine.memory import Deadlines, Memory
from deathwatch._engine.podview import PodView
from deathwatch._engine.verdict import Evidence, State
from deathwatch._kube.selector import Selector
from deathwatch._policies import PolicyRegistry, PolicySettings
from deathwatch._replay.events import SkippedEvent, ViewEvent

SKIP_EXAMPLES = 5


@dataclass
class SkipLog:
    count: int = 0
    by_reason: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def add(self, index: int, reason: str) -> None:
        self.count += 1
        # group "status.conditions[3].lastTransitionTime: ..." under the field, not the index
        self.by_reason[reason.split(":", 1)[0]] += 1
        if len(self.examples) < SKIP_EXAMPLES:
            self.examples.append(f"event #{index}: {reason}")


@dataclass(frozen=True)
class Report:
    events: int
    pod_events: int
    sandboxes: int
    ready_drops: int
    flaps: int
    false_positives: int
    verdicts: dict[str, int]
    policies: dict[str, int]
    dead: list[Evidence]
    probe_blocked: list[str]  # NS/NAME of pods whose network readiness probe the firewall refuses
    clock: datetime | None
    skipped: SkipLog
    per_policy: dict[str, dict[str, int]]
    causes: dict[str, int]
    origins: dict[str, int]  # Dead verdicts by whose doing: Workload, Infrastructure, ...
    detection_delays: list[float]  # seconds from Ready drop to Dead verdict

    def as_json(self) -> dict[str, Any]:
        return {
            "sandboxes": self.sandboxes,
            "ready_drops": self.ready_drops,
            "flaps": self.flaps,
            "false_positives": self.false_positives,
            "verdicts": self.verdicts,
            "policies": self.policies,
            "dead": [
                {
                    k: v
                    for k, v in e.as_dict().items()
                    if k
                    in (
                        "namespace",
                        "name",
                        "uid",
                        "policy",
                        "cause",
                        "origin",
                        "exit_code",
                        "disruption",
                        "ready_drop_at",
                        "declared_at",
                        "observed_by",
                    )
                }
                for e in self.dead
            ],
            "deaths_by_origin": self.origins,
            "probe_blocked_by_firewall": len(self.probe_blocked),
            "probe_blocked_pods": self.probe_blocked,
            "events": self.events,
            "skipped": {
                "count": self.skipped.count,
                "by_reason": dict(self.skipped.by_reason),
                "examples": self.skipped.examples,
            },
        }


class Replay:
    def __init__(
        self,
        registry: PolicyRegistry,
        policy: str,
        settings: PolicySettings,
        selector: Selector | None = None,
    ) -> None:
        registry.validate(policy)
        self.registry = registry
        self.memories: dict[str, Memory] = {}  # by pod uid
        self.deadlines = Deadlines()
        self.policy = policy
        self.settings = settings
        self.selector = selector or Selector()
        self.clock: datetime | None = None
        self.events = 0
        self.pod_events = 0
        self.skipped = SkipLog()

    @property
    def tracks(self) -> list[Track]:
        return [m.track for m in self.memories.values()]

    def feed(self, item: ViewEvent | SkippedEvent) -> list[Step]:
        self.events += 1
        if type(item) is SkippedEvent:
            self.skipped.add(item.index, item.reason)
            return []
        assert isinstance(item, ViewEvent)  # noqa: S101 - the one other kind
        pod = item.pod
        if self.selector.requirements and not self.selector.matches(pod.labels):
            return []
        self.pod_events += 1
        latest = pod.latest_time
        if latest is not None and (self.clock is None or latest > self.clock):
            self.clock = latest
        now = self.clock if self.clock is not None else latest
        if now is None:
            self.skipped.add(item.index, "object: no timestamp anywhere to place it in time")
            return []
        first = self.deadlines.first()
        steps = self._expire_before(now) if first is not None and first < now else []
        uid = pod.uid
        known = self.memories.get(uid)
        if item.exit is not None:  # a node's exit: judged as the controller judges it
            if known is not None:
                step = memory.exited(known, pod, item.exit, now, self.registry, self.deadlines)
                if step is not None:
                    steps.append(step)
            return steps
        if item.type == "DELETED":
            if known is None:  # deleted before we ever saw it: judge its last state, then bury
                known, _ = self._observe(None, pod, now)
            steps.append(memory.remove(known, now, pod, self.registry, self.deadlines))
        else:
            known, step = self._observe(known, pod, now)
            steps.append(step)
        return steps

    def _observe(self, known: Memory | None, pod: PodView, now: datetime) -> tuple[Memory, Step]:
        known, step = memory.observe(
            known, pod, now, self.registry, self.policy, self.settings, self.deadlines
        )
        self.memories[pod.uid] = known
        return known, step

    def _current(self, deadline: datetime, uid: str) -> bool:
        return memory.is_current(self.memories.get(uid), deadline)

    def _expire_before(self, clock: datetime) -> list[Step]:
        """Windows that closed before `clock` are judged at their own deadline, as a live
        controller's timer would have; a recovery stamped exactly at the deadline wins."""
        due = self.deadlines.take(lambda deadline: deadline < clock, self._current)
        return [
            memory.expire(self.memories[uid], deadline, self.registry, self.deadlines)
            for deadline, uid in due
        ]

    def finish(self) -> Report:
        if self.clock is not None:
            clock = self.clock
            self._expire_before(clock)
            for _, uid in self.deadlines.take(lambda deadline: deadline <= clock, self._current):
                memory.expire(self.memories[uid], clock, self.registry, self.deadlines)
        tracks = self.tracks
        sandboxes = [t for t in tracks if t.ever_ready]
        dead = sorted(
            (t.evidence for t in tracks if t.state is State.DEAD and t.evidence is not None),
            key=lambda e: (e.declared_at, e.namespace, e.name),
        )
        per_policy: dict[str, Counter[str]] = {}
        for t in sandboxes:
            row = per_policy.setdefault(t.policy, Counter())
            row["sandboxes"] += 1
            row["ready_drops"] += t.ready_drops
            row["flaps"] += t.flaps
            row["false_positives"] += int(t.false_positive)
            row[str(t.state)] += 1
        return Report(
            events=self.events,
            pod_events=self.pod_events,
            sandboxes=len(sandboxes),
            ready_drops=sum(t.ready_drops for t in tracks),
            flaps=sum(t.flaps for t in tracks),
            false_positives=sum(1 for t in tracks if t.false_positive),
            verdicts={str(s): n for s in State if (n := sum(1 for t in tracks if t.state is s))},
            policies=dict(Counter(t.policy for t in sandboxes)),
            dead=dead,
            probe_blocked=sorted({f"{t.namespace}/{t.name}" for t in tracks if t.probe_blocked}),
            clock=self.clock,
            skipped=replace(self.skipped),
            per_policy={p: dict(c) for p, c in sorted(per_policy.items())},
            causes=dict(Counter(str(e.cause) for e in dead)),
            origins={str(o): n for o, n in Counter(e.origin for e in dead).most_common()},
            detection_delays=sorted(
                (e.declared_at - e.ready_drop_at).total_seconds()
                for e in dead
                if e.ready_drop_at is not None
            ),
        )
