"""Every document the operator writes, built in one place, and the verdict read back.

Pure functions over plain data, no I/O: SandboxVerdict objects and statuses, DeathWatch
statuses and their conditions, and the Events posted on sandbox pods. The writer sends what
these return and nothing else; on a restart `track_from_status` rebuilds the engine's memory
from a SandboxVerdict's status, so nothing the engine needs lives only in memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec

from deathwatch._api.resources import (
    API_VERSION,
    MANAGED_BY,
    POD_UID_LABEL,
    SANDBOX_LABEL,
    SLOT_LABEL,
    WATCH_LABEL,
    Condition,
    ConditionStatus,
    ConditionType,
    DeathWatchStatus,
    DeliveryMark,
    DisruptionStatus,
    EventReason,
    FirewallCoverage,
    LastDeath,
    OriginCounts,
    Reason,
    SandboxRef,
    SandboxVerdictSpec,
    SandboxVerdictStatus,
    ShardPart,
    to_document,
)
from deathwatch._api.rules import Rules
from deathwatch._engine.engine import Track
from deathwatch._engine.podview import Disruption
from deathwatch._engine.timeutil import UTC, format_time
from deathwatch._engine.verdict import Cause, Evidence, Observer, Origin, State, origin_of
from deathwatch._kube.selector import LABEL_VALUE
from deathwatch._operator.judging.shield import Shield

if TYPE_CHECKING:
    from deathwatch._operator.delivery.outbox import Backlog
    from deathwatch._operator.judging.decisions import Announcement
from deathwatch._operator.judging.summary import LAST_DEATHS, Summary

PROBE_BLOCKED_MESSAGE = (
    "a tcpSocket/httpGet/grpc readiness probe targets an agent port; kubelet probes from the "
    "host, which the node firewall refuses, so it can never pass: use an exec probe"
)


def condition(
    kind: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    since: datetime | None,
    previous: Iterable[Condition] = (),
) -> Condition:
    """A condition; its lastTransitionTime stays the previous one's while the status holds."""
    for old in previous:
        if old.type == kind and old.status is status:
            since = old.last_transition_time
            break
    return Condition(
        type=kind, status=status, reason=reason, message=message, last_transition_time=since
    )


# --- SandboxVerdict ------------------------------------------------------------------------


_BY_WHOM = {
    Origin.WORKLOAD: "the workload's own doing",
    Origin.INFRASTRUCTURE: "the infrastructure's doing",
    Origin.PLATFORM: "the platform's doing, on purpose",
    Origin.UNKNOWN: "whose doing is unknown",
}


def verdict_message(track: Track) -> str:
    e = track.evidence
    if track.state is State.DEAD and e is not None:
        return (
            f"declared dead ({evidence_summary(e)}) by policy {track.policy}: {_BY_WHOM[e.origin]}"
        )
    if track.state is State.SUSPECT and track.cause is Cause.DISRUPTING:
        d = track.disruption
        said = f"{d.reason}: {d.message}" if d is not None and d.message else (
            d.reason if d is not None else "DisruptionTarget"
        )  # fmt: skip
        return (
            f"the cluster is taking it ({said}); Dead once its deletion is requested, "
            "Alive again if the condition is cleared"
        )
    if track.state is State.SUSPECT:
        return (
            f"not Ready since {format_time(track.ready_drop_at)}; "
            f"dead at {format_time(track.deadline)} unless it recovers"
        )
    if track.state is State.GONE:
        return f"gone ({track.cause}) without dying: {_BY_WHOM[origin_of(track.cause)]}"
    if track.state is State.PENDING:
        return "not Ready yet"
    return f"Ready since {format_time(track.last_ready_at)}"


def evidence_summary(e: Evidence) -> str:
    """ "ContainerExited, container agent, exit code 7, reason Error"."""
    return ", ".join([str(e.cause), *evidence_details(e)])


def evidence_details(e: Evidence | None) -> list[str]:
    if e is None:
        return []
    parts = []
    if e.disruption:
        parts.append(f"DisruptionTarget {e.disruption}" + (f": {e.message}" if e.message else ""))
    if e.container:
        parts.append(f"container {e.container}")
    if e.exit_code is not None:
        parts.append(f"exit code {e.exit_code}")
    if e.reason:
        parts.append(f"reason {e.reason}")
    if e.observed_by is Observer.NODE:
        parts.append("heard on its node")
    return parts


