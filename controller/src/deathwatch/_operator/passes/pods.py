"""The pod pass: a pod's observation, one way through (docs/architecture.md draws it):

    pod reflector ─ PodView ─▶ on_pod
        Records        its record: by uid, the newest version judged, node and addresses
        DeathWatches   which DeathWatch judges it (compiled once per generation: `Rules`)
        memory         the engine: the next Track and what happened (signals)
        Tail.settle    shield, decisions, counts, the verdict's document, the writer

Also the pod inputs that are not its events: a new DeathWatch's pods listed and adopted
(`adopt`), a listing's missing pods (`listed`: gone while nobody watched), a Suspect window
closing on the clock (`expire`), the kubelet's Evicted Event kept for the pod's next
observations (`evicted`). Free functions on what the pass uses (`PodPass`); no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

import structlog

from deathwatch._api.objects import EventType, EvictionNotice
from deathwatch._api.resources import DeathWatchKey
from deathwatch._api.rules import Rules
from deathwatch._engine import memory
from deathwatch._engine.contract import Policies, eviction_cause
from deathwatch._engine.memory import Deadlines
from deathwatch._engine.podview import PodView
from deathwatch._engine.verdict import Cause
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.memory.agent_sandboxes import AgentSandboxes
from deathwatch._operator.memory.deathwatches import DeathWatches, Revision
from deathwatch._operator.memory.records import Record, Records
from deathwatch._operator.passes.tail import Tail

log = structlog.get_logger("deathwatch.controller")


@dataclass(frozen=True, slots=True)
class PodPass:
    """What the pod pass uses: the records and the DeathWatches (which one judges a pod),
    agent-sandbox's Sandboxes (why a pod was deleted), the engine's policies and deadlines,
    the clock, and the tail."""

    records: Records
    deathwatches: DeathWatches
    agent_sandboxes: AgentSandboxes
    policies: Policies
    deadlines: Deadlines
    tail: Tail
    metrics: Metrics
    clock: Callable[[], datetime]

    def on_pod(self, kind: EventType, pod: PodView, received: float | None = None,
               version: str = "") -> None:  # fmt: skip
        """A pod event or a listed pod: one pass, from the engine to the writer. `version`: its
        resourceVersion; a state older than one already judged is not judged again (a watch
        event still in the stream behind a newer listing, a DeathWatch's adoption)."""
        if not self.tail.mine(pod.uid, "pods"):
            return
        listed = kind is EventType.LISTED
        deleted_at = self.clock() if kind is EventType.DELETED else None
        if not self.records.newer(pod.uid, version):
            return
        seen = self.records.observe(pod, listed, deleted_at)
        if seen is None:
            if kind is EventType.DELETED:
                self.records.done_with(pod.uid)
                return
            if self.records.is_done_with(pod.uid):
                return  # let go with its final verdict: its deletion's echoes say nothing new
            rules = self.deathwatches.owner(pod)
            if rules is None:
                return  # not a sandbox (or its DeathWatch is gone or invalid)
            record, changed = self.track(pod, rules, listed, deleted_at), True
            self.records.newer(pod.uid, version)  # noted: its older states come to nothing
        else:
            record, changed = seen
            found = self.deathwatches.get(record.deathwatch)
            if found is None:
                return  # its DeathWatch is invalid for now: judged again once it is valid
            rules = found
        self.step(kind, pod, record, rules, changed, received)

    def track(self, pod: PodView, rules: Rules, listed: bool,
              deleted_at: datetime | None = None) -> Record:  # fmt: skip
        """A record for a pod seen for the first time."""
        older = self.records.named(pod.namespace, pod.name)
        if older is not None and older.uid != pod.uid:
            self.tail.forget(older)  # a new pod took the name: its verdict replaces the old one's
        return self.records.add_pod(pod, rules.key, listed, deleted_at)

    def deletion_cause(self, record: Record, pod: PodView, deleted: bool) -> Cause:
        """What the pod's deletion means: the pod never says why it was deleted; its Sandbox
        does (suspended, expired)."""
        if record.agent_sandbox is not None and (deleted or pod.deletion_requested_at is not None):
            return self.agent_sandboxes.fate(
                pod.namespace, record.agent_sandbox, pod.deletion_requested_at or self.clock()
            )
        return Cause.DELETED

    def step(self, kind: EventType, pod: PodView, record: Record, rules: Rules,
             changed: bool, received: float | None) -> None:  # fmt: skip
        """The engine's step for this observation, and its tail."""
        now = self.clock()
        pod = record.told(pod)
        deletion = self.deletion_cause(record, pod, kind is EventType.DELETED)
        if kind is EventType.DELETED:
            if record.memory is None:
                return
            result = memory.remove(record.memory, now, pod, self.policies, self.deadlines, deletion)
        else:
            record.memory, result = memory.observe(
                record.memory, pod, now, self.policies, rules.policy, rules.settings,
                self.deadlines, deletion,
            )  # fmt: skip
        if not result.changed and not result.signals and not changed:
            return  # nothing it says changed (a heartbeat of the kubelet): nothing to do
        self.tail.settle(result, record, rules, received)

    def evicted(self, notice: EvictionNotice) -> None:
        """The kubelet's Evicted Event of a pod: kept with its record, beside every later
        observation of it (the node's exit, the kubelet's relist before its terminal status),
        so a death is named for the eviction on both paths (ADR 0044). It comes before the
        kill; a pod with no record is not a sandbox judged here (or not seen yet: its own
        status says Evicted once its containers have stopped)."""
        if not notice.from_kubelet or not self.tail.mine(notice.pod_uid, "events"):
            return
        record = self.records.get(notice.pod_uid)
        if record is None or record.eviction == notice.message:
            return
        record.eviction = notice.message
        cause = eviction_cause(notice.message)
        self.metrics.kubelet_evictions.labels(str(cause)).inc()
        log.info("the kubelet evicts a sandbox", namespace=record.namespace, pod=record.name,
                 uid=record.uid, cause=str(cause), message=notice.message)  # fmt: skip

    def adopt(self, key: DeathWatchKey, revision: Revision, pods: Iterable[PodView],
              versions: Mapping[str, str] | None = None) -> int:  # fmt: skip
        """Pods of a page just listed for the DeathWatch `key` at `revision`: each one it selects
        that no event has brought yet. Returns how many; 0 when the DeathWatch has changed or
        gone meanwhile (the newer revision's own listing adopts them). `versions`: each pod's
        resourceVersion by uid, so that an older event of it still in the watch stream is not
        judged after this newer state."""
        rules = self.deathwatches.current(key, revision)
        if rules is None:
            return 0
        adopted = 0
        for pod in pods:
            if not self.tail.mine(pod.uid, "pods"):
                continue
            if self.records.get(pod.uid) is not None or self.records.is_done_with(pod.uid):
                continue  # an event brought it already, or its deletion came after this list
            owner = self.deathwatches.owner(pod)
            if owner is None or owner.key != key:
                continue
            record = self.track(pod, rules, listed=False)
            self.records.newer(pod.uid, (versions or {}).get(pod.uid, ""))
            self.step(EventType.LISTED, pod, record, rules, True, None)
            adopted += 1
        return adopted

    # --- listings (the pod reflector) -----------------------------------------------------------

    def listing(self, scope: str | None) -> None:
        self.records.begin_listing(scope)

    def listed(self, scope: str | None) -> None:
        """A complete listing did not show these: deleted while nobody watched. A live one is
        Gone (Unobserved): how it ended is unknown; an ended one's retention starts."""
        now = self.clock()
        for record in self.records.unlisted(scope):
            self.gone(record, now)

    def gone(self, record: Record, now: datetime | None = None) -> None:
        """A pod found absent from the API."""
        now = now or self.clock()
        self.records.ended(record, now)
        rules = self.deathwatches.get(record.deathwatch)
        if record.memory is None or rules is None:
            return
        result = memory.remove(record.memory, now, None, self.policies, self.deadlines)
        self.tail.settle(result, record, rules)

    # --- Suspect windows on the clock -----------------------------------------------------------

    def _current(self, deadline: datetime, uid: str) -> bool:
        record = self.records.get(uid)
        return memory.is_current(record.memory if record else None, deadline)

    def next_deadline(self) -> datetime | None:
        """When the next Suspect window closes (None: none is open)."""
        return self.deadlines.next(self._current)

    def expire(self) -> None:
        """Judge every Suspect whose window has closed. One that fails (a bug: a policy's error
        is contained by the engine) is reported and the others are still judged; its next pod
        event judges it."""
        now = self.clock()
        due = self.deadlines.take(lambda deadline: deadline <= now, self._current)
        for _, uid in due:
            record = self.records.get(uid)
            rules = self.deathwatches.get(record.deathwatch) if record else None
            if record is None or record.memory is None or rules is None:
                continue
            try:
                result = memory.expire(record.memory, now, self.policies, self.deadlines)
                self.tail.settle(result, record, rules)
            except Exception as exc:
                self.metrics.handler_errors.labels("expire").inc()
                log.error("a Suspect window could not be judged; its next pod event judges it",
                          uid=uid, namespace=record.namespace, pod=record.name,
                          exc_info=exc)  # fmt: skip
