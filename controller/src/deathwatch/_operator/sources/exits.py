"""Container exits heard on the nodes (ADR 0028): each node agent's exits Lease, watched by a
reflector of its own, and each exit not taken yet handed to the controller with its pod read
fresh from the API.

The read is the causal check: the kubelet kills a container for a deletion, an eviction or a
preemption only after the API holds it, so a read after the exit shows what the kill answers,
and the engine judges the exit beside it (Gone for a deletion, the disruption's cause). It is
the only call an exit costs here; the verdict's write is the one the death costs anyway.

An exit of a pod no record tracks (not a sandbox, another shard's, one forgotten) is dropped
before any read, and so is one whose verdict is final already: most deletions' kills, whose
deletion the pod watch showed first (Gone), cost no read. A read that fails leaves the death
to the kubelet's report, as ever: said, counted. Writes are the writer's (only a leader's
reach the API).

A standby (or a shard that does not write the pod's slot now) defers its judgement by
STANDBY_DEFER: its read would otherwise reach the API server and etcd at the same moment as
the leader's, on the death's path, and its memory is level anyway once the leader's verdict
or the kubelet's report has come. Then, a record already final costs nothing (settled); one
that is not (the leader died before writing, a kubelet slower than the deferral) is judged
as the leader would. Becoming the leader ends the wait at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Final

import msgspec
import structlog

from deathwatch._api.objects import EventType, Undecodable
from deathwatch._api.resources import LEASES
from deathwatch._api.rest import Rest
from deathwatch._engine.nodeexit import NodeExit
from deathwatch._engine.podview import MalformedPod, read_pod
from deathwatch._engine.timeutil import UTC
from deathwatch._kube import exits as wire
from deathwatch._kube.errors import ApiError, KubeError, describe, label
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.instruments.supervisor import Supervisor
from deathwatch._operator.leadership.group import Leadership
from deathwatch._operator.memory.records import Records
from deathwatch._operator.passes.node_exits import NodeExitPass
from deathwatch._operator.shards.filter import ShardFilter
from deathwatch._operator.sources.reflector import Collection

log = structlog.get_logger("deathwatch.node_exits")
JUDGE: Final = "node_exit"  # the spawned judgements' name, and their handler_errors label
IN_FLIGHT: Final = 256  # reads at once; past it, an exit is left to the kubelet's report
READ_DEADLINE: Final = 5.0  # a read slower than this is no faster than the kubelet
# a standby's judgement waits this long for the leader's verdict or the kubelet's report (its
# relist is 1 s; a leader's failover takes longer, and a promotion ends the wait)
STANDBY_DEFER: Final = 2.0
REMEMBERED: Final = wire.MAX_AGE + timedelta(minutes=1)


class ExitsLease(msgspec.Struct, frozen=True):
    """A node's exits Lease, read."""

    node: str
    exits: tuple[wire.Exit, ...]


class _Meta(msgspec.Struct):
    name: str = ""
    annotations: dict[str, str] = msgspec.field(default_factory=dict)