def disruption_status(d: Disruption | None) -> DisruptionStatus | None:
    if d is None:
        return None
    return DisruptionStatus(reason=d.reason, message=d.message, since=d.since)


_ALIVE = {
    State.ALIVE: ConditionStatus.TRUE,
    State.SUSPECT: ConditionStatus.UNKNOWN,
    State.PENDING: ConditionStatus.UNKNOWN,
}


def verdict_status(
    track: Track,
    node: str | None,
    deleted_at: datetime | None = None,
    shield: Shield | None = None,
    shield_since: datetime | None = None,
    sandbox: SandboxRef | None = None,
    transitions: int = 0,
    marks: Mapping[str, DeliveryMark] | None = None,
) -> SandboxVerdictStatus:
    e = track.evidence
    conditions = [
        condition(
            ConditionType.ALIVE,
            _ALIVE.get(track.state, ConditionStatus.FALSE),
            str(track.cause or track.state),
            verdict_message(track),
            track.changed_at,
        )
    ]
    if track.probe_blocked:
        conditions.append(
            condition(
                ConditionType.PROBE_BLOCKED,
                ConditionStatus.TRUE,
                Reason.NETWORK_PROBE_ON_AGENT_PORT,
                PROBE_BLOCKED_MESSAGE,
                track.changed_at,
            )
        )
    if track.policy_error is not None:
        conditions.append(
            condition(
                ConditionType.POLICY_ERROR,
                ConditionStatus.TRUE,
                Reason.POLICY_FAILED,
                f"policy {track.policy} failed ({track.policy_error}); judged by "
                "container-state until it works again: Dead only on a terminated or "
                "restarted container",
                track.changed_at,
            )
        )
    if shield is not None:
        conditions.append(
            condition(
                ConditionType.SHIELDED, shield.status, shield.reason, shield.message, shield_since
            )
        )
    return SandboxVerdictStatus(
        state=track.state,
        policy=track.policy,
        cause=track.cause,
        origin=origin_of(track.cause) if track.state.terminal else None,
        disruption=disruption_status(track.disruption),
        container=e.container if e else None,
        exit_code=e.exit_code if e else None,
        reason=e.reason if e else None,
        restart_count=e.restart_count if e else sum(track.restart_baseline.values()),
        observed_by=e.observed_by if e else None,
        container_id=e.container_id if e else None,
        disputed=track.disputed,
        restart_counts=dict(track.restart_baseline),
        pod_uid=track.uid,
        node=node,
        last_ready_at=track.last_ready_at,
        ready_drop_at=track.ready_drop_at,
        deadline=track.deadline,
        declared_at=e.declared_at if e else None,
        pod_deleted_at=deleted_at,
        sandbox=sandbox,
        policy_error=track.policy_error,
        ready_drops=track.ready_drops,
        flaps=track.flaps,
        sidecar_restarts=track.sidecar_restarts,
        false_positive=track.false_positive,
        probe_blocked_by_firewall=track.probe_blocked,
        pod_ready=track.ready,
        transitions=transitions or None,
        delivery=[marks[k] for k in sorted(marks)] if marks else None,
        conditions=conditions,
    )


def verdict(
    track: Track,
    rules: Rules,
    node: str | None,
    deleted_at: datetime | None,
    shield: Shield | None,
    shield_since: datetime | None,
    announce: Iterable[Announcement] = (),
    sandbox: SandboxRef | None = None,
    transitions: int = 0,
    marks: Mapping[str, DeliveryMark] | None = None,
    slot: int | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, str], list[KubeEvent]]:
    """A sandbox's SandboxVerdict: its status document, the object to create if it does not
    exist yet, the labels it must carry as it changes (its origin, once it has ended), and
    the Events that announce what `decide` chose to."""
    status = verdict_status(track, node, deleted_at, shield, shield_since, sandbox, transitions,
                            marks)  # fmt: skip
    labels = verdict_labels(slot)
    obj = verdict_object(track.namespace, track.name, rules, track.uid, sandbox, labels)
    return to_document(status), obj, labels, events(track, announce)


def verdict_labels(slot: int | None = None) -> dict[str, str]:
    """The labels a verdict gains after it is made: sharded, its slot (a verdict from before
    sharding gains it with its shard's first write). Its state, cause and origin are selected
    by field (the CRD's selectableFields), never by a label: a label would cost each death a
    write of its own (#43)."""
    return {SLOT_LABEL: str(slot)} if slot is not None else {}


