"""The one tail every pass ends in (docs/architecture.md):

    an engine Step ─▶ settle: account (logs, metrics) · decide (decisions.py) · owe (delivery)
                      · shield · count (summary.py) · the verdict's document · the writer

`settle` is entered once per input, with the record and the DeathWatch's rules the pass has
found already; `forget` is the one place a sandbox is forgotten. The tail is handed what it
uses (the parts of the memory it changes, the writer, the outboxes, the metrics); no I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from datetime import datetime

import structlog

from deathwatch._api.resources import SV_PLURAL, EventReason
from deathwatch._api.rules import Rules
from deathwatch._engine.engine import SignalKind, Step, Track
from deathwatch._engine.timeutil import UTC
from deathwatch._engine.verdict import Cause, State, origin_of
from deathwatch._operator.delivery.outbox import Deliveries
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.memory.agent_sandboxes import AgentSandboxes
from deathwatch._operator.memory.coverage import Coverage
from deathwatch._operator.memory.records import Record, Records
from deathwatch._operator.reporting import decisions, sandbox_verdicts
from deathwatch._operator.reporting.decisions import Announcement, Before
from deathwatch._operator.reporting.shield import Shield
from deathwatch._operator.reporting.summary import Summaries
from deathwatch._operator.shards.filter import ShardFilter
from deathwatch._operator.writing.desired import NORMAL, URGENT, Desired
from deathwatch._operator.writing.writer import Writer

log = structlog.get_logger("deathwatch.controller")
JUDGE_HERE = object()  # no shield given: the tail judges it, if anything it depends on changed


class Tail:
    """What a step means, applied: reported, counted, owed, written."""

    def __init__(
        self,
        *,
        records: Records,
        summaries: Summaries,
        agent_sandboxes: AgentSandboxes,
        coverage: Coverage | None,
        shards: ShardFilter,
        writer: Writer,
        deliveries: Deliveries,
        metrics: Metrics,
        wake: asyncio.Event,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.records, self.summaries, self.agent_sandboxes = records, summaries, agent_sandboxes
        self.coverage, self.shards, self.writer = coverage, shards, writer
        self.deliveries, self.metrics, self.wake, self.clock = deliveries, metrics, wake, clock

    def mine(self, uid: str | None, where: str) -> bool:
        """Whether this shard judges the sandbox of this pod uid; another shard's pod or
        verdict is counted (by where it was dropped) and dropped."""
        if self.shards.mine(uid):
            return True
        self.metrics.shard_filtered.labels(where).inc()
        return False

    def settle(
        self,
        step: Step,
        record: Record,
        rules: Rules,
        received: float | None = None,
        shield: object = JUDGE_HERE,  # a Shield, None, or JUDGE_HERE: judge it here if need be
    ) -> None:
        """What a step means, applied: reported, counted, written. The one tail of every
        input (pod events, node exits, listings, expiries, coverage)."""
        track = step.track
        account(self.metrics, self.records, step, record)
        changed = any(s.kind is SignalKind.STATE_CHANGED for s in step.signals)
        if changed:
            record.transitions += 1  # the sequence of the event that announces it
        if shield is JUDGE_HERE:
            shield = self.shield(record, rules)
        assert shield is None or isinstance(shield, Shield)  # noqa: S101 - JUDGE_HERE resolved
        claim = self.coverage.claim(record.node) if self.coverage else None
        before = Before(record.persisted, record.shield, record.shield_since, record.node)
        outcome = decisions.decide(step, before, self.clock(), shield, claim)
        if outcome.forget:
            self.forget(record)
            if track.state is State.GONE:  # its deletion cannot be undone: never judged again
                self.records.done_with(record.uid)
            return
        if changed:
            self.owe(record, track)
        if any(a.reason is EventReason.SANDBOX_UNSHIELDED for a in outcome.events):
            _unshielded(self.metrics, track, record, outcome.shield)
        record.shield, record.shield_since = outcome.shield, outcome.shield_since
        self.summaries.apply(record.deathwatch, record.counted, outcome.facts)
        record.counted = outcome.facts
        if outcome.write:
            record.persisted = True
            self.writer.want(self.verdict(track, record, rules, outcome.events, received))
        if track.deadline is not None:
            self.wake.set()

    def shield(self, record: Record, rules: Rules) -> Shield | None:
        """Its shield judged again if what it depends on changed, else as it was."""
        if self.coverage is None:
            return None
        basis = (record.node, record.ips, rules.settings.agent_ports, record.labels)
        if record.shield is not None and record.judged_for == basis:
            return record.shield
        if record.addressed_at is None and record.ips:
            record.addressed_at = self.coverage.clock()
        shield = self.coverage.shield_of(record.node, record.ips, rules.settings.agent_ports,
                                         record.labels, record.addressed_at)  # fmt: skip
        if shield is None:
            return record.shield  # nothing read since start: the restored shield stands
        record.judged_for = basis
        return shield

    def verdict(self, track: Track, record: Record, rules: Rules,
                announce: Iterable[Announcement] = (), received: float | None = None,
                priority: int | None = None) -> Desired:  # fmt: skip
        """Its SandboxVerdict as the writer wants it now."""
        dead = track.state is State.DEAD
        owner = record.agent_sandbox
        ref = self.agent_sandboxes.ref(track.namespace, owner) if owner is not None else None
        slot = self.shards.slot(track.uid)
        status, obj, labels, events = sandbox_verdicts.verdict(
            track, rules, record.node, record.deleted_at, record.shield, record.shield_since,
            announce, ref, record.transitions, record.marks, slot,
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
            slot=slot,
        )  # fmt: skip

    def owe(self, record: Record, track: Track | None = None) -> None:
        """Tell the outboxes this sandbox's current transition (and the marks it has)."""
        track = track or record.track
        if not self.deliveries or track is None:
            return
        for sink in self.deliveries.changed(
            record.uid, record.namespace, track.state, record.transitions,
            event_time(track, self.clock), record.marks, record.deathwatch,
        ):  # fmt: skip
            self.metrics.delivery_coalesced.labels(sink).inc()

    def forget(self, record: Record) -> None:
        """The one place a sandbox is forgotten: its record (and every index into it) and
        what its DeathWatch counts for it. Its deadline, if any, lapses with it."""
        self.records.remove(record)
        self.summaries.apply(record.deathwatch, record.counted, None)
        self.deliveries.forget(record.uid)


