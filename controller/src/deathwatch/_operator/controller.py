"""One pass per event. A pod's observation flows one way through the controller's parts,
each entered once (docs/architecture.md draws it):

    pod reflector ─ PodView ─▶ Controller.on_pod
        Records        its record: by uid, the newest version judged, node and addresses
        DeathWatches   which DeathWatch judges it (compiled once per generation: `Rules`)
        memory         the engine: the next Track and what happened (signals)
        Coverage       its shield, only when what that depends on changed
        decide         what the step means: Events, written or not, counted how
        Summaries      its DeathWatch's counts, by difference
        documents      the verdict status, built once
        Writer         sent (leader), or owed as a digest (standby)

The other inputs take the same road from `_settle` on: a Suspect window closing on the clock
(`expire`), a pod no complete listing shows (`listed`), a node's coverage changing
(`reshield`). An agent-sandbox Sandbox (`on_agent_sandbox`) changes only what its pods'
verdicts name, and what a pod's deletion means (read in `_judge`, handed to the engine).
Verdicts the API holds come back on their own watch (`on_verdict`): listed at start they
rebuild the engine's memory (`restore`), watched they keep a standby level with the leader.
Everything the controller knows of one sandbox is its `Record` (records.py), forgotten in
one place (`_forget`). All calls run on the event loop; nothing here blocks or does I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import msgspec
import structlog

from deathwatch._engine import memory, nodeexit
from deathwatch._engine.contract import Policies
from deathwatch._engine.engine import SignalKind, Step, Track
from deathwatch._engine.memory import Deadlines
from deathwatch._engine.nodeexit import NodeExit
from deathwatch._engine.podview import PodView
from deathwatch._engine.timeutil import UTC, parse_time
from deathwatch._engine.verdict import Cause, State, origin_of
from deathwatch._operator import decisions, documents
from deathwatch._operator.agent_sandboxes import AgentSandboxes, SandboxObject
from deathwatch._operator.coverage import Coverage
from deathwatch._operator.deathwatches import Change, DeathWatches, DeathWatchKey, Revision
from deathwatch._operator.decisions import Announcement, Before
from deathwatch._operator.delivery.events import Outgoing, event_id, outgoing
from deathwatch._operator.delivery.outbox import Deliveries, Ended, Owed
from deathwatch._operator.documents import FirewallReading, PodEvent
from deathwatch._operator.metrics import Metrics
from deathwatch._operator.records import Record, Records
from deathwatch._operator.reflector import EventType, Undecodable
from deathwatch._operator.resources import (
    DW_PLURAL,
    POD_UID_LABEL,
    SV_PLURAL,
    ConditionStatus,
    ConditionType,
    DeliveryMark,
    DeliveryOutcome,
    EventReason,
    SandboxRef,
    ShardPart,
    to_document,
)
from deathwatch._operator.rules import Rules
from deathwatch._operator.sharding import describe as slots_text
from deathwatch._operator.sharding import slot_of
from deathwatch._operator.shards import ALL, Spec
from deathwatch._operator.shield import Shield
from deathwatch._operator.summary import Summaries
from deathwatch._operator.verdict_document import document as verdict_document
from deathwatch._operator.writer import LOW, NORMAL, URGENT, Desired, ObjectKey, Writer

log = structlog.get_logger("deathwatch.controller")
# Dead verdicts younger than this get their Event re-posted at start and takeover (under the
# API server's default 1 h Event TTL, so an Event that was posted still exists and is a 409)
EVENT_RECONCILE_WINDOW = timedelta(minutes=50)
KEEP = object()  # "the shield did not need judging again"


class Verdict:
    """A SandboxVerdict as its watch shows it: just what the controller reads."""

    __slots__ = ("deathwatch", "labels", "name", "namespace", "status", "version")

    def __init__(self, namespace: str, name: str, version: str, deathwatch: str,
                 labels: Mapping[str, str], status: dict[str, Any] | None) -> None:  # fmt: skip
        self.namespace, self.name, self.version = namespace, name, version
        self.deathwatch, self.labels, self.status = deathwatch, labels, status


class Firewall:
    """What the controller knows of the firewall: the DaemonSet as the probe loop last read
    it (for the DeathWatch status), and the agents' coverage (each verdict's Shielded; None
    when no firewall is configured)."""

    def __init__(self, daemonset: str | None, coverage: Coverage | None) -> None:
        self.reading = FirewallReading(daemonset)
        self.coverage = coverage


class Controller:
    def __init__(
        self,
        *,
        deathwatches: DeathWatches,
        records: Records,
        policies: Policies,
        summaries: Summaries,
        writer: Writer,
        metrics: Metrics,
        firewall: Firewall,
        agent_sandboxes: AgentSandboxes,
        fresh: Callable[[], bool | None],
        stale_after: float,
        leader: Callable[[], str | None] = lambda: None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        deliveries: Deliveries | None = None,
        shard: Spec | None = None,
        owned: Callable[[], frozenset[int]] = lambda: ALL,
    ) -> None:
        """`fresh`: whether every pod stream delivered something lately (None: unknown);
        `stale_after`: the seconds that takes, for the DeathWatch condition's message;
        `leader`: who holds the Lease; `deliveries`: what each sink is owed (none: no sink
        configured); `shard`: which slots this process judges (sharding, ADR 0025; the
        default: all of them), `owned()` the ones its leader writes now."""
        self.deathwatches = deathwatches
        self.records = records
        self.policies = policies
        self.deadlines = Deadlines()  # Suspect windows of every record, by when they close
        self.summaries = summaries
        self.writer = writer
        self.metrics = metrics
        self.firewall = firewall
        self.coverage = firewall.coverage  # None: no firewall configured, no Shielded
        self.agent_sandboxes = agent_sandboxes  # as their watch shows them (or none at all)
        self.fresh = fresh
        self.stale_after = stale_after
        self.leader = leader
        self.clock = clock
        self.deliveries = deliveries if deliveries is not None else Deliveries(None)
        self.shard = shard or Spec()
        self.owned = owned
        # sharded: the slots this shard is assigned; a pod of another slot is not its to judge
        self.assigned: frozenset[int] | None = self.shard.slots if self.shard.sharded else None
        self.parts: dict[DeathWatchKey, dict[int, ShardPart]] = {}  # other shards' parts
        self.wake = asyncio.Event()  # a new Suspect deadline to wait for
        self.malformed: set[str] = set()  # objects reported undecodable (once each)

    # --- pods ---------------------------------------------------------------------------

    def on_pod(self, kind: EventType, pod: PodView, received: float | None = None,
               version: str = "") -> None:  # fmt: skip
        """A pod event or a listed pod: one pass, from the engine to the writer. `version`:
        its resourceVersion; a state older than one already judged is not judged again (a
        watch event still in the stream behind a newer listing, a DeathWatch's adoption)."""
        if not self.mine(pod.uid, "pods"):
            return
        listed = kind is EventType.LISTED
        deleted_at = self.clock() if kind is EventType.DELETED else None
        if not self.records.newer(pod.uid, version):
            return
        seen = self.records.observe(pod, listed, deleted_at)
        if seen is None:
            if kind is EventType.DELETED:
                self.records.deleted(pod.uid)
                return
            rules = self.deathwatches.owner(pod)
            if rules is None:
                return  # not a sandbox (or its DeathWatch is gone or invalid)
            record, changed = self._track(pod, rules, listed, deleted_at), True
            self.records.newer(pod.uid, version)  # noted: its older states come to nothing
        else:
            record, changed = seen
            found = self.deathwatches.get(record.deathwatch)
            if found is None:
                return  # its DeathWatch is invalid for now: judged again once it is valid
            rules = found
        self._judge(kind, pod, record, rules, changed, received)

    def tracks(self, uid: str) -> bool:
        """Whether this pod is a sandbox this controller judges (a record of it is kept)."""
        return self.records.get(uid) is not None

    def on_node_exit(self, exit: NodeExit, pod: PodView, version: str,
                     received: float | None = None) -> str:  # fmt: skip
        """A container's exit heard on its node (node_exits.py), `pod` as the API holds it
        now. What came of it: judged, not-watched (not a tracked sandbox's running
        container), kubelet (its report is needed: the engine abstained, or the verdict was
        final already)."""
        record = self.records.get(pod.uid)
        rules = self.deathwatches.get(record.deathwatch) if record is not None else None
        if record is None or rules is None or record.memory is None:
            return "not-watched"
        if record.memory.track.state.terminal:
            return "kubelet"
        self.records.newer(pod.uid, version)
        self.records.observe(pod, listed=False)
        now = self.clock()
        deletion = Cause.DELETED
        if record.agent_sandbox is not None and pod.deletion_requested_at is not None:
            deletion = self.agent_sandboxes.fate(pod.namespace, record.agent_sandbox,
                                                 pod.deletion_requested_at)  # fmt: skip
        step = memory.exited(record.memory, pod, exit, now, self.policies, self.deadlines,
                             deletion)  # fmt: skip
        if step is None:
            return "kubelet" if nodeexit.watched(pod, exit) is not None else "not-watched"
        self._settle(step, record, rules, received)
        return "judged"

    def mine(self, uid: str | None, where: str) -> bool:
        """Sharded: whether this shard judges the sandbox of this pod uid (a pod or verdict
        of another shard's slots is counted and dropped: the API server filters the pod watch
        where it can, this filter runs anyway)."""
        if self.assigned is None:
            return True
        if uid and slot_of(uid) in self.assigned:
            return True
        self.metrics.shard_filtered.labels(where).inc()
        return False

    def _slot(self, uid: str) -> int | None:
        return slot_of(uid) if self.assigned is not None else None

    def _track(self, pod: PodView, rules: Rules, listed: bool,
               deleted_at: datetime | None = None) -> Record:  # fmt: skip
        older = self.records.named(pod.namespace, pod.name)
        if older is not None and older.uid != pod.uid:
            self._forget(older)  # a new pod took the name: its verdict replaces the old one's
        return self.records.add_pod(pod, rules.key, listed, deleted_at)

    def _judge(self, kind: EventType, pod: PodView, record: Record, rules: Rules,
               changed: bool, received: float | None) -> None:  # fmt: skip
        now = self.clock()
        deletion = Cause.DELETED
        if record.agent_sandbox is not None and (
            kind is EventType.DELETED or pod.deletion_requested_at is not None
        ):
            # the pod never says why it was deleted; its Sandbox does (suspended, expired)
            deletion = self.agent_sandboxes.fate(
                pod.namespace, record.agent_sandbox, pod.deletion_requested_at or now
            )
        if kind is EventType.DELETED:
            if record.memory is None:
                return
            step = memory.remove(record.memory, now, pod, self.policies, self.deadlines, deletion)
        else:
            record.memory, step = memory.observe(
                record.memory, pod, now, self.policies, rules.policy, rules.settings,
                self.deadlines, deletion,
            )  # fmt: skip
        if not step.changed and not step.signals and not changed:
            return  # nothing it says changed (a heartbeat of the kubelet): nothing to do
        self._settle(step, record, rules, received)

    def _settle(
        self,
        step: Step,
        record: Record,
        rules: Rules,
        received: float | None = None,
        shield: object = KEEP,  # a Shield, None, or KEEP: judge it here if need be
    ) -> None:
        """What a step means, applied: reported, counted, written. The one tail of every
        input (pod events, listings, expiries, coverage)."""
        track = step.track
        self._report(step, record)
        changed = any(s.kind is SignalKind.STATE_CHANGED for s in step.signals)
        if changed:
            record.transitions += 1  # the sequence of the event that announces it
        if shield is KEEP:
            shield = self._shield(record, rules)
        assert shield is None or isinstance(shield, Shield)  # noqa: S101 - KEEP resolved
        claim = self.coverage.claim(record.node) if self.coverage else None
        before = Before(record.persisted, record.shield, record.shield_since, record.node)
        outcome = decisions.decide(step, before, self.clock(), shield, claim)
        if outcome.forget:
            self._forget(record)
            return
        if changed:
            self._owe(record, track)
        if any(a.reason is EventReason.SANDBOX_UNSHIELDED for a in outcome.events):
            self._unshielded(track, record, outcome.shield)
        record.shield, record.shield_since = outcome.shield, outcome.shield_since
        self.summaries.apply(record.deathwatch, record.counted, outcome.facts)
        record.counted = outcome.facts
        if outcome.write:
            record.persisted = True
            self.writer.want(self._verdict(track, record, rules, outcome.events, received))
        if track.deadline is not None:
            self.wake.set()

    def _shield(self, record: Record, rules: Rules) -> Shield | None:
        """Its shield judged again if what it depends on changed, else as it was."""
        if self.coverage is None:
            return None
        basis = (record.node, record.ips, rules.settings.agent_ports)
        if record.shield is not None and record.judged_for == basis:
            return record.shield
        shield = self.coverage.judge(record.node, record.ips, rules.settings.agent_ports)
        if shield is None:
            return record.shield  # nothing read since start: the restored shield stands
        record.judged_for = basis
        return shield

    def _unshielded(self, track: Track, record: Record, shield: Shield | None) -> None:
        assert shield is not None  # noqa: S101 - an Unshielded Event has a shield
        log.warning("sandbox not shielded", namespace=track.namespace, pod=track.name,
                    uid=track.uid, node=record.node, reason=shield.reason,
                    message=shield.message)  # fmt: skip
        self.metrics.unshielded_spells.labels(shield.reason).inc()

    def _verdict(self, track: Track, record: Record, rules: Rules,
                 announce: Iterable[Announcement] = (), received: float | None = None,
                 priority: int | None = None) -> Desired:  # fmt: skip
        dead = track.state is State.DEAD
        owner = record.agent_sandbox
        ref = self.agent_sandboxes.ref(track.namespace, owner) if owner is not None else None
        status, obj, labels, events = documents.verdict(
            track, rules, record.node, record.deleted_at, record.shield, record.shield_since,
            announce, ref, record.transitions, record.marks, self._slot(track.uid),
        )  # fmt: skip
        return Desired(
            SV_PLURAL, track.namespace, track.name,
            status=status,
            create=obj,
            labels=labels,
            events=events,
            priority=priority if priority is not None else URGENT if dead else NORMAL,
            received=received if dead else None,
            ready_drop_at=track.ready_drop_at if dead else None,
            slot=self._slot(track.uid),
        )  # fmt: skip

    def _report(self, step: Step, record: Record) -> None:
        """Logs and metrics of what happened: observability only, nothing decided here."""
        track, node = step.track, record.node
        if node:
            self.metrics.node_seen(node)
        for signal in step.signals:
            kind = signal.kind
            if kind is SignalKind.STATE_CHANGED:
                cause = str(track.cause) if track.cause else None
                log.info("verdict", namespace=track.namespace, pod=track.name, uid=track.uid,
                         **{"from": str(signal.previous), "to": str(track.state)},
                         policy=track.policy, cause=cause,
                         origin=str(origin_of(track.cause)) if track.state.terminal else None,
                         disruption=track.disruption.reason if track.disruption else None,
                         )  # fmt: skip
                self.metrics.verdicts.labels(
                    str(track.state), track.policy, str(track.cause or "")
                ).inc()
                if track.state is State.DEAD:
                    self.metrics.death(node or "", track.cause or Cause.UNKNOWN)
                if track.cause is Cause.UNOBSERVED:
                    log.warning("lost track: the pod is gone and nobody saw how it ended",
                                namespace=track.namespace, pod=track.name, uid=track.uid,
                                last_seen=str(signal.previous))  # fmt: skip
            elif kind is SignalKind.READY_DROPPED:
                self.metrics.ready_drops.labels(track.policy).inc()
            elif kind is SignalKind.FLAPPED:
                self.metrics.flaps.labels(track.policy).inc()
            elif kind is SignalKind.FALSE_POSITIVE:
                self.metrics.false_positives.labels(track.policy).inc()
                log.warning("false positive", namespace=track.namespace, pod=track.name,
                            uid=track.uid, policy=track.policy)  # fmt: skip
            elif kind is SignalKind.POLICY_FAILED:
                self.metrics.policy_errors.labels(track.policy).inc()
            elif kind is SignalKind.DISPUTED:
                self.metrics.node_exit_disputes.labels(track.policy).inc()
                log.warning("a death heard on the node, told otherwise by the kubelet; the "
                            "verdict stands", namespace=track.namespace, pod=track.name,
                            uid=track.uid, disputed=track.disputed)  # fmt: skip
        # a policy's failure is logged once per spell, and its recovery
        if self.records.set_failing(record, track.policy_error is not None):
            if record.failing:
                log.error("policy failed; the pod is judged by container-state until it works "
                          "again", namespace=track.namespace, pod=track.name, uid=track.uid,
                          policy=track.policy, error=track.policy_error)  # fmt: skip
            else:
                log.info("policy works again", namespace=track.namespace, pod=track.name,
                         uid=track.uid, policy=track.policy)  # fmt: skip

    def _forget(self, record: Record) -> None:
        """The one place a sandbox is forgotten: its record (and every index into it) and
        what its DeathWatch counts for it. Its deadline, if any, lapses with it."""
        self.records.remove(record)
        self.summaries.apply(record.deathwatch, record.counted, None)
        self.deliveries.forget(record.uid)

    # --- delivery (delivery/: the sender builds each event from here, and reports back) ----

    def _owe(self, record: Record, track: Track | None = None) -> None:
        """Tell the outboxes this sandbox's current transition (and the marks it has)."""
        track = track or record.track
        if not self.deliveries or track is None:
            return
        for sink in self.deliveries.changed(
            record.uid, record.namespace, track.state, record.transitions,
            _event_time(track, self.clock), record.marks, record.deathwatch,
        ):  # fmt: skip
            self.metrics.delivery_coalesced.labels(sink).inc()

    def outgoing(self, uid: str, sink: str, owed: Owed) -> Outgoing | None:
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
        status = documents.verdict_status(track, record.node, record.deleted_at, record.shield,
                                          record.shield_since, ref, record.transitions,
                                          record.marks)  # fmt: skip
        labels = (documents.verdict_object(record.namespace, record.name, rules, record.uid, ref,
                                           documents.verdict_labels(track, self._slot(record.uid))
                                           )["metadata"]["labels"]
                  if rules is not None else {})  # fmt: skip
        name = rules.name if rules is not None else None
        doc = verdict_document(record.namespace, record.name, name, status, labels)
        return outgoing(sink, self.deliveries.cluster, doc, record.transitions,
                        _event_time(track, self.clock))  # fmt: skip

    def delivered(self, ended: Ended) -> None:
        """An event sent to an end (delivered, refused, given up): recorded on its verdict,
        so that no leader sends it again."""
        record = self.records.get(ended.uid)
        if record is None:
            return
        record.marks = {**record.marks, ended.mark.sink: ended.mark}
        self._owe(record)
        track = record.track
        rules = self.deathwatches.get(record.deathwatch)
        if track is not None and rules is not None and record.persisted:
            self.writer.want(self._verdict(track, record, rules, priority=LOW))

    def undecodable(self, error: Undecodable) -> None:
        if error.who not in self.malformed:
            self.malformed.add(error.who)
            log.warning("object skipped: malformed", object=error.who, error=error.problem)

    # --- listings (the pod reflector) -------------------------------------------------------

    def listing(self, scope: str | None) -> None:
        self.records.begin_listing(scope)

    def listed(self, scope: str | None) -> None:
        """A complete listing did not show these: deleted while nobody watched. A live one
        is Gone (Unobserved): how it ended is unknown; an ended one's retention starts."""
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
        step = memory.remove(record.memory, now, None, self.policies, self.deadlines)
        self._settle(step, record, rules)

    # --- DeathWatches (kopf's handler) ------------------------------------------------------

    def on_deathwatch(self, event_type: str | None, body: Mapping[str, Any]) -> Change | None:
        """A DeathWatch event. Returns the change when its pods must be listed and adopted
        (it is new or selects differently: no pod event will tell of the pods it now
        selects, and the controller keeps no copy of pods that are not sandboxes)."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace") or "default", meta.get("name") or "")
        if event_type == "DELETED" or meta.get("deletionTimestamp"):
            self._drop_deathwatch(key)
            return None
        status = body.get("status")
        if self.assigned is not None:  # sharded: parts applied, not replaced (no term to compare)
            self._keep_parts(key, status)
        else:
            self.writer.observed(DW_PLURAL, *key, status if isinstance(status, dict) else {},
                                 str(meta.get("resourceVersion") or ""))  # fmt: skip
        change = self.deathwatches.update(body)
        if change is None:
            return None
        if change.rules is not None:
            # restored records wait for their DeathWatch's settings (their window multiplier,
            # their agent ports): from now on they are judged with them
            for record in self.records.of_deathwatch(key):
                if record.memory is not None:
                    record.memory.settings = change.rules.settings
        return change if change.rules is not None and change.select else None

    def _keep_parts(self, key: DeathWatchKey, status: Any) -> None:
        """The other shards' parts of a DeathWatch's status, as they wrote them (shard 0
        sums them)."""
        try:
            parts = msgspec.convert((status or {}).get("shards") or [], list[ShardPart])
        except (msgspec.ValidationError, AttributeError):
            return
        self.parts[key] = {p.shard: p for p in parts if p.shard != self.shard.index}

    def adopt(self, key: DeathWatchKey, revision: Revision, pods: Iterable[PodView],
              versions: Mapping[str, str] | None = None) -> int:  # fmt: skip
        """Pods of a page just listed for the DeathWatch `key` at `revision`: each one it
        selects that no event has brought yet. Returns how many; 0 when the DeathWatch has
        changed or gone meanwhile (the newer revision's own listing adopts them).
        `versions`: each pod's resourceVersion by uid, so that an older event of it still in
        the watch stream is not judged after this newer state."""
        rules = self.deathwatches.current(key, revision)
        if rules is None:
            return 0
        adopted = 0
        for pod in pods:
            if not self.mine(pod.uid, "pods"):
                continue
            if self.records.get(pod.uid) is not None or self.records.recently_deleted(pod.uid):
                continue  # an event brought it already, or its deletion came after this list
            owner = self.deathwatches.owner(pod)
            if owner is None or owner.key != key:
                continue
            record = self._track(pod, rules, listed=False)
            self.records.newer(pod.uid, (versions or {}).get(pod.uid, ""))
            self._judge(EventType.LISTED, pod, record, rules, True, None)
            adopted += 1
        return adopted

    def _drop_deathwatch(self, key: DeathWatchKey) -> None:
        """The DeathWatch is gone: its verdicts go with it (ownerReferences), so does our
        memory of them."""
        if not self.deathwatches.remove(key):
            return
        for record in self.records.of_deathwatch(key):
            self._forget(record)
            self.writer.forget(*record.verdict)
        self.summaries.drop(key)
        self.writer.forget(DW_PLURAL, *key)

    # --- agent-sandbox Sandboxes (their reflector) ------------------------------------------

    def on_agent_sandbox(self, kind: EventType, obj: SandboxObject) -> None:
        """A Sandbox as its watch shows it. When what its verdicts name changes (a claim
        adopted it from its warm pool), each of its pods' verdicts says so: same verdict,
        same pod uid, and now its claim."""
        if kind is EventType.DELETED:
            self.agent_sandboxes.remove(obj.namespace, obj.name)
            return
        if not self.agent_sandboxes.update(obj):
            return
        for record in self.records.of_agent_sandbox(obj.namespace, obj.name):
            track = record.track
            rules = self.deathwatches.get(record.deathwatch)
            if track is not None and rules is not None and record.persisted:
                self.writer.want(self._verdict(track, record, rules))

    # --- verdicts (their reflector) ---------------------------------------------------------

    def restore(self, verdict: Verdict) -> bool:
        """A verdict listed at start, before any pod: the engine's memory rebuilt from it
        (nothing it needs lives only in memory). False if it cannot be used. It is judged
        with its DeathWatch's settings: at once if that DeathWatch is compiled already, else
        as soon as it is (`on_deathwatch`); until then, the defaults."""
        status = verdict.status or {}
        if not self.mine(verdict.labels.get(POD_UID_LABEL) or status.get("podUID"), "verdicts"):
            return False
        self.writer.knows(SV_PLURAL, verdict.namespace, verdict.name, status, verdict.version,
                          verdict.labels)  # fmt: skip
        track = documents.track_from_status(verdict.namespace, verdict.name, status)
        if track is None:
            return False
        try:
            remembered = memory.restored(track, self.policies, self.deadlines)
        except ValueError as exc:  # a policy that is no longer installed
            log.error("verdict not restored", namespace=verdict.namespace, pod=verdict.name,
                      error=str(exc))  # fmt: skip
            return False
        key = (verdict.namespace, verdict.deathwatch)
        rules = self.deathwatches.get(key)
        if rules is not None:
            remembered.settings = rules.settings
        older = self.records.named(verdict.namespace, verdict.name)
        if older is not None:  # two verdicts of one name cannot be: the later listed wins
            self._forget(older)
        record = self.records.add(track.uid, verdict.namespace, verdict.name, key)
        record.memory = remembered
        record.persisted = True
        record.node = status.get("node") if isinstance(status.get("node"), str) else None
        record.shield, record.shield_since = _restored_shield(status)
        ref = _restored_sandbox(status)
        if ref is not None:
            self.records.link(record, ref.name)
            self.agent_sandboxes.remember(verdict.namespace, ref)
        deleted_at = parse_time(status.get("podDeletedAt"))
        if deleted_at is not None:  # the retention clock carries over the restart
            self.records.ended(record, deleted_at)
        record.counted = decisions.facts(track, record.shield, record.node)
        self.summaries.apply(key, None, record.counted)
        record.transitions, marks = documents.delivery_from_status(status)
        if marks:
            record.marks = marks
        self._owe(record, track)  # what no mark covers is sent when this replica leads
        self.wake.set()
        return True

    def on_verdict(self, kind: EventType, verdict: Verdict) -> None:
        """A SandboxVerdict as its watch shows it (the leader's writes, seen by a standby;
        another term's, seen by a leader)."""
        status = None if kind is EventType.DELETED else verdict.status
        uid = verdict.labels.get(POD_UID_LABEL) or (verdict.status or {}).get("podUID")
        if not self.mine(uid, "verdicts"):
            return
        key = (SV_PLURAL, verdict.namespace, verdict.name)
        if status:
            self._told(verdict.namespace, verdict.name, status)
        if status and self.deliveries and not self.writer.leading:
            self._level(verdict.namespace, verdict.name, status)
        contested = self.writer.observed(*key, status, verdict.version, verdict.labels)
        if contested:
            self.republish([key])
        elif (
            kind is EventType.ADDED
            and self.writer.leading
            and not verdict.status
            and self.records.named(verdict.namespace, verdict.name) is None
            and uid
        ):
            # created, status-less, for a pod this leader does not track: an earlier term's
            # create that landed after this term retired the verdict. Not left behind.
            self.writer.want(Desired(*key, delete=uid, priority=LOW, slot=self._slot(uid)))

    def _told(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """A pod this replica found gone with nobody watching (Unobserved: a standby that
        joined after the deletion, a listing after a restart) whose verdict says how it ended:
        another replica saw it end. Known replaces unknown, so every replica holds the verdict
        one that watched from the start holds (issue #40), and none that takes over writes
        Unobserved over it."""
        record = self.records.named(namespace, name)
        mine = record.memory.track if record is not None and record.memory is not None else None
        if record is None or mine is None or mine.cause is not Cause.UNOBSERVED:
            return
        theirs = documents.track_from_status(namespace, name, status)
        if (
            theirs is None
            or theirs.uid != record.uid
            or not theirs.state.terminal
            or theirs.cause in (None, Cause.UNOBSERVED)
        ):
            return
        try:
            remembered = memory.restored(theirs, self.policies, self.deadlines)
        except ValueError:
            return  # its policy is not installed here: the verdict stands as the API holds it
        assert record.memory is not None  # noqa: S101 - checked above (mine)
        remembered.settings = record.memory.settings
        record.memory = remembered
        counted = decisions.facts(theirs, record.shield, record.node)
        self.summaries.apply(record.deathwatch, record.counted, counted)
        record.counted = counted
        log.info("a deletion this replica did not see: the verdict says how it ended",
                 namespace=namespace, pod=name, uid=record.uid, state=str(theirs.state),
                 cause=str(theirs.cause))  # fmt: skip
        rules = self.deathwatches.get(record.deathwatch)
        if rules is not None:  # what this replica owes is now what the API holds: nothing
            self.writer.want(self._verdict(theirs, record, rules, priority=LOW))

    def _level(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """A standby takes the leader's word for what was delivered (and how its verdict's
        transitions are numbered, while the two agree on its state), so that taking over it
        sends only what no mark covers."""
        record = self.records.named(namespace, name)
        track = record.track if record is not None else None
        if record is None or track is None or status.get("podUID") != record.uid:
            return
        transitions, marks = documents.delivery_from_status(status)
        if status.get("state") == track.state.value:
            record.transitions = transitions
        if marks:
            record.marks = marks
        self._owe(record, track)

    def republish(self, keys: Iterable[ObjectKey]) -> None:
        """Say these objects again, as this controller judges them now (taking over: what the
        old leader left different; leading: what another term's write changed). A
        DeathWatch's status is said again at the next publish, as every second."""
        for plural, namespace, name in keys:
            if plural == DW_PLURAL:
                continue
            record = self.records.named(namespace, name)
            track = record.track if record else None
            rules = self.deathwatches.get(record.deathwatch) if record else None
            if record is None or track is None or rules is None or not record.persisted:
                continue
            self.writer.want(self._verdict(track, record, rules))

    # --- time: Suspect windows, retention, coverage -----------------------------------------

    def _current(self, deadline: datetime, uid: str) -> bool:
        record = self.records.get(uid)
        return memory.is_current(record.memory if record else None, deadline)

    def next_deadline(self) -> datetime | None:
        """When the next Suspect window closes (None: none is open)."""
        return self.deadlines.next(self._current)

    def expire(self) -> None:
        """Judge every Suspect whose window has closed. One that fails (a bug: a policy's
        error is contained by the engine) is reported and the others are still judged; its
        next pod event judges it."""
        now = self.clock()
        for _, uid in self.deadlines.take(lambda deadline: deadline <= now, self._current):
            record = self.records.get(uid)
            rules = self.deathwatches.get(record.deathwatch) if record else None
            if record is None or record.memory is None or rules is None:
                continue
            try:
                step = memory.expire(record.memory, now, self.policies, self.deadlines)
                self._settle(step, record, rules)
            except Exception as exc:
                self.metrics.handler_errors.labels("expire").inc()
                log.error("a Suspect window could not be judged; its next pod event judges it",
                          uid=uid, namespace=record.namespace, pod=record.name,
                          exc_info=exc)  # fmt: skip

    def retire(self) -> int:
        """Delete the verdicts of pods gone for longer than their DeathWatch's retention,
        but for those a sink is still owed (until the sink's maxAge: then it is given up,
        said on the verdict, counted)."""
        now = self.clock()
        given_up = self._expire_deliveries(now)
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
                                         slot=self._slot(record.uid)))  # fmt: skip
            self._forget(record)
            retired += 1
        return retired

    def _expire_deliveries(self, now: datetime) -> set[str]:
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
            track = record.track
            mark = DeliveryMark(
                sink=sink, id=event_id(uid, owed.state, owed.sequence), sequence=owed.sequence,
                state=owed.state, outcome=DeliveryOutcome.EXPIRED, at=now,
                message=f"owed for {age:.0f}s, past the sink's maxAge",
            )  # fmt: skip
            self.deliveries.sinks[sink].drop(uid)
            if track is not None:
                self.delivered(Ended(uid, mark))
        return given_up

    def reshield(self) -> None:
        """Claims go stale with no event: once a tick, judge again the live sandboxes on the
        nodes whose claim changed or expired (all of them when the Leases became readable or
        unreadable); a verdict is written for each shield that changed."""
        if self.coverage is None:
            return
        nodes = self.coverage.changed_nodes()
        if nodes is not None and not nodes:
            return
        records = list(self.records) if nodes is None else self.records.on_nodes(nodes)
        for record in records:
            track = record.track
            rules = self.deathwatches.get(record.deathwatch)
            if track is None or rules is None or not record.persisted:
                continue
            if track.state.terminal and record.shield is not None:
                continue
            record.judged_for = None  # judge it afresh
            shield = self._shield(record, rules)
            if shield != record.shield:
                self._settle(Step(track), record, rules, shield=shield)

    def on_coverage(self, leases: Iterable[Mapping[str, Any]]) -> None:
        if self.coverage is not None:
            self.coverage.read(leases, self.clock())

    # --- DeathWatch status ------------------------------------------------------------------

    def publish(self) -> None:
        """Want the status of every DeathWatch (the writer sends only what changed), and
        set the gauges; the counts are kept as sandboxes change, so this costs the same with
        30 or 30,000 of them."""
        now, fresh = self.clock(), self.fresh()
        reading = self.firewall.reading
        coverage = reading.coverage()
        leader = self.leader()
        keys = list(self.deathwatches)
        backlogs = self.deliveries.backlogs(keys) if self.deliveries else None
        for key in keys:
            try:
                conditions = self.deathwatches.conditions[key] = documents.deathwatch_conditions(
                    self.deathwatches.conditions.get(key, ()), now,
                    invalid=self.deathwatches.invalid.get(key), fresh=fresh,
                    stale_after=self.stale_after, firewall=reading,
                    backlogs=backlogs.get(key, []) if backlogs is not None else None,
                )  # fmt: skip
                rules = self.deathwatches.get(key)
                status = documents.deathwatch_status(
                    self.summaries[key], coverage, conditions,
                    rules.generation if rules else None, leader,
                )  # fmt: skip
                document = (
                    self._shard_status(key, status, rules.generation if rules else None)
                    if self.assigned is not None else to_document(status)
                )  # fmt: skip
            except Exception:
                self.metrics.handler_errors.labels("publish").inc()
                log.exception("deathwatch status not computed", namespace=key[0], deathwatch=key[1])
                continue
            if self.assigned is not None:
                manager = f"deathwatch-shard-{self.shard.index}"
                self.writer.want(Desired(DW_PLURAL, *key, status=document, priority=LOW,
                                         apply_as=manager))  # fmt: skip
            else:
                self.writer.want(Desired(DW_PLURAL, *key, status=document, priority=LOW))
        for state in State:
            self.metrics.tracked.labels(str(state)).set(self.summaries.states[state])
        if self.coverage is not None:
            for cs in ConditionStatus:
                self.metrics.shielded.labels(str(cs)).set(self.summaries.shields[cs])
        self.metrics.node_sandboxes.clear()  # a node with none left has no series
        for (node, shielded), count in self.summaries.nodes.items():
            self.metrics.node_sandboxes.labels(node, shielded).set(count)
        self.metrics.write_backlog.set(self.writer.backlog)
        for name, box in self.deliveries.sinks.items():
            oldest = box.oldest()
            self.metrics.delivery_backlog.labels(name).set(len(box.owed))
            self.metrics.delivery_oldest.labels(name).set(
                (now - oldest).total_seconds() if oldest is not None else 0.0
            )

    def _shard_status(self, key: DeathWatchKey, whole: Any, generation: int | None
                      ) -> dict[str, Any]:  # fmt: skip
        """Sharded: this shard's part of the DeathWatch's status; shard 0's carries the totals
        of every part too (and the conditions, computed from what it sees: ADR 0025)."""
        mine = documents.shard_part(self.summaries[key], self.shard.index,
                                    slots_text(self.owned()), self.leader())  # fmt: skip
        if self.shard.index != 0:
            return {"shards": [to_document(mine)]}
        parts = [*self.parts.get(key, {}).values(), mine]
        return to_document(documents.sharded_status(parts, whole.firewall, whole.conditions,
                                                    generation))  # fmt: skip

    def unannounced_deaths(self, window: timedelta = EVENT_RECONCILE_WINDOW) -> list[PodEvent]:
        """The SandboxDead Event of every Dead verdict declared within `window`: what a crash
        (or a leader losing its lease) between a verdict and its Event could have left unsaid.
        Older ones are left alone: the API server has expired their Events (--event-ttl)."""
        since = self.clock() - window
        out = []
        for record in self.records:
            track = record.track
            if (
                track is not None
                and track.state is State.DEAD
                and track.evidence is not None
                and track.evidence.declared_at >= since
            ):
                out.append(documents.dead_event(track))
        return out


def _event_time(track: Track, clock: Callable[[], datetime]) -> datetime:
    """The time an event about this transition carries: when the verdict was declared (Dead,
    Gone), else when its state was entered."""
    if track.state.terminal and track.evidence is not None:
        return track.evidence.declared_at
    return track.changed_at or clock()


def _restored_sandbox(status: Mapping[str, Any]) -> SandboxRef | None:
    """The agent-sandbox Sandbox a verdict names, if it names one it can be read from."""
    try:
        return msgspec.convert(status.get("sandbox"), SandboxRef | None)
    except msgspec.ValidationError:
        return None


def _restored_shield(status: Mapping[str, Any]) -> tuple[Shield | None, datetime | None]:
    """The Shielded condition a verdict was published with: a restart neither repeats the
    spell's Event nor moves its lastTransitionTime."""
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == ConditionType.SHIELDED:
            try:
                state = ConditionStatus(str(c.get("status")))
            except ValueError:
                return None, None
            shield = Shield(state, str(c.get("reason", "")), str(c.get("message", "")))
            return shield, parse_time(c.get("lastTransitionTime"))
    return None, None