def events(track: Track, announcements: Iterable[Announcement]) -> list[KubeEvent]:
    """The Events that say what `decide` chose to announce."""
    out = []
    for a in announcements:
        if a.reason is EventReason.SANDBOX_DEAD:
            out.append(dead_event(track))
        elif a.reason is EventReason.SANDBOX_LOST_TRACK:
            out.append(lost_track_event(track, a.last_seen))
        elif a.reason is EventReason.SANDBOX_FALSE_POSITIVE:
            out.append(false_positive_event(track))
        elif a.reason is EventReason.PROBE_BLOCKED:
            out.append(probe_blocked_event(track))
        elif a.reason is EventReason.NODE_EXIT_DISPUTED:
            out.append(disputed_event(track))
        elif a.reason is EventReason.SIDECAR_RESTARTED:
            out.append(sidecar_restarted_event(track))
        elif a.reason is EventReason.SANDBOX_UNSHIELDED and a.shield is not None:
            out.append(unshielded_event(track, a.shield, a.spell or ""))
    return out


def verdict_object(
    namespace: str,
    name: str,
    rules: Rules,
    pod_uid: str,
    sandbox: SandboxRef | None = None,
    more: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A new SandboxVerdict (status comes with the next write: it is a subresource), owned by
    its DeathWatch, so it is garbage-collected with it; labelled with its DeathWatch, its
    pod's uid (`kubectl get sv -l deathwatch.dev/pod-uid=...`) and its agent-sandbox Sandbox
    (`-l deathwatch.dev/sandbox=NAME`: a Sandbox's name outlives a claim's adoption)."""
    labels = {
        "app.kubernetes.io/managed-by": "deathwatch",
        WATCH_LABEL: rules.name,
        POD_UID_LABEL: pod_uid,
    }
    if sandbox is not None and LABEL_VALUE.fullmatch(sandbox.name):
        labels[SANDBOX_LABEL] = sandbox.name  # a longer name (up to 253) is in status only
    labels.update(more or {})
    return {
        "apiVersion": API_VERSION,
        "kind": "SandboxVerdict",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [rules.owner_reference()],
        },
        "spec": to_document(SandboxVerdictSpec(death_watch=rules.name)),
    }


def track_from_status(namespace: str, name: str, status: Mapping[str, Any]) -> Track | None:
    """Rebuild the engine's memory of a pod from its SandboxVerdict. None if unusable."""
    try:
        sv = msgspec.convert(status, SandboxVerdictStatus)
    except msgspec.ValidationError:
        return None
    if not sv.pod_uid or not sv.policy:
        return None
    changed_at = next(
        (c.last_transition_time for c in sv.conditions if c.type == ConditionType.ALIVE), None
    )
    disruption = (
        Disruption(sv.disruption.reason, sv.disruption.message, sv.disruption.since)
        if sv.disruption is not None
        else None
    )
    evidence = None
    if sv.state.terminal and sv.declared_at is not None:
        evidence = Evidence(
            state=sv.state,
            cause=sv.cause or Cause.UNKNOWN,
            policy=sv.policy,
            pod_uid=sv.pod_uid,
            namespace=namespace,
            name=name,
            container=sv.container,
            exit_code=sv.exit_code,
            reason=sv.reason,
            restart_count=sv.restart_count,
            last_ready_at=sv.last_ready_at,
            ready_drop_at=sv.ready_drop_at,
            declared_at=sv.declared_at,
            disruption=disruption.reason if disruption else None,
            message=disruption.message if disruption else None,
            observed_by=sv.observed_by or Observer.KUBELET,
            container_id=sv.container_id,
        )
    return Track(
        uid=sv.pod_uid,
        namespace=namespace,
        name=name,
        policy=sv.policy,
        state=sv.state,
        cause=sv.cause,
        ever_ready=sv.state is not State.PENDING or sv.last_ready_at is not None,
        ready=sv.pod_ready if sv.pod_ready is not None else sv.state is State.ALIVE,
        last_ready_at=sv.last_ready_at,
        ready_drop_at=sv.ready_drop_at,
        deadline=sv.deadline,
        restart_baseline=sv.restart_counts,
        ready_drops=sv.ready_drops,
        flaps=sv.flaps,
        sidecar_restarts=sv.sidecar_restarts,
        false_positive=sv.false_positive,
        probe_blocked=sv.probe_blocked_by_firewall,
        evidence=evidence,
        changed_at=changed_at,
        policy_error=sv.policy_error,
        disruption=disruption,
        disputed=sv.disputed,
    )


def delivery_from_status(status: Mapping[str, Any]) -> tuple[int, dict[str, DeliveryMark]]:
    """A verdict's transition count and delivery marks, as written (nothing if unreadable:
    what is owed is then sent again, with the same ids)."""
    try:
        transitions = msgspec.convert(status.get("transitions") or 0, int)
        marks = msgspec.convert(status.get("delivery") or [], list[DeliveryMark])
    except msgspec.ValidationError:
        return 0, {}
    return transitions, {m.sink: m for m in marks}


# --- DeathWatch ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FirewallReading:
    """The firewall DaemonSet as last read (desired/ready None: never read)."""

    daemonset: str | None
    desired: int | None = None
    ready: int | None = None
    observed_at: datetime | None = None
    error: str | None = None

    @property
    def covered(self) -> bool | None:
        if self.daemonset is None or self.desired is None or self.ready is None:
            return None
        return self.desired > 0 and self.ready >= self.desired

    def coverage(self) -> FirewallCoverage | None:
        if self.daemonset is None:
            return None
        known = self.desired is not None and self.ready is not None
        return FirewallCoverage(
            daemon_set=self.daemonset,
            summary=f"{self.ready}/{self.desired}" if known else "unknown",
            desired=self.desired,
            ready=self.ready,
            observed_at=self.observed_at,
        )


def deathwatch_conditions(
    previous: Iterable[Condition],
    now: datetime,
    *,
    invalid: str | None,
    fresh: bool | None,
    stale_after: float,
    firewall: FirewallReading,
    backlogs: Iterable[Backlog] | None = None,
    conflicts: Iterable[str] | None = None,
) -> list[Condition]:
    """Ready, FirewallCovered, Delivered when sinks are configured (`backlogs`: this
    DeathWatch's share of each sink's debt), and ReleaseConflict when other releases are
    checked (`conflicts`: what each shares with this one, ADR 0038)."""
    before = list(previous)

    def cond(kind: str, status: ConditionStatus, reason: str, message: str) -> Condition:
        return condition(kind, status, reason, message, now, before)

    t, f, u = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN
    if invalid is not None:
        ready = cond(ConditionType.READY, f, Reason.INVALID_SPEC, invalid)
    elif fresh is False:
        ready = cond(
            ConditionType.READY,
            u,
            Reason.WATCH_STALE,
            f"the pod watch delivered nothing, not even a bookmark, for over {stale_after:.0f}s: "
            "a broken connection (it is reconnected); verdicts may be late",
        )
    else:
        message = "judging the pods this DeathWatch selects"
        if fresh is None:
            message += " (the watch stream's liveness cannot be observed with this kopf)"
        ready = cond(ConditionType.READY, t, Reason.WATCHING, message)
    fw, covered = firewall, firewall.covered
    kind = ConditionType.FIREWALL_COVERED
    if fw.daemonset is None:
        message = "the controller was not told which DaemonSet runs the firewall"
        firewall_condition = cond(kind, u, Reason.NOT_CONFIGURED, message)
    elif covered is None:
        message = fw.error or f"DaemonSet {fw.daemonset} not read yet"
        firewall_condition = cond(kind, u, Reason.NOT_OBSERVED, message)
    elif covered:
        message = f"the firewall agent is ready on {fw.ready}/{fw.desired} nodes"
        firewall_condition = cond(kind, t, Reason.ALL_NODES, message)
    else:
        message = (
            f"the firewall agent is ready on {fw.ready}/{fw.desired} nodes: "
            "sandboxes on the others are exposed"
        )
        firewall_condition = cond(kind, f, Reason.NODES_UNCOVERED, message)
    found = [ready, firewall_condition]
    if backlogs is not None:
        found.append(delivered_condition(list(backlogs), now, cond))
    if conflicts is not None:
        said = sorted(conflicts)
        kind = ConditionType.RELEASE_CONFLICT
        if said:
            found.append(cond(kind, t, Reason.RELEASE_COLLISION, "; ".join(said)[:2000]))
        else:
            message = "no other release shares this one's controller id, table or host ports"
            found.append(cond(kind, f, Reason.NO_COLLISION, message))
    return found


def delivered_condition(
    backlogs: list[Backlog],
    now: datetime,
    cond: Callable[[str, ConditionStatus, str, str], Condition],
) -> Condition:
    """Delivered: True while every sink has what it is owed within its lateAfterSeconds;
    False naming each late sink, how much it is owed, since when and its last error. Said
    with times, never ages: a message that changed every second would be a write a second."""
    late = [b for b in backlogs if b.oldest and (now - b.oldest).total_seconds() > b.late_after]
    kind = ConditionType.DELIVERED
    if not late:
        sinks = ", ".join(f"{b.sink} {b.late_after:g}s" for b in backlogs)
        said = f"every sink has what it is owed within its lateAfterSeconds ({sinks})"
        return cond(kind, ConditionStatus.TRUE, Reason.UP_TO_DATE, said)
    parts = []
    for b in late:
        since = format_time(b.oldest) if b.oldest else "?"
        part = f"{b.sink}: {b.owed} owed, the oldest since {since}"
        parts.append(part + (f" (last error: {b.last_error[:120]})" if b.last_error else ""))
    return cond(kind, ConditionStatus.FALSE, Reason.BACKLOG, "; ".join(parts))


def deathwatch_status(
    summary: Summary,
    firewall: FirewallCoverage | None,
    conditions: list[Condition],
    generation: int | None,
    leader: str | None = None,
) -> DeathWatchStatus:
    """The DeathWatch status: counts, the last deaths with evidence, firewall coverage."""
    counts = summary.counts
    return DeathWatchStatus(
        tracked=summary.tracked,
        pending=counts[State.PENDING],
        alive=counts[State.ALIVE],
        suspect=counts[State.SUSPECT],
        dead=counts[State.DEAD],
        gone=counts[State.GONE],
        flaps=summary.flaps,
        false_positives=summary.false_positives,
        deaths=OriginCounts(
            workload=summary.deaths[Origin.WORKLOAD],
            infrastructure=summary.deaths[Origin.INFRASTRUCTURE],
            platform=summary.deaths[Origin.PLATFORM],
            unknown=summary.deaths[Origin.UNKNOWN],
        ),
        observed_generation=generation,
        leader=leader,
        firewall=firewall,
        uncovered_nodes=summary.uncovered_nodes()[:100],
        last_deaths=[
            LastDeath(
                name=e.name,
                pod_uid=e.pod_uid,
                policy=e.policy,
                cause=e.cause,
                origin=e.origin,
                container=e.container,
                exit_code=e.exit_code,
                ready_drop_at=e.ready_drop_at,
                declared_at=e.declared_at,
                observed_by=e.observed_by,
            )
            for e in summary.last_deaths(LAST_DEATHS)
        ],
        conditions=conditions,
    )


def shard_part(summary: Summary, shard: int, slots: str, leader: str | None) -> ShardPart:
    """This shard's part of a DeathWatch's status (sharded): its counts and its deaths."""
    own = deathwatch_status(summary, None, [], None)
    return ShardPart(
        shard=shard, leader=leader, slots=slots, tracked=own.tracked, pending=own.pending,
        alive=own.alive, suspect=own.suspect, dead=own.dead, gone=own.gone, flaps=own.flaps,
        false_positives=own.false_positives, deaths=own.deaths,
        uncovered_nodes=own.uncovered_nodes, last_deaths=own.last_deaths,
    )  # fmt: skip


def sharded_status(
    parts: Iterable[ShardPart],
    firewall: FirewallCoverage | None,
    conditions: list[Condition],
    generation: int | None,
) -> DeathWatchStatus:
    """Shard 0's: the totals of every shard's part (each written by its own leader), the
    newest deaths of them all, and who leads each shard."""
    ordered = sorted(parts, key=lambda p: p.shard)

    def total(field: str) -> int:
        return sum(getattr(p, field) for p in ordered)

    deaths = sorted((d for p in ordered for d in p.last_deaths),
                    key=lambda d: d.declared_at or datetime.min.replace(tzinfo=UTC),
                    reverse=True)  # fmt: skip
    return DeathWatchStatus(
        tracked=total("tracked"), pending=total("pending"), alive=total("alive"),
        suspect=total("suspect"), dead=total("dead"), gone=total("gone"),
        flaps=total("flaps"), false_positives=total("false_positives"),
        deaths=OriginCounts(**{
            k: sum(getattr(p.deaths, k) for p in ordered)
            for k in ("workload", "infrastructure", "platform", "unknown")
        }),
        observed_generation=generation,
        leader=" ".join(f"{p.shard}={p.leader or '-'}" for p in ordered),
        firewall=firewall,
        uncovered_nodes=sorted({n for p in ordered for n in p.uncovered_nodes})[:100],
        last_deaths=deaths[:LAST_DEATHS],
        conditions=conditions,
        shards=ordered,
    )  # fmt: skip


# --- Events on sandbox pods ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KubeEvent:
    """A Kubernetes Event about a pod (core/v1), posted once per (pod uid, reason): its name
    is deterministic, so a second create is a 409, even from a restarted controller."""

    namespace: str
    pod: str
    pod_uid: str
    reason: EventReason
    message: str
    type: str = "Warning"
    spell: str | None = None  # for reasons that can recur: which spell (same on every replica)

    @property
    def name(self) -> str:
        suffix = f".{self.pod_uid[:8]}.{self.reason.lower()}"
        if self.spell is not None:
            suffix += "." + hashlib.sha256(self.spell.encode()).hexdigest()[:8]
        return self.pod[: 253 - len(suffix)] + suffix

    def document(self, now: datetime, instance: str) -> dict[str, Any]:
        at = format_time(now)
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": self.namespace,
                "name": self.pod,
                "uid": self.pod_uid,
            },
            "reason": str(self.reason),
            "message": self.message,
            "type": self.type,
            "count": 1,
            "firstTimestamp": at,
            "lastTimestamp": at,
            "source": {"component": "deathwatch"},
            "reportingComponent": MANAGED_BY,
            "reportingInstance": instance,
        }


