"""The vocabulary of verdicts: states, causes and the evidence a terminal verdict carries."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

import msgspec

from deathwatch._engine.timeutil import format_time


class State(StrEnum):
    PENDING = "Pending"  # never Ready yet: nothing to lose
    ALIVE = "Alive"
    SUSPECT = "Suspect"  # not Ready, but the policy gives it a window to recover
    DEAD = "Dead"  # sticky: never taken back
    GONE = "Gone"  # deleted or completed without dying; terminal

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({State.DEAD, State.GONE})


class Cause(StrEnum):
    # causes of Dead the workload brought on itself
    CONTAINER_EXITED = "ContainerExited"
    OOM_KILLED = "OOMKilled"
    UNRESPONSIVE = "Unresponsive"
    # evicted by its kubelet for its own limit: ephemeral storage (a container's, the pod's) or
    # an emptyDir's sizeLimit, as an OOM kill is for its own memory limit (docs/verdicts.md)
    STORAGE_LIMIT_EXCEEDED = "StorageLimitExceeded"
    # causes of Dead the cluster inflicted (a DisruptionTarget condition, or the node lost)
    EVICTED = "Evicted"  # node-pressure eviction by the kubelet
    NODE_LOST = "NodeLost"  # the node controller took Ready away: its kubelet went silent
    DRAINED = "Drained"  # evicted through the Eviction API (kubectl drain, autoscalers)
    PREEMPTED = "Preempted"  # by kube-scheduler, or by the kubelet for a critical pod
    TAINT_EVICTED = "TaintEvicted"  # a NoExecute taint it did not tolerate (long enough)
    NODE_UNREACHABLE = "NodeUnreachable"  # the same, after its node stopped reporting
    NODE_DELETED = "NodeDeleted"  # its Node object deleted; pod GC failed and deleted it
    NODE_SHUTDOWN = "NodeShutdown"  # the kubelet's graceful node shutdown
    DISRUPTED = "Disrupted"  # a DisruptionTarget reason this version does not know yet
    UNKNOWN = "Unknown"
    # causes of Gone
    DELETED = "Deleted"
    # a deletion whose reason its owner states (an agent-sandbox Sandbox): on purpose
    SUSPENDED = "Suspended"  # the Sandbox was suspended (operatingMode: Suspended)
    EXPIRED = "Expired"  # the Sandbox reached its shutdownTime
    COMPLETED = "Completed"
    FAILED_BEFORE_READY = "FailedBeforeReady"
    UNOBSERVED = "Unobserved"  # found gone with nobody watching: whether it died is unknown
    # causes of Suspect
    NOT_READY = "NotReady"
    DISRUPTING = "Disrupting"  # a DisruptionTarget condition, its pod not deleted (yet)


# The causes a disruption of the cluster's can give a death (DisruptionTarget, node lost).
DISRUPTION_CAUSES = (
    Cause.EVICTED, Cause.NODE_LOST, Cause.DRAINED, Cause.PREEMPTED, Cause.TAINT_EVICTED,
    Cause.NODE_UNREACHABLE, Cause.NODE_DELETED, Cause.NODE_SHUTDOWN, Cause.DISRUPTED,
)  # fmt: skip
DEAD_CAUSES = (
    Cause.CONTAINER_EXITED, Cause.OOM_KILLED, Cause.UNRESPONSIVE, Cause.STORAGE_LIMIT_EXCEEDED,
    *DISRUPTION_CAUSES, Cause.UNKNOWN,
)  # fmt: skip


class Origin(StrEnum):
    """Whose doing a terminal verdict was: what a platform bills, retries or alerts on."""

    WORKLOAD = "Workload"  # the sandbox itself: exited, OOM-killed, unresponsive, restarted
    INFRASTRUCTURE = "Infrastructure"  # the cluster: a disruption, its node lost or pressed
    PLATFORM = "Platform"  # on purpose: deleted, completed, suspended, expired
    UNKNOWN = "Unknown"  # nobody saw how it ended, or nothing said why


_ORIGINS = {
    Cause.CONTAINER_EXITED: Origin.WORKLOAD,
    Cause.OOM_KILLED: Origin.WORKLOAD,
    Cause.UNRESPONSIVE: Origin.WORKLOAD,
    Cause.STORAGE_LIMIT_EXCEEDED: Origin.WORKLOAD,
    Cause.FAILED_BEFORE_READY: Origin.WORKLOAD,
    **dict.fromkeys(DISRUPTION_CAUSES, Origin.INFRASTRUCTURE),
    Cause.DELETED: Origin.PLATFORM,
    Cause.COMPLETED: Origin.PLATFORM,
    Cause.SUSPENDED: Origin.PLATFORM,
    Cause.EXPIRED: Origin.PLATFORM,
}


def origin_of(cause: Cause | None) -> Origin:
    """Whose doing a verdict with this cause was (Unknown, Unobserved, none: Unknown)."""
    return _ORIGINS.get(cause, Origin.UNKNOWN) if cause is not None else Origin.UNKNOWN


class Observer(StrEnum):
    """Whose report a verdict rests on."""

    KUBELET = "kubelet"  # the pod's status, as the kubelet (or a controller) wrote it
    NODE = "node"  # the node's container runtime, heard by deathwatch's node agent


class Evidence(msgspec.Struct, frozen=True, gc=False):
    """Captured at the moment of a terminal verdict: the pod may be gone seconds later."""

    state: State
    cause: Cause
    policy: str
    pod_uid: str
    namespace: str
    name: str
    container: str | None
    exit_code: int | None
    reason: str | None  # the kubelet's own word: "Error", "OOMKilled", "Evicted", ...
    restart_count: int | None
    last_ready_at: datetime | None
    ready_drop_at: datetime | None
    declared_at: datetime
    # the DisruptionTarget condition that ended it, as its component wrote it
    disruption: str | None = None  # its reason: EvictionByEvictionAPI, DeletionByPodGC, ...
    message: str | None = None  # its message: "Eviction API: evicting", ...
    # whose report it rests on, and the container instance that ended (runtime://id)
    observed_by: Observer = Observer.KUBELET
    container_id: str | None = None

    @property
    def origin(self) -> Origin:
        return origin_of(self.cause)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form (RFC 3339 UTC times), as replay and logs print it."""
        return {
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.pod_uid,
            "state": str(self.state),
            "policy": self.policy,
            "cause": str(self.cause),
            "origin": str(self.origin),
            "container": self.container,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "restart_count": self.restart_count,
            "last_ready_at": format_time(self.last_ready_at),
            "ready_drop_at": format_time(self.ready_drop_at),
            "declared_at": format_time(self.declared_at),
            "disruption": self.disruption,
            "message": self.message,
            "observed_by": str(self.observed_by),
            "container_id": self.container_id,
        }
