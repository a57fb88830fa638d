"""One pass per event. A pod's observation flows one way through the controller's parts,
each entered once (docs/adr/0014 has the diagram):

    pod reflector ─ PodView ─▶ Controller.on_pod
        DeathWatches.owner   which DeathWatch judges it (compiled once per generation)
        Sandboxes            its record: DeathWatch, node, addresses; a name reused
        Fleet                the engine: the next Track and what happened (signals)
        Shielding            its shield, only when what that depends on changed
        decide               what the step means: Events, written or not, counted how
        Summaries            its DeathWatch's counts, by difference
        documents            the verdict status, built once
        Writer               sent (leader), or owed as a digest (standby)

The other inputs take the same road from `_settle` on: a Suspect window closing on the clock
(`expire`), a pod no complete listing shows (`listed`), a node's coverage changing
(`reshield`). An agent-sandbox Sandbox (`on_agent_sandbox`) changes only what its pods'
verdicts name, and what a pod's deletion means (read in `_judge`, handed to the engine).
Verdicts the API holds come back on their own watch (`on_verdict`): listed at start they
rebuild the engine's memory (`restore`), watched they keep a standby level with the leader.
All calls run on the event loop; nothing here blocks or does I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import msgspec
import structlog

from deathwatch._engine.engine import SignalKind, Step, Track
from deathwatch._engine.fleet import Fleet
from deathwatch._engine.podview import PodView
from deathwatch._engine.timeutil import UTC, parse_time
from deathwatch._engine.verdict import Cause, State, origin_of
from deathwatch._operator import decisions, documents
from deathwatch._operator.agent_sandboxes import AgentSandboxes, SandboxObject
from deathwatch._operator.deathwatches import Change, DeathWatches
from deathwatch._operator.decisions import Announcement, Before
from deathwatch._operator.documents import FirewallReading, PodEvent
from deathwatch._operator.metrics import Metrics
from deathwatch._operator.reflector import Kind, Undecodable
from deathwatch._operator.resources import (
    DW_PLURAL,
    POD_UID_LABEL,
    SV_PLURAL,
    ConditionStatus,
    ConditionType,
    EventReason,
    SandboxRef,
    to_document,
)
from deathwatch._operator.sandboxes import Sandbox, Sandboxes
from deathwatch._operator.shield import Shield
from deathwatch._operator.shielding import Shielding
from deathwatch._operator.spec import Watch
from deathwatch._operator.summary import Summaries
from deathwatch._operator.writer import LOW, NORMAL, URGENT, Desired, Key, Writer
from deathwatch._policies import PolicySettings

log = structlog.get_logger("deathwatch.controller")
# Dead verdicts younger than this get their Event re-posted at start and takeover (under the
# API server's default 1 h Event TTL, so an Event that was posted still exists and is a 409)
EVENT_RECONCILE_WINDOW = timedelta(minutes=50)
KEEP = object()  # "the shield did not need judging again"


class Verdict:
    """A SandboxVerdict as its watch shows it: just what the controller reads."""

    __slots__ = ("labels", "name", "namespace", "status", "version", "watch")

    def __init__(self, namespace: str, name: str, version: str, watch: str,
                 labels: Mapping[str, str], status: dict[str, Any] | None) -> None:  # fmt: skip
        self.namespace, self.name, self.version = namespace, name, version
        self.watch, self.labels, self.status = watch, labels, status


class Controller:
    def __init__(
        self,
        *,
        deathwatches: DeathWatches,
        sandboxes: Sandboxes,
        fleet: Fleet,
        summaries: Summaries,
        writer: Writer,
        metrics: Metrics,
        shielding: Shielding | None = None,
        agent_sandboxes: AgentSandboxes | None = None,
        leader: Callable[[], str | None] = lambda: None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.deathwatches = deathwatches
        self.sandboxes = sandboxes
        self.fleet = fleet
        self.summaries = summaries
        self.writer = writer
        self.metrics = metrics
        self.shielding = shielding  # None: no firewall configured, no Shielded condition
        # the agent-sandbox Sandboxes as their watch shows them (empty where none are installed)
        self.agent_sandboxes = agent_sandboxes or AgentSandboxes()
        self.leader = leader
        self.clock = clock
        self.firewall = FirewallReading(None)  # the DaemonSet, as the probe loop last read it
        self.fresh: Callable[[], bool | None] = lambda: None  # are the pod streams alive
        self.stale_after = 90.0
        self.wake = asyncio.Event()  # a new Suspect deadline to wait for
        self.malformed: set[str] = set()  # objects reported undecodable (once each)
        self.policy_failing: set[str] = set()  # pod uids in a policy-error spell

    # --- pods ---------------------------------------------------------------------------

    def on_pod(self, kind: Kind, pod: PodView, received: float | None = None,
               version: str = "") -> None:  # fmt: skip
        """A pod event or a listed pod: one pass, from the engine to the writer. `version`:
        its resourceVersion; a state older than one already judged is not judged again (a
        watch event still in the stream behind a newer listing, a DeathWatch's adoption)."""
        listed = kind is Kind.LISTED
        deleted_at = self.clock() if kind is Kind.DELETED else None
        if not self.sandboxes.newer(pod.uid, version):
            return
        seen = self.sandboxes.observe(pod, listed, deleted_at)
        if seen is None:
            if kind is Kind.DELETED:
                self.sandboxes.deleted(pod.uid)
                return
            owner = self.deathwatches.owner(pod)
            if owner is None:
                return  # not a sandbox (or its DeathWatch is gone or invalid)
            sandbox, changed, watch = self._track(pod, owner, listed, deleted_at), True, owner
            self.sandboxes.newer(pod.uid, version)  # noted: its older states come to nothing
        else:
            sandbox, changed = seen
            found = self.deathwatches.get(sandbox.watch)
            if found is None:
                return  # its DeathWatch is invalid for now: judged again once it is valid
            watch = found
        self._judge(kind, pod, sandbox, watch, changed, received)

    def _track(self, pod: PodView, watch: Watch, listed: bool,
               deleted_at: datetime | None = None) -> Sandbox:  # fmt: skip
        older = self.sandboxes.named(pod.namespace, pod.name)
        if older is not None and older.uid != pod.uid:
            self._forget(older)  # a new pod took the name: its verdict replaces the old one's
        return self.sandboxes.add_pod(pod, watch.key, listed, deleted_at)

    def _judge(self, kind: Kind, pod: PodView, sandbox: Sandbox, watch: Watch, changed: bool,
               received: float | None) -> None:  # fmt: skip
        now = self.clock()
        deletion = Cause.DELETED
        if sandbox.agent_sandbox is not None and (
            kind is Kind.DELETED or pod.deletion_requested_at is not None
        ):
            # the pod never says why it was deleted; its Sandbox does (suspended, expired)
            deletion = self.agent_sandboxes.fate(
                pod.namespace, sandbox.agent_sandbox, pod.deletion_requested_at or now
            )
        if kind is Kind.DELETED:
            step = self.fleet.remove(pod.uid, now, pod, deletion)
            if step is None:
                return
        else:
            step = self.fleet.observe(pod, now, watch.policy, watch.settings, deletion)
        if not step.changed and not step.signals and not changed:
            return  # nothing it says changed (a heartbeat of the kubelet): nothing to do
        self._settle(step, sandbox, watch, received)

    def _settle(
        self,
        step: Step,
        sandbox: Sandbox,
        watch: Watch,
        received: float | None = None,
        shield: object = KEEP,  # a Shield, None, or KEEP: judge it here if need be
    ) -> None:
        """What a step means, applied: reported, counted, written. The one tail of every
        input (pod events, listings, expiries, coverage)."""
        track = step.track
        self._report(step, sandbox.node)
        if shield is KEEP:
            shield = self._shield(sandbox, watch)
        assert shield is None or isinstance(shield, Shield)  # noqa: S101 - KEEP resolved
        claim = self.shielding.claim(sandbox.node) if self.shielding else None
        before = Before(sandbox.persisted, sandbox.shield, sandbox.shield_since, sandbox.node)
        outcome = decisions.decide(step, before, self.clock(), shield, claim)
        if outcome.forget:
            self._forget(sandbox)
            return
        if any(a.reason is EventReason.SANDBOX_UNSHIELDED for a in outcome.events):
            self._unshielded(track, sandbox, outcome.shield)
        sandbox.shield, sandbox.shield_since = outcome.shield, outcome.shield_since
        self.summaries.apply(sandbox.watch, sandbox.counted, outcome.facts)
        sandbox.counted = outcome.facts
        if outcome.write:
            sandbox.persisted = True
            self.writer.want(self._verdict(track, sandbox, watch, outcome.events, received))
        if track.deadline is not None:
            self.wake.set()

    def _shield(self, sandbox: Sandbox, watch: Watch) -> Shield | None:
        """Its shield judged again if what it depends on changed, else as it was."""
        if self.shielding is None:
            return None
        basis = (sandbox.node, sandbox.ips, watch.settings.agent_ports)
        if sandbox.shield is not None and sandbox.judged_for == basis:
            return sandbox.shield
        shield = self.shielding.judge(sandbox.node, sandbox.ips, watch.settings.agent_ports)
        if shield is None:
            return sandbox.shield  # nothing read since start: the restored shield stands
        sandbox.judged_for = basis
        return shield

    def _unshielded(self, track: Track, sandbox: Sandbox, shield: Shield | None) -> None:
        assert shield is not None  # noqa: S101 - an Unshielded Event has a shield
        log.warning("sandbox not shielded", namespace=track.namespace, pod=track.name,
                    uid=track.uid, node=sandbox.node, reason=shield.reason,
                    message=shield.message)  # fmt: skip
        self.metrics.unshielded_spells.labels(shield.reason).inc()

    def _verdict(self, track: Track, sandbox: Sandbox, watch: Watch,
                 announce: Iterable[Announcement] = (), received: float | None = None
                 ) -> Desired:  # fmt: skip
        dead = track.state is State.DEAD
        owner = sandbox.agent_sandbox
        ref = self.agent_sandboxes.ref(track.namespace, owner) if owner is not None else None
        status, obj, labels, events = documents.verdict(
            track, watch, sandbox.node, sandbox.deleted_at, sandbox.shield, sandbox.shield_since,
            announce, ref,
        )  # fmt: skip
        return Desired(
            SV_PLURAL, track.namespace, track.name,
            status=status,
            create=obj,
            labels=labels,
            events=events,
            priority=URGENT if dead else NORMAL,
            received=received if dead else None,
            ready_drop_at=track.ready_drop_at if dead else None,
        )  # fmt: skip

    def _report(self, step: Step, node: str | None) -> None:
        """Logs and metrics of what happened: observability only, nothing decided here."""
        track = step.track
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
        # a policy's failure is logged once per spell, and its recovery
        if track.policy_error is not None and track.uid not in self.policy_failing:
            self.policy_failing.add(track.uid)
            log.error("policy failed; the pod is judged by container-state until it works again",
                      namespace=track.namespace, pod=track.name, uid=track.uid,
                      policy=track.policy, error=track.policy_error)  # fmt: skip
        elif track.policy_error is None and track.uid in self.policy_failing:
            self.policy_failing.discard(track.uid)
            log.info("policy works again", namespace=track.namespace, pod=track.name,
                     uid=track.uid, policy=track.policy)  # fmt: skip

    def _forget(self, sandbox: Sandbox) -> None:
        self.sandboxes.remove(sandbox.uid)
        self.summaries.apply(sandbox.watch, sandbox.counted, None)
        self.summaries.dirty.add(sandbox.watch)
        self.fleet.forget(sandbox.uid)
        self.policy_failing.discard(sandbox.uid)

    def undecodable(self, error: Undecodable) -> None:
        if error.who not in self.malformed:
            self.malformed.add(error.who)
            log.warning("object skipped: malformed", object=error.who, error=error.problem)

    # --- listings (the pod reflector) -------------------------------------------------------

    def listing(self, scope: str | None) -> None:
        self.sandboxes.begin_listing(scope)

    def listed(self, scope: str | None) -> None:
        """A complete listing did not show these: deleted while nobody watched. A live one
        is Gone (Unobserved): how it ended is unknown; an ended one's retention starts."""
        now = self.clock()
        for sandbox in self.sandboxes.unlisted(scope):
            self.gone(sandbox.uid, now)

    def gone(self, uid: str, now: datetime | None = None) -> None:
        """A pod found absent from the API."""
        sandbox = self.sandboxes.get(uid)
        if sandbox is None:
            return
        now = now or self.clock()
        self.sandboxes.ended(sandbox, now)
        step = self.fleet.remove(uid, now, None)
        watch = self.deathwatches.get(sandbox.watch)
        if step is not None and watch is not None:
            self._settle(step, sandbox, watch)

    # --- DeathWatches (kopf's handler) ------------------------------------------------------

    def on_deathwatch(self, event_type: str | None, body: Mapping[str, Any]) -> Change | None:
        """A DeathWatch event. Returns the change when its pods must be listed and adopted
        (it is new or selects differently: no pod event will tell of the pods it now
        selects, and the controller keeps no copy of pods that are not sandboxes)."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace") or "default", meta.get("name") or "")
        if event_type == "DELETED" or meta.get("deletionTimestamp"):
            self._drop_watch(key)
            return None
        status = body.get("status")
        if self.writer.observed(DW_PLURAL, *key, status if isinstance(status, dict) else {},
                                str(meta.get("resourceVersion") or "")):  # fmt: skip
            self.summaries.dirty.add(key)  # another term's write: say it again
        change = self.deathwatches.update(body)
        if change is None:
            return None
        self.summaries.dirty.add(key)
        return change if change.watch is not None and change.select else None

    def adopt(self, key: tuple[str, str], version: tuple[str, int | None],
              pods: Iterable[PodView], versions: Mapping[str, str] | None = None
              ) -> int:  # fmt: skip
        """Pods of a page just listed for the DeathWatch `key` at `version`: each one it
        selects that no event has brought yet. Returns how many; 0 when the DeathWatch has
        changed or gone meanwhile (the newer version's own listing adopts them). `versions`:
        each pod's resourceVersion by uid, so that an older event of it still in the watch
        stream is not judged after this newer state."""
        watch = self.deathwatches.current(key, version)
        if watch is None:
            return 0
        adopted = 0
        for pod in pods:
            if self.sandboxes.get(pod.uid) is not None or self.sandboxes.recently_deleted(pod.uid):
                continue  # an event brought it already, or its deletion came after this list
            owner = self.deathwatches.owner(pod)
            if owner is None or owner.key != key:
                continue
            sandbox = self._track(pod, watch, listed=False)
            self.sandboxes.newer(pod.uid, (versions or {}).get(pod.uid, ""))
            self._judge(Kind.LISTED, pod, sandbox, watch, True, None)
            adopted += 1
        return adopted

    def _drop_watch(self, key: tuple[str, str]) -> None:
        """The DeathWatch is gone: its verdicts go with it (ownerReferences), so does our
        memory of them."""
        if not self.deathwatches.remove(key):
            return
        for sandbox in self.sandboxes.of_watch(key):
            self._forget(sandbox)
            self.writer.forget(SV_PLURAL, sandbox.namespace, sandbox.name)
        self.summaries.drop(key)
        self.writer.forget(DW_PLURAL, *key)

    # --- agent-sandbox Sandboxes (their reflector) ------------------------------------------

    def on_agent_sandbox(self, kind: Kind, obj: SandboxObject) -> None:
        """A Sandbox as its watch shows it. When what its verdicts name changes (a claim
        adopted it from its warm pool), each of its pods' verdicts says so: same verdict,
        same pod uid, and now its claim."""
        if kind is Kind.DELETED:
            self.agent_sandboxes.remove(obj.namespace, obj.name)
            return
        if not self.agent_sandboxes.update(obj):
            return
        for sandbox in self.sandboxes.of_agent_sandbox(obj.namespace, obj.name):
            track = self.fleet.get(sandbox.uid)
            watch = self.deathwatches.get(sandbox.watch)
            if track is not None and watch is not None and sandbox.persisted:
                self.writer.want(self._verdict(track, sandbox, watch))

    # --- verdicts (their reflector) ---------------------------------------------------------

    def restore(self, verdict: Verdict) -> bool:
        """A verdict listed at start, before any pod: the engine's memory rebuilt from it
        (nothing it needs lives only in memory). False if it cannot be used."""
        status = verdict.status or {}
        self.writer.knows(SV_PLURAL, verdict.namespace, verdict.name, status, verdict.version,
                          verdict.labels)  # fmt: skip
        track = documents.track_from_status(verdict.namespace, verdict.name, status)
        if track is None:
            return False
        try:
            self.fleet.restore(track, PolicySettings())
        except ValueError as exc:  # a policy that is no longer installed
            log.error("verdict not restored", namespace=verdict.namespace, pod=verdict.name,
                      error=str(exc))  # fmt: skip
            return False
        key = (verdict.namespace, verdict.watch)
        older = self.sandboxes.named(verdict.namespace, verdict.name)
        if older is not None:  # two verdicts of one name cannot be: the later listed wins
            self._forget(older)
        sandbox = self.sandboxes.add(track.uid, verdict.namespace, verdict.name, key)
        sandbox.persisted = True
        sandbox.node = status.get("node") if isinstance(status.get("node"), str) else None
        sandbox.shield, sandbox.shield_since = _restored_shield(status)
        ref = _restored_sandbox(status)
        if ref is not None:
            self.sandboxes.link(sandbox, ref.name)
            self.agent_sandboxes.remember(verdict.namespace, ref)
        deleted_at = parse_time(status.get("podDeletedAt"))
        if deleted_at is not None:  # the retention clock carries over the restart
            self.sandboxes.ended(sandbox, deleted_at)
        sandbox.counted = decisions.facts(track, sandbox.shield, sandbox.node)
        self.summaries.apply(key, None, sandbox.counted)
        self.wake.set()
        return True

    def on_verdict(self, kind: Kind, verdict: Verdict) -> None:
        """A SandboxVerdict as its watch shows it (the leader's writes, seen by a standby;
        another term's, seen by a leader)."""
        status = None if kind is Kind.DELETED else verdict.status
        key = (SV_PLURAL, verdict.namespace, verdict.name)
        contested = self.writer.observed(*key, status, verdict.version, verdict.labels)
        if contested:
            self.republish([key])
        elif (
            kind is Kind.ADDED
            and self.writer.leading
            and not verdict.status
            and self.sandboxes.named(verdict.namespace, verdict.name) is None
        ):
            # created, status-less, for a pod this leader does not track: an earlier term's
            # create that landed after this term retired the verdict. Not left behind.
            uid = verdict.labels.get(POD_UID_LABEL)
            if uid:
                self.writer.want(Desired(*key, delete=uid, priority=LOW))

    def republish(self, keys: Iterable[Key]) -> None:
        """Say these objects again, as this controller judges them now (taking over: what the
        old leader left different; leading: what another term's write changed)."""
        for plural, namespace, name in keys:
            if plural == DW_PLURAL:
                self.summaries.dirty.add((namespace, name))
                continue
            sandbox = self.sandboxes.named(namespace, name)
            track = self.fleet.get(sandbox.uid) if sandbox else None
            watch = self.deathwatches.get(sandbox.watch) if sandbox else None
            if sandbox is None or track is None or watch is None or not sandbox.persisted:
                continue
            self.writer.want(self._verdict(track, sandbox, watch))

    # --- time: Suspect windows, retention, coverage -----------------------------------------

    def expire(self) -> None:
        for step in self.fleet.expire_due(self.clock()):
            sandbox = self.sandboxes.get(step.track.uid)
            watch = self.deathwatches.get(sandbox.watch) if sandbox else None
            if sandbox is not None and watch is not None:
                self._settle(step, sandbox, watch)
        failures, self.fleet.failures = self.fleet.failures, []
        for uid, exc in failures:
            sandbox = self.sandboxes.get(uid)
            self.metrics.handler_errors.labels("expire").inc()
            log.error("a Suspect window could not be judged; its next pod event judges it",
                      uid=uid, namespace=sandbox.namespace if sandbox else None,
                      pod=sandbox.name if sandbox else None, exc_info=exc)  # fmt: skip

    def retire(self) -> int:
        """Delete the verdicts of pods gone for longer than their DeathWatch's retention."""
        now = self.clock()
        retired = 0
        for sandbox in self.sandboxes.ended_ones():
            track = self.fleet.get(sandbox.uid)
            if track is None or sandbox.deleted_at is None or not track.state.terminal:
                continue
            watch = self.deathwatches.get(sandbox.watch)
            retention = watch.retention if watch else timedelta(0)
            declared = track.evidence.declared_at if track.evidence else sandbox.deleted_at
            if now < max(sandbox.deleted_at, declared) + retention:
                continue
            if sandbox.persisted:
                self.writer.want(Desired(SV_PLURAL, sandbox.namespace, sandbox.name,
                                         delete=sandbox.uid, priority=LOW))  # fmt: skip
            self._forget(sandbox)
            retired += 1
        return retired

    def reshield(self) -> None:
        """Claims go stale with no event: once a tick, judge again the live sandboxes on the
        nodes whose claim changed or expired (all of them when the Leases became readable or
        unreadable); a verdict is written for each shield that changed."""
        if self.shielding is None:
            return
        nodes = self.shielding.changed_nodes()
        if nodes is not None and not nodes:
            return
        sandboxes = list(self.sandboxes) if nodes is None else self.sandboxes.on_nodes(nodes)
        for sandbox in sandboxes:
            track = self.fleet.get(sandbox.uid)
            watch = self.deathwatches.get(sandbox.watch)
            if track is None or watch is None or not sandbox.persisted:
                continue
            if track.state.terminal and sandbox.shield is not None:
                continue
            sandbox.judged_for = None  # judge it afresh
            shield = self._shield(sandbox, watch)
            if shield != sandbox.shield:
                self._settle(Step(track), sandbox, watch, shield=shield)

    def on_coverage(self, leases: Iterable[Mapping[str, Any]]) -> None:
        if self.shielding is not None:
            self.shielding.read(leases, self.clock())

    # --- DeathWatch status ------------------------------------------------------------------

    def publish(self) -> None:
        """Want the status of every DeathWatch (the writer sends only what changed), and
        set the gauges; the counts are kept as sandboxes change, so this costs the same with
        30 or 30,000 of them."""
        now, fresh = self.clock(), self.fresh()
        coverage = self.firewall.coverage()
        leader = self.leader()
        for key in list(self.deathwatches):
            try:
                conditions = self.deathwatches.conditions[key] = documents.deathwatch_conditions(
                    self.deathwatches.conditions.get(key, ()), now,
                    invalid=self.deathwatches.invalid.get(key), fresh=fresh,
                    stale_after=self.stale_after, firewall=self.firewall,
                )  # fmt: skip
                watch = self.deathwatches.get(key)
                status = documents.deathwatch_status(
                    self.summaries[key], coverage, conditions,
                    watch.generation if watch else None, leader,
                )  # fmt: skip
                document = to_document(status)
            except Exception:
                self.metrics.handler_errors.labels("publish").inc()
                log.exception("deathwatch status not computed", namespace=key[0], deathwatch=key[1])
                continue
            self.writer.want(Desired(DW_PLURAL, *key, status=document, priority=LOW))
        self.summaries.dirty.clear()
        for state in State:
            self.metrics.tracked.labels(str(state)).set(self.summaries.states[state])
        if self.shielding is not None:
            for cs in ConditionStatus:
                self.metrics.shielded.labels(str(cs)).set(self.summaries.shields[cs])
        self.metrics.node_sandboxes.clear()  # a node with none left has no series
        for (node, shielded), count in self.summaries.nodes.items():
            self.metrics.node_sandboxes.labels(node, shielded).set(count)
        self.metrics.write_backlog.set(self.writer.backlog)

    def unannounced_deaths(self, window: timedelta = EVENT_RECONCILE_WINDOW) -> list[PodEvent]:
        """The SandboxDead Event of every Dead verdict declared within `window`: what a crash
        (or a leader losing its lease) between a verdict and its Event could have left unsaid.
        Older ones are left alone: the API server has expired their Events (--event-ttl)."""
        since = self.clock() - window
        return [
            documents.dead_event(track)
            for track in self.fleet
            if track.state is State.DEAD
            and track.evidence is not None
            and track.evidence.declared_at >= since
        ]


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
