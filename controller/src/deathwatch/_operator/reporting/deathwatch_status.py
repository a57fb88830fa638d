"""The DeathWatch's status: its counts, its conditions (the firewall's coverage as read, a
delivery's backlog) and, sharded, each shard's part. Pure, no I/O."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from deathwatch._api.resources import (
    Condition,
    ConditionStatus,
    ConditionType,
    DeathWatchStatus,
    FirewallCoverage,
    LastDeath,
    OriginCounts,
    Reason,
    ShardPart,
)
from deathwatch._engine.timeutil import UTC, format_time
from deathwatch._engine.verdict import Origin, State

if TYPE_CHECKING:
    from deathwatch._operator.delivery.outbox import Backlog
from deathwatch._operator.reporting.conditions import condition
from deathwatch._operator.reporting.summary import LAST_DEATHS, Summary


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
