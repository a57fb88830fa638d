"""The SandboxVerdict as written (its object, status, labels, and the Events beside it)
and as read back: on a restart `track_from_status` rebuilds the engine's memory from a
SandboxVerdict's status, so nothing the engine needs lives only in memory. Pure, no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec

from deathwatch._api.resources import (
    API_VERSION,
    POD_UID_LABEL,
    SANDBOX_LABEL,
    SLOT_LABEL,
    WATCH_LABEL,
    ConditionStatus,
    ConditionType,
    DeliveryMark,
    DisruptionStatus,
    EventReason,
    Reason,
    SandboxRef,
    SandboxVerdictSpec,
    SandboxVerdictStatus,
    to_document,
)
from deathwatch._api.rules import Rules
from deathwatch._engine.engine import Track
from deathwatch._engine.podview import Disruption
from deathwatch._engine.timeutil import format_time
from deathwatch._engine.verdict import Cause, Evidence, Observer, State, origin_of
from deathwatch._kube.selector import LABEL_VALUE
from deathwatch._operator.reporting.shield import Shield

if TYPE_CHECKING:
    from deathwatch._operator.reporting.decisions import Announcement
from deathwatch._operator.reporting.conditions import condition
from deathwatch._operator.reporting.pod_events import (
    PROBE_BLOCKED_MESSAGE,
    KubeEvent,
    dead_event,
    disputed_event,
    false_positive_event,
    lost_track_event,
    probe_blocked_event,
    sidecar_restarted_event,
    unshielded_event,
)
from deathwatch._operator.reporting.wording import BY_WHOM, evidence_summary


def verdict_message(track: Track) -> str:
    e = track.evidence
    if track.state is State.DEAD and e is not None:
        return (
            f"declared dead ({evidence_summary(e)}) by policy {track.policy}: {BY_WHOM[e.origin]}"
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
        return f"gone ({track.cause}) without dying: {BY_WHOM[origin_of(track.cause)]}"
    if track.state is State.PENDING:
        return "not Ready yet"
    return f"Ready since {format_time(track.last_ready_at)}"


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
