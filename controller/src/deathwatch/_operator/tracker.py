"""The operator's state and decisions between the watches and the writer.

kopf handlers (app.py) call in here with pods and DeathWatches; the tracker feeds the engine,
decides which verdicts to persist and which Events to post (documents.py builds them, the
writer sends them), and keeps the bookkeeping the engine does not: which DeathWatch owns a
pod, when a pod vanished, when a pod was last seen by a watch. All calls happen on the event
loop; nothing here blocks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import msgspec
import structlog

from deathwatch._engine.engine import SignalKind, Step, Track
from deathwatch._engine.fleet import Fleet
from deathwatch._engine.podview import MalformedPod, PodView, read_pod
from deathwatch._engine.timeutil import UTC, parse_time
from deathwatch._engine.verdict import Cause, State
from deathwatch._operator import documents
from deathwatch._operator.documents import FirewallReading, PodEvent
from deathwatch._operator.metrics import Metrics
from deathwatch._operator.resources import (
    DW_PLURAL,
    SV_PLURAL,
    Condition,
    ConditionStatus,
    ConditionType,
    to_document,
)
from deathwatch._operator.shield import NodeCoverage, Shield, Sighting, judge, read_lease, sight
from deathwatch._operator.spec import SpecError, Watch, read_deathwatch
from deathwatch._operator.streams import STALE_AFTER, StreamActivity
from deathwatch._operator.writer import LOW, NORMAL, URGENT, Desired, Writer
from deathwatch._policies import PolicyRegistry, PolicySettings

log = structlog.get_logger("deathwatch.tracker")
# Dead verdicts younger than this get their Event re-posted at start and takeover (under the
# API server's default 1 h Event TTL, so an Event that was posted still exists and is a 409)
EVENT_RECONCILE_WINDOW = timedelta(minutes=50)
PUBLISH_SLICE = 256  # tracked sandboxes walked between two yields to the event loop
Key = tuple[str, str]


@dataclass(slots=True)
class PodRecord:
    """What the tracker knows about a tracked pod besides the engine's Track."""

    namespace: str
    name: str
    watch: Key
    node: str | None = None
    ips: tuple[str, ...] = ()
    shield: Shield | None = None  # as last published (None: no firewall to judge against)
    shield_since: datetime | None = None
    # what the shield was judged from (node, addresses, agent ports): a pod event that changes
    # none of these leaves it to the tick's per-node re-judging (Tracker.reshield)
    judged_for: tuple[str | None, tuple[str, ...], frozenset[int]] | None = None
    last_seen: float = 0.0  # monotonic; 0: restored from a verdict, not seen by a watch yet
    deleted_at: datetime | None = None  # when we learned the pod is gone (retention clock)
    persisted: bool = False  # a SandboxVerdict exists (or is being created) for it


def restored_shield(status: Mapping[str, Any]) -> tuple[Shield | None, datetime | None]:
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


