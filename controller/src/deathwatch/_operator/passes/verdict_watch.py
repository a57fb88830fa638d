"""SandboxVerdicts the API holds, back on their own watch: listed at start they rebuild the
engine's memory (`restore`: nothing the controller needs lives only in memory); watched they
keep a standby level with the leader (`on_verdict`: what was delivered, how its transitions
are numbered, how a deletion it did not see ended) and tell a leader what another term wrote
(`republish`). The pass's methods, on what it uses (`VerdictPass`); no I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec
import structlog

from deathwatch._api.objects import EventType, VerdictObject
from deathwatch._api.resources import (
    DW_PLURAL,
    POD_UID_LABEL,
    SV_PLURAL,
    ConditionStatus,
    ConditionType,
    SandboxRef,
)
from deathwatch._engine import memory
from deathwatch._engine.contract import Policies
from deathwatch._engine.memory import Deadlines
from deathwatch._engine.timeutil import parse_time
from deathwatch._engine.verdict import Cause, State
from deathwatch._operator.delivery.outbox import Deliveries
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.memory.agent_sandboxes import AgentSandboxes
from deathwatch._operator.memory.deathwatches import DeathWatches
from deathwatch._operator.memory.records import Records
from deathwatch._operator.passes.tail import Tail
from deathwatch._operator.reporting import decisions, sandbox_verdicts
from deathwatch._operator.reporting.shield import Shield
from deathwatch._operator.reporting.summary import Summaries
from deathwatch._operator.shards.filter import ShardFilter
from deathwatch._operator.writing.desired import LOW, Desired, ObjectKey
from deathwatch._operator.writing.writer import Writer

log = structlog.get_logger("deathwatch.controller")


@dataclass(frozen=True, slots=True)
class VerdictPass:
    """What the verdicts' pass uses: the records it restores and levels, the DeathWatches,
    agent-sandbox's Sandboxes, the counts, the engine's policies and deadlines (a memory
    rebuilt), the writer (what the API holds), the outboxes, the shard filter, the metrics,
    the tail and the deadline loop's wake."""

    records: Records
    deathwatches: DeathWatches
    agent_sandboxes: AgentSandboxes
    summaries: Summaries
    policies: Policies
    deadlines: Deadlines
    writer: Writer
    deliveries: Deliveries
    shards: ShardFilter
    metrics: Metrics
    tail: Tail
    wake: asyncio.Event

    def restore(self, verdict: VerdictObject) -> bool:
        """A verdict listed at start, before any pod: the engine's memory rebuilt from it. False
        if it cannot be used. It is judged with its DeathWatch's settings: at once if that
        DeathWatch is compiled already, else as soon as it is (`owners.on_deathwatch`); until
        then, the defaults."""
        status = verdict.status or {}
        if not self.tail.mine(
            verdict.labels.get(POD_UID_LABEL) or status.get("podUID"), "verdicts"
        ):
            return False
        self.writer.knows(SV_PLURAL, verdict.namespace, verdict.name, status, verdict.version,
                          verdict.labels)  # fmt: skip
        track = sandbox_verdicts.track_from_status(verdict.namespace, verdict.name, status)
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
            self.tail.forget(older)
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
        record.transitions, marks = sandbox_verdicts.delivery_from_status(status)
        if marks:
            record.marks = marks
        self.tail.owe(record, track)  # what no mark covers is sent when this replica leads
        self.wake.set()
        return True

    def relisted(self, scope: str | None, seen: set[tuple[str, str]]) -> None:
        """A complete relisting of `scope` (a namespace; None: all) showed `seen`: a verdict
        the writer knew and it did not show was deleted meanwhile."""
        for plural, namespace, name in self.writer.known(SV_PLURAL, scope):
            if (namespace, name) not in seen:
                self.writer.observed(plural, namespace, name, None, "")

    def on_verdict(self, kind: EventType, verdict: VerdictObject) -> None:
        """A SandboxVerdict as its watch shows it (the leader's writes, seen by a standby;
        another term's, seen by a leader)."""
        status = None if kind is EventType.DELETED else verdict.status
        uid = verdict.labels.get(POD_UID_LABEL) or (verdict.status or {}).get("podUID")
        if not self.tail.mine(uid, "verdicts"):
            return
        key = (SV_PLURAL, verdict.namespace, verdict.name)
        if status:
            self.told(verdict.namespace, verdict.name, status)
        if status and self.deliveries and not self.writer.leading:
            self.level(verdict.namespace, verdict.name, status)
        contested = self.writer.observed(*key, status, verdict.version, verdict.labels)
        if contested:
            self.republish([key])
        elif (
            kind is EventType.ADDED
            and self.writer.leading
            and not verdict.status
            and self.records.named(verdict.namespace, verdict.name) is None
            and uid
            # this controller's DeathWatch's: another controller's verdict is never ours to delete
            and self.deathwatches.get((verdict.namespace, verdict.deathwatch)) is not None
        ):
            # created, status-less, for a pod this leader does not track: an earlier term's
            # create that landed after this term retired the verdict. Not left behind.
            self.writer.want(Desired(*key, delete=uid, priority=LOW, slot=self.shards.slot(uid)))

    def told(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """A final verdict the API holds, which this replica's memory does not: it takes it.

        - A pod this replica found gone with nobody watching (Unobserved: a standby that joined
          after the deletion, a listing after a restart): another replica saw it end. Known
          replaces unknown (issue #40), and none that takes over writes Unobserved over it.
        - A standby: the leader's written fate is the one every replica holds (issue #51), ahead
          of its own judgement (the node's exit heard by the leader first) or over a different
          one (counted: deathwatch_standby_disagreements_total, and logged), so that a standby
          taking over never writes another fate over it. A leader keeps its own: what another
          term wrote differently is said again (`republish`)."""
        record = self.records.named(namespace, name)
        mine = record.memory.track if record is not None and record.memory is not None else None
        if record is None or mine is None:
            return
        if mine.cause is not Cause.UNOBSERVED and self.writer.leading:
            return
        theirs = sandbox_verdicts.track_from_status(namespace, name, status)
        if (
            theirs is None
            or theirs.uid != record.uid
            or not theirs.state.terminal
            or theirs.cause in (None, Cause.UNOBSERVED)
            or (theirs.state, theirs.cause) == (mine.state, mine.cause)
        ):
            return
        if mine.state.terminal and mine.cause is not Cause.UNOBSERVED:
            self.metrics.standby_disagreements.inc()
            log.warning("this replica's verdict differs from the one the leader wrote; the "
                        "written one stands", namespace=namespace, pod=name, uid=record.uid,
                        mine=f"{mine.state}/{mine.cause}",
                        written=f"{theirs.state}/{theirs.cause}")  # fmt: skip
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
        if theirs.state is State.DEAD and mine.state is not State.DEAD:
            # every replica counts every death it holds: the death-rate alerts (the highest
            # replica's count) stay whole when the Lease changes hands in a burst
            self.metrics.verdicts.labels(str(theirs.state), theirs.policy,
                                         str(theirs.cause or "")).inc()  # fmt: skip
            self.metrics.death(record.node or "", theirs.cause or Cause.UNKNOWN)
        log.info("a final verdict the API holds and this replica's memory did not: taken",
                 namespace=namespace, pod=name, uid=record.uid, state=str(theirs.state),
                 cause=str(theirs.cause), was=str(mine.cause or mine.state))  # fmt: skip
        rules = self.deathwatches.get(record.deathwatch)
        if rules is not None:  # what this replica owes is now what the API holds: nothing
            self.writer.want(self.tail.verdict(theirs, record, rules, priority=LOW))

    def level(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """A standby takes the leader's word for what was delivered (and how its verdict's
        transitions are numbered, while the two agree on its state), so that taking over it
        sends only what no mark covers."""
        record = self.records.named(namespace, name)
        track = record.track if record is not None else None
        if record is None or track is None or status.get("podUID") != record.uid:
            return
        transitions, marks = sandbox_verdicts.delivery_from_status(status)
        if status.get("state") == track.state.value:
            record.transitions = transitions
        if marks:
            record.marks = marks
        self.tail.owe(record, track)

    def republish(self, keys: Iterable[ObjectKey]) -> None:
        """Say these objects again, as this controller judges them now (taking over: what the old
        leader left different; leading: what another term's write changed). A DeathWatch's
        status is said again at the next publish, as every second."""
        for plural, namespace, name in keys:
            if plural == DW_PLURAL:
                continue
            record = self.records.named(namespace, name)
            track = record.track if record else None
            rules = self.deathwatches.get(record.deathwatch) if record else None
            if record is None or track is None or rules is None or not record.persisted:
                continue
            self.writer.want(self.tail.verdict(track, record, rules))


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