def _event(track: Track, reason: EventReason, message: str, type: str = "Warning") -> KubeEvent:
    return KubeEvent(track.namespace, track.name, track.uid, reason, message, type)


def dead_event(track: Track) -> KubeEvent:
    """One per pod: its death, whose doing it was, and its evidence; for a disruption of the
    cluster's, the condition's reason and the component's own message."""
    details = evidence_details(track.evidence)
    detail = f" ({', '.join(details)})" if details else ""
    return _event(
        track,
        EventReason.SANDBOX_DEAD,
        f"Sandbox dead: {track.cause}, {_BY_WHOM[origin_of(track.cause)]}{detail}; "
        f"Ready dropped at {format_time(track.ready_drop_at)}, policy {track.policy}",
    )


def false_positive_event(track: Track) -> KubeEvent:
    declared = format_time(track.evidence.declared_at) if track.evidence else None
    return _event(
        track,
        EventReason.SANDBOX_FALSE_POSITIVE,
        f"Ready again after being declared dead at {declared}; the Dead verdict stands",
    )


def disputed_event(track: Track) -> KubeEvent:
    return _event(
        track,
        EventReason.NODE_EXIT_DISPUTED,
        f"declared dead on the exit its node heard; the kubelet's report tells it otherwise: "
        f"{track.disputed}. The Dead verdict stands (docs/runbook.md#nodeexitdisputed)",
    )