@dataclass
class Tracker:
    registry: PolicyRegistry
    writer: Writer
    metrics: Metrics
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    fleet: Fleet = field(init=False)
    watches: dict[Key, Watch] = field(default_factory=dict)
    invalid: dict[Key, str] = field(default_factory=dict)  # DeathWatch -> why it is unusable
    generations: dict[Key, Any] = field(default_factory=dict)
    conditions: dict[Key, list[Condition]] = field(default_factory=dict)  # as last published
    records: dict[str, PodRecord] = field(default_factory=dict)  # pod uid -> record
    by_name: dict[Key, str] = field(default_factory=dict)  # (namespace, pod name) -> uid
    dirty: set[Key] = field(default_factory=set)  # DeathWatches whose status must be recomputed
    firewall: FirewallReading = field(default_factory=lambda: FirewallReading(None))
    streams: StreamActivity = field(default_factory=StreamActivity)
    stale_after: float = STALE_AFTER
    leader: Callable[[], str | None] = field(default=lambda: None)  # who writes (leader.py)
    last_event: dict[str, float] = field(default_factory=dict)  # resource -> monotonic time
    listing_started: float = 0.0  # monotonic time the latest (re)listing of pods began
    _in_listing: bool = False
    listings: int = 0  # pod (re)listings begun so far
    started: float = field(default_factory=time.monotonic)
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # a new deadline to wait for
    malformed: set[str] = field(default_factory=set)
    policy_failing: set[str] = field(default_factory=set)  # pod uids in a policy-error spell
    # the firewall agents' coverage Leases (shield.py); None: not configured, no Shielded
    coverage: dict[str, NodeCoverage] | None = None
    sightings: dict[str, Sighting] = field(default_factory=dict)
    coverage_read_at: float | None = None  # monotonic time of the last successful read
    coverage_interval: float = 5.0
    _node_keys: dict[str, tuple[NodeCoverage, bool] | None] = field(default_factory=dict)
    _observed_last: bool | None = None

    def __post_init__(self) -> None:
        self.fleet = Fleet(self.registry)

    # --- restart: rebuild from the verdicts in the API ------------------------------------

    def restore(self, verdicts: Iterable[Mapping[str, Any]]) -> int:
        """Adopt existing SandboxVerdicts before any pod event is handled. Returns the count."""
        restored = 0
        for sv in verdicts:
            meta = sv.get("metadata") or {}
            namespace, name = meta.get("namespace"), meta.get("name")
            status = sv.get("status") or {}
            if not namespace or not name:
                continue
            self.writer.knows(SV_PLURAL, namespace, name, status, meta.get("resourceVersion"))
            track = documents.track_from_status(namespace, name, status)
            if track is None:
                continue
            watch = ((sv.get("spec") or {}).get("deathWatch")) or ""
            try:
                self.fleet.restore(track, PolicySettings())
            except ValueError as exc:  # a policy that is no longer installed
                log.error("verdict not restored", namespace=namespace, pod=name, error=str(exc))
                continue
            self.records[track.uid] = PodRecord(
                namespace,
                name,
                (namespace, watch),
                status.get("node"),
                # the retention clock carries over the restart (None: the pod may still exist)
                deleted_at=parse_time(status.get("podDeletedAt")),
                persisted=True,
            )
            record = self.records[track.uid]
            record.shield, record.shield_since = restored_shield(status)
            self.by_name[(namespace, name)] = track.uid
            self.dirty.add((namespace, watch))
            restored += 1
        self.wake.set()
        return restored

    # --- pods -----------------------------------------------------------------------------

    def on_pod(
        self, event_type: str | None, body: Mapping[str, Any], watches: Iterable[Watch]
    ) -> None:
        now_mono = time.monotonic()
        self._note_event("pods", event_type, now_mono)
        try:
            pod = read_pod(body)
        except MalformedPod as exc:
            uid = str((body.get("metadata") or {}).get("uid"))
            if uid not in self.malformed:
                self.malformed.add(uid)
                meta = body.get("metadata") or {}
                log.warning(
                    "pod skipped: malformed",
                    namespace=meta.get("namespace"),
                    pod=meta.get("name"),
                    error=str(exc),
                )
            return
        # The DeathWatch index (filled by kopf before any handler runs) is the authority on
        # which DeathWatches exist: the DeathWatch handler may not have run yet at start-up.
        current = {w.key: w for w in watches}
        self.watches.update(current)
        record = self.records.get(pod.uid)
        watch = current.get(record.watch) if record else self._match(pod, current.values())
        if watch is None:
            return  # not a sandbox (or its DeathWatch is gone or invalid)
        now = self.clock()
        if event_type == "DELETED":
            step = self.fleet.remove(pod.uid, now, pod)
            if step is None:
                return
            record = self._record(pod, watch)
            record.deleted_at = record.deleted_at or now
        else:
            step = self.fleet.observe(pod, now, watch.policy, watch.settings)
            record = self._record(pod, watch)
        record.last_seen = now_mono
        self._after(step, watch, received=now_mono)

    def _note_event(self, resource: str, event_type: str | None, now_mono: float) -> None:
        self.last_event[resource] = now_mono
        self.metrics.last_event.labels(resource).set(time.time())
        if resource == "pods":
            # kopf (re)lists with event type None: a listing began if the last event was not one
            listing = event_type is None
            if listing and not self._in_listing:
                self.listing_started = now_mono
                self.listings += 1
            self._in_listing = listing

    @staticmethod
    def _match(pod: PodView, watches: Iterable[Watch]) -> Watch | None:
        candidates = sorted(
            (w for w in watches if w.selector.matches(pod.labels)), key=Watch.sort_key
        )
        return candidates[0] if candidates else None

    def _record(self, pod: PodView, watch: Watch) -> PodRecord:
        record = self.records.get(pod.uid)
        if record is None:
            previous = self.by_name.get((pod.namespace, pod.name))
            if previous is not None and previous != pod.uid:
                # a new pod took the name: its verdict replaces the old one's
                self.fleet.forget(previous)
                self.policy_failing.discard(previous)
                self.records.pop(previous, None)
            record = self.records[pod.uid] = PodRecord(pod.namespace, pod.name, watch.key)
            self.by_name[(pod.namespace, pod.name)] = pod.uid
        record.node = pod.node_name or record.node
        record.ips = pod.pod_ips or record.ips
        return record

    def _after(self, step: Step, watch: Watch, received: float | None = None) -> None:
        track = step.track
        record = self.records[track.uid]
        events: list[PodEvent] = []
        for signal in step.signals:
            if signal.kind is SignalKind.STATE_CHANGED:
                log.info(
                    "verdict",
                    namespace=track.namespace,
                    pod=track.name,
                    uid=track.uid,
                    **{"from": str(signal.previous), "to": str(track.state)},
                    policy=track.policy,
                    cause=str(track.cause) if track.cause else None,
                )
                self.metrics.verdicts.labels(
                    str(track.state), track.policy, str(track.cause or "")
                ).inc()
                if track.state is State.DEAD:
                    events.append(documents.dead_event(track))
                elif track.cause is Cause.UNOBSERVED:
                    log.warning(
                        "lost track: the pod is gone and nobody saw how it ended",
                        namespace=track.namespace,
                        pod=track.name,
                        uid=track.uid,
                        last_seen=str(signal.previous),
                    )
                    events.append(documents.lost_track_event(track, signal.previous))
            elif signal.kind is SignalKind.READY_DROPPED:
                self.metrics.ready_drops.labels(track.policy).inc()
            elif signal.kind is SignalKind.FLAPPED:
                self.metrics.flaps.labels(track.policy).inc()
            elif signal.kind is SignalKind.FALSE_POSITIVE:
                self.metrics.false_positives.labels(track.policy).inc()
                log.warning(
                    "false positive",
                    namespace=track.namespace,
                    pod=track.name,
                    uid=track.uid,
                    policy=track.policy,
                )
                events.append(documents.false_positive_event(track))
            elif signal.kind is SignalKind.PROBE_BLOCKED:
                events.append(documents.probe_blocked_event(track))
            elif signal.kind is SignalKind.POLICY_FAILED:
                self.metrics.policy_errors.labels(track.policy).inc()
        self._policy_spell(track)
        if not track.ever_ready and track.state.terminal and not record.persisted:
            # never a running sandbox and never written: nothing to keep
            self.fleet.forget(track.uid)
            self.policy_failing.discard(track.uid)
            self.records.pop(track.uid, None)
            self.dirty.add(watch.key)
            return
        if track.ever_ready or track.probe_blocked or record.persisted:
            events.extend(self._reshield(track, record, watch))
            self._want_verdict(track, record, watch, events, received)
        self.dirty.add(watch.key)
        if track.deadline is not None:
            self.wake.set()

    def _want_verdict(
        self,
        track: Track,
        record: PodRecord,
        watch: Watch,
        events: list[PodEvent],
        received: float | None = None,
    ) -> None:
        record.persisted = True
        dead = track.state is State.DEAD
        self.writer.want(
            Desired(
                SV_PLURAL,
                track.namespace,
                track.name,
                status=to_document(
                    documents.verdict_status(
                        track, record.node, record.deleted_at, record.shield, record.shield_since
                    )
                ),
                create=documents.verdict_object(track.namespace, track.name, watch.body),
                events=events,
                priority=URGENT if dead else NORMAL,
                received=received if dead else None,
                ready_drop_at=track.ready_drop_at if dead else None,
            )
        )

    # --- the firewall's shield over each sandbox (shield.py) -------------------------------

    def on_coverage(self, leases: Iterable[Mapping[str, Any]]) -> None:
        """The coverage Leases as just listed: note each node's renewal as first seen."""
        now, now_mono = self.clock(), time.monotonic()
        coverage: dict[str, NodeCoverage] = {}
        for lease in leases:
            claim = read_lease(lease)
            if claim is not None:
                coverage[claim.node] = claim
        cap = self.coverage_interval + 1.0
        self.sightings = {
            node: sight(self.sightings.get(node), claim, now, now_mono, cap)
            for node, claim in coverage.items()
        }
        self.coverage, self.coverage_read_at = coverage, now_mono

    def _coverage_observed(self, now_mono: float) -> bool | None:
        """The coverage Leases were read lately (True), not for too long (False: then every
        shield is Unknown rather than "exposed"), or not yet since start (None: the shields
        published before, restored with the verdicts, stand until the first read)."""
        grace = max(3 * self.coverage_interval, 15.0)
        if self.coverage_read_at is None:
            return None if now_mono - self.started <= grace else False
        return now_mono - self.coverage_read_at <= grace

    def shield_of(self, record: PodRecord, watch: Watch) -> Shield | None:
        now_mono = time.monotonic()
        observed = self._coverage_observed(now_mono)
        if self.coverage is None or observed is None:
            return record.shield
        node = record.node
        return judge(
            node,
            record.ips,
            watch.settings.agent_ports,
            self.coverage.get(node) if node else None,
            self.sightings.get(node) if node else None,
            now_mono,
            observed,
        )

    def _reshield(
        self, track: Track, record: PodRecord, watch: Watch, periodic: bool = False
    ) -> list[PodEvent]:
        """Update the record's shield; the Event that opens a spell without one. A verdict
        that is final keeps the shield it had when it was declared."""
        if track.state.terminal and record.shield is not None:
            return []
        basis = (record.node, record.ips, watch.settings.agent_ports)
        if not periodic and record.shield is not None and record.judged_for == basis:
            return []  # nothing it depends on changed with this event
        shield = self.shield_of(record, watch)
        if self._coverage_observed(time.monotonic()) is not None:
            record.judged_for = basis
        before, record.shield = record.shield, shield
        if shield is None or (before is not None and before.status is shield.status):
            return []
        record.shield_since = self.clock()
        if not shield.exposed or track.state.terminal:
            return []
        claim = self.coverage.get(record.node) if self.coverage and record.node else None
        spell = f"{record.node}/{shield.reason}/{claim.renew_time if claim else 'none'}"
        log.warning("sandbox not shielded", namespace=track.namespace, pod=track.name,
                    uid=track.uid, node=record.node, reason=shield.reason,
                    message=shield.message)  # fmt: skip
        self.metrics.unshielded_spells.labels(shield.reason).inc()
        return [documents.unshielded_event(track, shield, spell)]

    def _node_key(self, node: str, now_mono: float) -> tuple[NodeCoverage, bool] | None:
        """What a node's shields depend on: its claim (but for the renewal's time) and
        whether it has gone stale. Unchanged key: its sandboxes' shields are unchanged."""
        claim, seen = (self.coverage or {}).get(node), self.sightings.get(node)
        if claim is None or seen is None:
            return None
        stale = seen.age_then + (now_mono - seen.seen_at) > claim.valid_for
        return dataclasses.replace(claim, renew_time="", renewed_at=None), stale

    def reshield(self) -> None:
        """Claims go stale with no event: once per tick, find the nodes whose claim changed
        or expired, and judge again only the live sandboxes on them (all of them when the
        Leases became readable or unreadable); queue a verdict for each changed shield."""
        if self.coverage is None:
            return
        now_mono = time.monotonic()
        observed = self._coverage_observed(now_mono)
        if observed is None:
            return  # not read yet since start: the restored shields stand
        keys = {node: self._node_key(node, now_mono) for node in self.coverage}
        changed = {n for n in keys.keys() | self._node_keys.keys()
                   if keys.get(n) != self._node_keys.get(n)}  # fmt: skip
        everything = observed != self._observed_last
        self._node_keys, self._observed_last = keys, observed
        if not changed and not everything:
            return
        for uid, record in list(self.records.items()):
            if not everything and record.node not in changed:
                continue
            track = self.fleet.get(uid)
            watch = self.watches.get(record.watch)
            if track is None or watch is None or not record.persisted:
                continue
            before = record.shield
            events = self._reshield(track, record, watch, periodic=True)
            if record.shield != before:
                self._want_verdict(track, record, watch, events)
                self.dirty.add(record.watch)

    def _policy_spell(self, track: Track) -> None:
        """Log a policy's failure once per spell, and its recovery; the metric counts calls."""
        if track.policy_error is not None and track.uid not in self.policy_failing:
            self.policy_failing.add(track.uid)
            log.error(
                "policy failed; the pod is judged by container-state until it works again",
                namespace=track.namespace,
                pod=track.name,
                uid=track.uid,
                policy=track.policy,
                error=track.policy_error,
            )
        elif track.policy_error is None and track.uid in self.policy_failing:
            self.policy_failing.discard(track.uid)
            log.info("policy works again", namespace=track.namespace, pod=track.name,
                     uid=track.uid, policy=track.policy)  # fmt: skip

    # --- DeathWatches -----------------------------------------------------------------------

    def on_deathwatch(self, event_type: str | None, body: Mapping[str, Any]) -> Watch | None:
        """A DeathWatch event. Returns its spec when it is new or its spec changed: pods that
        existed before it are then the caller's to list and `adopt` (no watch event tells of
        them; the controller keeps no copy of pods that are not sandboxes)."""
        self._note_event("deathwatches", event_type, time.monotonic())
        meta = body.get("metadata") or {}
        key: Key = (meta.get("namespace") or "default", meta.get("name") or "")
        if event_type == "DELETED" or meta.get("deletionTimestamp"):
            self._drop_watch(key)
            return None
        if key not in self.conditions:
            # what an earlier controller published: transition times carry over a restart
            try:
                published = (body.get("status") or {}).get("conditions") or []
                self.conditions[key] = msgspec.convert(published, list[Condition])
            except msgspec.ValidationError:
                self.conditions[key] = []
        generation = (meta.get("uid"), meta.get("generation"))
        if self.generations.get(key) == generation:
            return None  # our own status write coming back: the spec is unchanged
        self.generations[key] = generation
        try:
            spec = read_deathwatch(body, self.registry)
        except SpecError as exc:
            log.error("deathwatch invalid", namespace=key[0], deathwatch=key[1], error=str(exc))
            self.invalid[key] = str(exc)
            self.watches.pop(key, None)
            self.dirty.add(key)
            return None
        self.invalid.pop(key, None)
        self.watches[key] = spec
        self.dirty.add(key)
        return spec

    def adopt(self, spec: Watch, pods: Iterable[Mapping[str, Any]]) -> int:
        """Pods that existed before `spec` (or before its selector changed), as just listed:
        each one it selects that no watch event has brought yet. Returns how many."""
        if self.watches.get(spec.key) is not spec:
            return 0  # replaced or deleted while the pods were being listed
        adopted = 0
        for body in pods:
            try:
                pod = read_pod(body)
            except MalformedPod:
                continue  # its own watch event reports it
            if pod.uid not in self.records and self._match(pod, self.watches.values()) is spec:
                step = self.fleet.observe(pod, self.clock(), spec.policy, spec.settings)
                self._record(pod, spec).last_seen = time.monotonic()
                self._after(step, spec)
                adopted += 1
        return adopted

    def _drop_watch(self, key: Key) -> None:
        """The DeathWatch is gone: its verdicts go with it (ownerReferences), so does our memory."""
        self.watches.pop(key, None)
        self.invalid.pop(key, None)
        self.generations.pop(key, None)
        self.conditions.pop(key, None)
        for uid, record in list(self.records.items()):
            if record.watch == key:
                self.fleet.forget(uid)
                self.policy_failing.discard(uid)
                del self.records[uid]
                self.by_name.pop((record.namespace, record.name), None)
                self.writer.forget(SV_PLURAL, record.namespace, record.name)

    # --- time: Suspect windows, vanished pods, retention ----------------------------------

    def expire(self) -> None:
        for step in self.fleet.expire_due(self.clock()):
            record = self.records.get(step.track.uid)
            watch = self.watches.get(record.watch) if record else None
            if watch is not None:
                self._after(step, watch)
        failures, self.fleet.failures = self.fleet.failures, []
        for uid, exc in failures:
            record = self.records.get(uid)
            self.metrics.handler_errors.labels("expire").inc()
            log.error(
                "a Suspect window could not be judged; its next pod event judges it",
                uid=uid,
                namespace=record.namespace if record else None,
                pod=record.name if record else None,
                exc_info=exc,
            )

    def vanished(self, listing_quiet: float = 10.0) -> list[str]:
        """Tracked pods no watch has shown since the latest (re)listing began: deleted while we
        were down or while a watch was broken (a relist reports what exists, not what went
        away). Live ones must be judged gone; terminal ones restored from their verdicts need
        their retention clock started. The caller checks each with a GET before `gone`."""
        now = time.monotonic()
        if self._in_listing and now - self.last_event.get("pods", 0) < listing_quiet:
            return []  # a listing is still coming in
        cutoff = self.listing_started if self.listing_started else self.started
        if not self.listing_started and now - self.started < listing_quiet:
            return []
        out = []
        for uid, record in self.records.items():
            track = self.fleet.get(uid)
            if track is None or record.last_seen >= cutoff:
                continue
            if not track.state.terminal or record.deleted_at is None:
                out.append(uid)
        return out

    def unannounced_deaths(self, window: timedelta = EVENT_RECONCILE_WINDOW) -> list[PodEvent]:
        """The SandboxDead Event of every Dead verdict declared within `window`: what a crash
        (or a leader losing its lease) between a verdict and its Event could have left unsaid.
        The writer posts each again under its deterministic name (409: it was posted). Older
        verdicts are left alone: the API server has expired their Events (--event-ttl, 1 h by
        default), and a new one would announce an old death as news."""
        since = self.clock() - window
        return [
            documents.dead_event(track)
            for track in self.fleet
            if track.state is State.DEAD
            and track.evidence is not None
            and track.evidence.declared_at >= since
        ]

    def listing_settled(self, quiet: float = 2.0) -> int:
        """The number of the latest pod listing once it has all come in (0: none yet): the
        moment to freeze what it built out of the garbage collector's reach (gcpauses.py)."""
        if self.listings == 0:
            return 0
        if self._in_listing and time.monotonic() - self.last_event.get("pods", 0) < quiet:
            return 0
        return self.listings

    def gone(self, uid: str) -> None:
        """A pod confirmed absent from the API (404)."""
        record = self.records.get(uid)
        watch = self.watches.get(record.watch) if record else None
        if record is None:
            return
        now = self.clock()
        record.deleted_at = record.deleted_at or now
        step = self.fleet.remove(uid, now, None)
        if step is not None and watch is not None:
            self._after(step, watch)

    def still_there(self, uid: str) -> None:
        record = self.records.get(uid)
        if record is not None:
            record.last_seen = time.monotonic()

    def retire(self) -> int:
        """Delete the verdicts of pods gone for longer than their DeathWatch's retention."""
        now = self.clock()
        retired = 0
        for uid, record in list(self.records.items()):
            track = self.fleet.get(uid)
            if track is None or record.deleted_at is None or not track.state.terminal:
                continue
            watch = self.watches.get(record.watch)
            retention = watch.retention if watch else timedelta(0)
            declared = track.evidence.declared_at if track.evidence else record.deleted_at
            if now < max(record.deleted_at, declared) + retention:
                continue
            if record.persisted:
                self.writer.want(
                    Desired(
                        SV_PLURAL, record.namespace, record.name, delete_if_uid=uid, priority=LOW
                    )
                )
            self.fleet.forget(uid)
            self.policy_failing.discard(uid)
            del self.records[uid]
            if self.by_name.get((record.namespace, record.name)) == uid:
                del self.by_name[(record.namespace, record.name)]
            self.dirty.add(record.watch)
            retired += 1
        return retired

    # --- DeathWatch status -------------------------------------------------------------------

    def watches_fresh(self) -> bool | None:
        """The pod watch streams delivered something (an event or a bookmark) lately; None
        when that cannot be known (see streams.py)."""
        return self.streams.fresh(["pods"], self.stale_after)

    async def publish(self, slice_size: int = PUBLISH_SLICE) -> None:
        """Queue the status of every DeathWatch that changed (the writer skips no-ops). One
        DeathWatch that cannot be summarised is logged and counted; the others still are.
        The walk over every tracked sandbox yields to the event loop every `slice_size`
        sandboxes: at 10,000 it took ~90 ms in one piece, a stall every pod event behind it
        waited out (issue #13's profile); in slices, a death's event waits for one slice."""
        keys = set(self.dirty) | set(self.watches) | set(self.invalid)
        self.dirty.clear()
        tracks_by_watch: dict[Key, list[Track]] = {}
        uncovered: dict[Key, set[str]] = {}
        shielded: dict[ConditionStatus, int] = dict.fromkeys(ConditionStatus, 0)
        counts: dict[State, int] = dict.fromkeys(State, 0)
        for i, (uid, record) in enumerate(list(self.records.items())):
            if i % slice_size == slice_size - 1:
                await asyncio.sleep(0)
            track = self.fleet.get(uid)
            if track is None:
                continue
            counts[track.state] += 1
            tracks_by_watch.setdefault(record.watch, []).append(track)
            shield = record.shield
            if shield is not None and not track.state.terminal:
                shielded[shield.status] += 1
                if record.node and shield.exposed:
                    uncovered.setdefault(record.watch, set()).add(record.node)
        for state, count in counts.items():
            self.metrics.tracked.labels(str(state)).set(count)
        if self.coverage is not None:
            for cs, count in shielded.items():
                self.metrics.shielded.labels(str(cs)).set(count)
        now, fresh = self.clock(), self.watches_fresh()
        coverage = self.firewall.coverage()
        for key in keys:
            if key not in self.watches and key not in self.invalid:
                continue
            try:
                conditions = self.conditions[key] = documents.deathwatch_conditions(
                    self.conditions.get(key, ()),
                    now,
                    invalid=self.invalid.get(key),
                    fresh=fresh,
                    stale_after=self.stale_after,
                    firewall=self.firewall,
                )
                spec = self.watches.get(key)
                generation = spec.body.get("metadata", {}).get("generation") if spec else None
                status = documents.deathwatch_status(
                    tracks_by_watch.get(key, []),
                    coverage,
                    conditions,
                    generation,
                    self.leader(),
                    uncovered.get(key, ()),
                )
                document = to_document(status)
            except Exception:
                self.metrics.handler_errors.labels("publish").inc()
                log.exception("deathwatch status not computed", namespace=key[0], deathwatch=key[1])
                self.dirty.add(key)
                continue
            self.writer.want(Desired(DW_PLURAL, *key, status=document, priority=LOW))