class _Lease(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


_lease = msgspec.json.Decoder(_Lease).decode


def decode(raw: msgspec.Raw) -> ExitsLease:
    try:
        meta = _lease(raw).metadata
        read = wire.read_lease({"metadata": {"annotations": meta.annotations}})
    except (msgspec.ValidationError, msgspec.DecodeError, wire.MalformedExits) as exc:
        raise Undecodable("an exits Lease", str(exc)[:300]) from None
    if read is None:
        raise Undecodable(f"exits Lease {meta.name}", f"no {wire.NODE_ANNOTATION} annotation")
    return ExitsLease(read[0], tuple(read[1]))


def leases(namespace: str) -> Collection[ExitsLease]:
    """The node agents' exits Leases, in the namespace they are installed in."""
    path = f"{LEASES}/namespaces/{namespace}/leases"
    return Collection("leases", path, decode, namespace, wire.LABEL_SELECTOR)


class NodeExits:
    """The exits Leases' receiver: each exit once, to the controller, with its pod read."""

    def __init__(self, judge: NodeExitPass, records: Records, shards: ShardFilter,
                 leadership: Leadership, rest: Rest, metrics: Metrics, supervisor: Supervisor,
                 undecodable: Callable[[Undecodable], None],
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:  # fmt: skip
        self.judge, self.records, self.shards = judge, records, shards
        self.leadership, self.rest, self.metrics, self.clock = leadership, rest, metrics, clock
        self.supervisor, self.said_undecodable = supervisor, undecodable
        self.taken: dict[str, datetime] = {}  # container instance -> its exit, once taken

    def listing(self, scope: str | None) -> None:
        return None

    def listed(self, scope: str | None) -> None:
        return None

    def undecodable(self, error: Undecodable) -> None:
        self.said_undecodable(error)

    def event(self, kind: EventType, lease: ExitsLease, received: float, version: str) -> None:
        if kind is EventType.DELETED:
            return
        now = self.clock()
        for exit in lease.exits:
            if exit.container_id in self.taken:
                continue
            self.taken[exit.container_id] = exit.exited_at
            self.metrics.node_exit_delivery.observe(
                max(0.0, (now - exit.exited_at).total_seconds())
            )
            self._take(lease.node, exit, received)
        if len(self.taken) > 4 * wire.KEPT_EXITS:
            cut = now - REMEMBERED
            self.taken = {c: at for c, at in self.taken.items() if at >= cut}

    def _take(self, node: str, exit: wire.Exit, received: float) -> None:
        if self.records.get(exit.pod_uid) is None:
            self.metrics.node_exits.labels("not-watched").inc()
            return
        if self.supervisor.in_flight(JUDGE) >= IN_FLIGHT:
            self.metrics.node_exits.labels("busy").inc()
            return
        failed = "a node's exit was not judged; the kubelet's report judges it"
        self.supervisor.spawn(JUDGE, self._judge(node, exit, received), failed)

    async def _judge(self, node: str, exit: wire.Exit, received: float) -> None:
        if not self.leadership.writes(self.shards.slot(exit.pod_uid)):
            await self.leadership.within(STANDBY_DEFER)
        record = self.records.get(exit.pod_uid)
        if record is None or record.memory is None:
            self.metrics.node_exits.labels("not-watched").inc()  # forgotten meanwhile
            return
        if record.memory.track.state.terminal:
            # final already (a deletion the pod watch showed before the kill's exit came, a
            # kubelet's report): no read, which could not change it
            self.metrics.node_exits.labels("settled").inc()
            return
        path = f"/api/v1/namespaces/{exit.namespace}/pods/{exit.pod}"
        try:
            async with asyncio.timeout(READ_DEADLINE):
                obj = await self.rest.get(path)
            pod = read_pod(obj)
        except (KubeError, TimeoutError, MalformedPod) as exc:
            gone = isinstance(exc, ApiError) and exc.not_found
            self.metrics.node_exits.labels("gone" if gone else "unread").inc()
            if not gone:
                self.metrics.api_errors.labels("read_pod", label(exc)).inc()
                log.warning("cannot read the pod of a node's exit; the kubelet's report "
                            "judges it", namespace=exit.namespace, pod=exit.pod,
                            error=describe(exc)[:300])  # fmt: skip
            return
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        seen = NodeExit(exit.container_id, exit.exit_code, exit.oom, exit.exited_at, node)
        outcome = self.judge.exited(seen, pod, version, received)
        self.metrics.node_exits.labels(outcome).inc()
        if outcome == "judged":
            log.info("exit heard on its node", namespace=exit.namespace, pod=exit.pod,
                     node=node, container=exit.container, exit_code=exit.exit_code,
                     oom=exit.oom, read_seconds=round(time.monotonic() - received, 4))  # fmt: skip