def sidecar_restarted_event(track: Track) -> KubeEvent:
    """Once per pod: a container that is not the sandbox restarted, and the sandbox lives on."""
    return _event(
        track,
        EventReason.SIDECAR_RESTARTED,
        "a container that is not the sandbox (a native sidecar or a helper) restarted; the "
        "sandbox lives on (status.sidecarRestarts counts them). Name it in the DeathWatch's "
        "spec.containers (vitalSidecars, sandbox) to make its death the sandbox's",
        type="Normal",
    )


def probe_blocked_event(track: Track) -> KubeEvent:
    return _event(track, EventReason.PROBE_BLOCKED, PROBE_BLOCKED_MESSAGE)


def lost_track_event(track: Track, last_seen: State | None) -> KubeEvent:
    return _event(
        track,
        EventReason.SANDBOX_LOST_TRACK,
        f"Sandbox deleted while deathwatch could not watch it (last seen {last_seen}); "
        "whether it died before it was deleted is unknown",
    )


def unshielded_event(track: Track, shield: Shield, spell: str) -> KubeEvent:
    return KubeEvent(
        track.namespace,
        track.name,
        track.uid,
        EventReason.SANDBOX_UNSHIELDED,
        f"Sandbox not shielded by the node firewall: {shield.reason}: {shield.message}",
        spell=spell,
    )