def event_time(track: Track, clock: Callable[[], datetime]) -> datetime:
    """The time an event about this transition carries: when the verdict was declared (Dead,
    Gone), else when its state was entered."""
    if track.state.terminal and track.evidence is not None:
        return track.evidence.declared_at
    return track.changed_at or clock()


def _unshielded(metrics: Metrics, track: Track, record: Record, shield: Shield | None) -> None:
    assert shield is not None  # noqa: S101 - an Unshielded Event has a shield
    log.warning("sandbox not shielded", namespace=track.namespace, pod=track.name,
                uid=track.uid, node=record.node, reason=shield.reason,
                message=shield.message)  # fmt: skip
    metrics.unshielded_spells.labels(shield.reason).inc()


def account(metrics: Metrics, records: Records, step: Step, record: Record) -> None:
    """Logs and metrics of what happened: observability only, nothing decided here."""
    track, node = step.track, record.node
    if node:
        metrics.node_seen(node)
    for signal in step.signals:
        kind = signal.kind
        if kind is SignalKind.STATE_CHANGED:
            cause = str(track.cause) if track.cause else None
            log.info("verdict", namespace=track.namespace, pod=track.name, uid=track.uid,
                     **{"from": str(signal.previous), "to": str(track.state)},
                     policy=track.policy, cause=cause,
                     origin=str(origin_of(track.cause)) if track.state.terminal else None,
                     disruption=track.disruption.reason if track.disruption else None,
                     observed_by=str(track.evidence.observed_by) if track.evidence else None,
                     )  # fmt: skip
            metrics.verdicts.labels(str(track.state), track.policy, str(track.cause or "")).inc()
            if track.state is State.DEAD:
                metrics.death(node or "", track.cause or Cause.UNKNOWN)
            if track.cause is Cause.UNOBSERVED:
                log.warning("lost track: the pod is gone and nobody saw how it ended",
                            namespace=track.namespace, pod=track.name, uid=track.uid,
                            last_seen=str(signal.previous))  # fmt: skip
        elif kind is SignalKind.READY_DROPPED:
            metrics.ready_drops.labels(track.policy).inc()
        elif kind is SignalKind.FLAPPED:
            metrics.flaps.labels(track.policy).inc()
        elif kind is SignalKind.FALSE_POSITIVE:
            metrics.false_positives.labels(track.policy).inc()
            log.warning("false positive", namespace=track.namespace, pod=track.name,
                        uid=track.uid, policy=track.policy)  # fmt: skip
        elif kind is SignalKind.POLICY_FAILED:
            metrics.policy_errors.labels(track.policy).inc()
        elif kind is SignalKind.SIDECAR_RESTARTED:
            metrics.sidecar_restarts.labels(track.policy).inc()
            log.info("a container that is not the sandbox restarted; the sandbox lives on",
                     namespace=track.namespace, pod=track.name, uid=track.uid,
                     restarts=track.sidecar_restarts)  # fmt: skip
        elif kind is SignalKind.DISPUTED:
            metrics.node_exit_disputes.labels(track.policy).inc()
            log.warning("a death heard on the node, told otherwise by the kubelet; the "
                        "verdict stands", namespace=track.namespace, pod=track.name,
                        uid=track.uid, disputed=track.disputed)  # fmt: skip
    # a policy's failure is logged once per spell, and its recovery
    if records.set_failing(record, track.policy_error is not None):
        if record.failing:
            log.error("policy failed; the pod is judged by container-state until it works "
                      "again", namespace=track.namespace, pod=track.name, uid=track.uid,
                      policy=track.policy, error=track.policy_error)  # fmt: skip
        else:
            log.info("policy works again", namespace=track.namespace, pod=track.name,
                     uid=track.uid, policy=track.policy)  # fmt: skip
