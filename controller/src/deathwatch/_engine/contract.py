"""The contract between the engine and a policy: plain data in, a decision out.

The bottom of the import graph with the rest of `_engine`: policies (`_policies`, plugins
through `deathwatch.policy`) import it, it imports nothing above it.

A policy is consulted only for a pod that has been Ready at least once and is not yet Dead
or Gone; a plain deletion, completion and eviction are decided by the engine before any
policy is asked, so no policy can turn the platform's deletion into a death. A disruption
of the cluster's (the pod's DisruptionTarget condition) is shown to the policy
(`Situation.disruption`); once it can no longer be undone the policy says whether it was a
death (`by_disruption`, which every built-in uses), and the engine holds any policy to two
rules: a disruption still pending is never a death without a dead container to prove it, and
one that is final and not called a death is Gone with its cause. A Suspect decision carries
its own deadline: that is the policy's window, and the only place it is stated.

A policy may declare what the engine may infer for it (`ready_means_running`, an optional
class attribute, False unless set): Ready means "the containers run", as with no readiness
probe, so a pod first seen stopped, with no record of it, was Ready and died.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

import msgspec

from deathwatch._engine.podview import PodView
from deathwatch._engine.verdict import Cause, State

ENTRY_POINT_GROUP = "deathwatch.policies"  # where plugins register (name = the policy's name)


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """Per-DeathWatch knobs a policy may read, and the pod's anatomy: which of its containers
    are the sandbox (`sandbox_containers`: regular containers by name; empty, or naming none
    the pod has: every regular container) and which native sidecars are vital to it
    (`vital_sidecars`: their death is the sandbox's). The rest (helpers, other sidecars, init
    and ephemeral containers) are evidence, never the sandbox (docs/verdicts.md, ADR 0029)."""

    exec_window_multiplier: float = 2.0
    agent_ports: frozenset[int] = frozenset()
    sandbox_containers: frozenset[str] = frozenset()
    vital_sidecars: frozenset[str] = frozenset()


# The plain values of the contract are msgspec Structs: built once or more per observed event,
# their constructors (in C) cost a tenth of a frozen dataclass's (replay's hot loop).
class ContainerDeath(msgspec.Struct, frozen=True, gc=False):
    """A container that terminated, or restarted, after the pod had been Ready."""

    container: str
    exit_code: int | None
    reason: str | None
    finished_at: datetime | None
    restart_count: int

    @property
    def cause(self) -> Cause:
        return Cause.OOM_KILLED if self.reason == "OOMKilled" else Cause.CONTAINER_EXITED


# What each component of the cluster writes as the DisruptionTarget condition's reason
# (Kubernetes 1.35: pkg/registry/core/pod/storage/eviction.go, pkg/scheduler/framework/
# preemption, pkg/controller/tainteviction, pkg/controller/podgc, pkg/kubelet/eviction,
# pkg/kubelet/nodeshutdown, pkg/kubelet/preemption), and the cause it gives a death.
EVICTION_API = "EvictionByEvictionAPI"
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"
TAINT_MANAGER = "DeletionByTaintManager"
DEVICE_TAINT_MANAGER = "DeletionByDeviceTaintManager"
POD_GC = "DeletionByPodGC"
KUBELET = "TerminationByKubelet"
_BY_REASON = {
    EVICTION_API: Cause.DRAINED,
    PREEMPTION_BY_SCHEDULER: Cause.PREEMPTED,
    TAINT_MANAGER: Cause.TAINT_EVICTED,
    DEVICE_TAINT_MANAGER: Cause.TAINT_EVICTED,
    POD_GC: Cause.NODE_DELETED,
}
# TerminationByKubelet is said for three things; the pod's own reason tells them apart
_BY_KUBELET_REASON = {
    "Evicted": Cause.EVICTED,  # node-pressure eviction
    "Terminated": Cause.NODE_SHUTDOWN,  # graceful node shutdown
    "Preempting": Cause.PREEMPTED,  # the kubelet admitting a critical pod
}


# How the kubelet's eviction manager words an eviction for the pod's own limits (Kubernetes
# 1.35: pkg/kubelet/eviction/helpers.go, containerEphemeralStorageMessageFmt,
# podEphemeralStorageMessageFmt, emptyDirMessageFmt). Node pressure is worded "The node was low
# on resource: ..." (nodeLowMessageFmt). The limits are the workload's, as its memory limit is
# under an OOM kill; the node's pressure is the infrastructure's.
_NODE_LOW = "The node was low on resource"
_OWN_LIMIT_WORDING = (
    "exceeded its local ephemeral storage limit",
    "Pod ephemeral local storage usage exceeds the total limit",
    "Usage of EmptyDir volume",
)


def _eviction_wording(message: str | None) -> bool:
    """The kubelet's eviction manager wrote this message."""
    if not message:
        return False
    return message.startswith(_NODE_LOW) or any(w in message for w in _OWN_LIMIT_WORDING)


def eviction_cause(message: str | None) -> Cause:
    """What a kubelet's eviction makes a death, by its message: StorageLimitExceeded for the
    pod's own storage limits (the workload's doing), Evicted for node pressure and any wording
    this version does not know (the infrastructure's)."""
    if message and any(words in message for words in _OWN_LIMIT_WORDING):
        return Cause.STORAGE_LIMIT_EXCEEDED
    return Cause.EVICTED


class ClusterDisruption(msgspec.Struct, frozen=True, gc=False):
    """A pod's DisruptionTarget condition, read: which component is taking it, and whether
    that can still be undone (a pending one may be cleared, and the pod lives on)."""

    cause: Cause  # what it makes a death: Drained, Preempted, TaintEvicted, ...
    reason: str  # the condition's reason, as the component wrote it
    message: str | None  # the component's own sentence
    since: datetime | None  # when the condition was set
    final: bool  # the pod's deletion is requested, or its phase is terminal


def disruption_of(pod: PodView) -> ClusterDisruption | None:
    """The disruption the pod's DisruptionTarget=True condition announces, if any."""
    d = pod.disruption
    if d is None:
        return None
    if d.reason == KUBELET:
        cause = _BY_KUBELET_REASON.get(pod.reason or "")
        if cause is None and (pod.eviction_notice is not None or _eviction_wording(d.message)):
            cause = Cause.EVICTED  # the pod's reason lost (left Succeeded): its words say it
        if cause is Cause.EVICTED:
            cause = eviction_cause(d.message or pod.kubelet_eviction)
        cause = cause or Cause.DISRUPTED
    elif d.reason == TAINT_MANAGER and pod.node_lost:
        # the node controller had taken Ready away (its kubelet silent): the taint is
        # node.kubernetes.io/unreachable or not-ready, not one a person put there
        cause = Cause.NODE_UNREACHABLE
    else:
        cause = _BY_REASON.get(d.reason, Cause.DISRUPTED)
    # a terminal phase cannot be undone either: Succeeded too (a process that exits 0 when
    # the kubelet's SIGTERM comes leaves its evicted pod Succeeded)
    final = pod.deletion_requested_at is not None or pod.phase in ("Failed", "Succeeded")
    return ClusterDisruption(cause, d.reason, d.message, d.since, final)


class Situation(msgspec.Struct, frozen=True, gc=False):
    pod: PodView
    now: datetime
    # Start of the current not-Ready spell of the sandbox, or None while it is Ready: a Ready
    # drop that a helper, a sidecar that is not vital, a completed container or a readiness
    # gate explains is none (the engine's `sandbox_ready`)
    ready_drop_at: datetime | None
    # the sandbox's container (or vital sidecar) that terminated or restarted; a clean exit
    # with no restart to follow is a completion, never a death
    container_death: ContainerDeath | None
    settings: PolicySettings
    # The cluster is taking (or took) the pod: its DisruptionTarget condition, read.
    disruption: ClusterDisruption | None = None

    @property
    def node_lost(self) -> bool:
        """The node, not the kubelet, changed the pod: its kubelet stopped reporting."""
        return self.pod.node_lost


class Decision(msgspec.Struct, frozen=True, gc=False):
    state: State  # ALIVE, SUSPECT or DEAD
    cause: Cause | None = None
    # For SUSPECT: when the engine must look again even if nothing changes.
    deadline: datetime | None = None

    def __post_init__(self) -> None:
        if self.state not in (State.ALIVE, State.SUSPECT, State.DEAD):
            raise ValueError(f"a policy decides Alive, Suspect or Dead, not {self.state}")
        if self.state is State.SUSPECT and self.deadline is None:
            raise ValueError("a Suspect decision needs a deadline")


@runtime_checkable
class Policy(Protocol):
    """A death heuristic. Implementations must be pure: no clock, no I/O."""

    @property
    def name(self) -> str: ...

    def applies(self, pod: PodView, settings: PolicySettings) -> bool:
        """Whether automatic selection should pick this policy for the pod."""
        ...

    def judge(self, situation: Situation) -> Decision: ...


class Policies(Protocol):
    """Where the engine's callers find policies by name (`_policies.PolicyRegistry`)."""

    def get(self, name: str) -> Policy: ...

    def select(self, pod: PodView, configured: str, settings: PolicySettings) -> Policy: ...


def by_disruption(s: Situation) -> Decision | None:
    """A disruption that can no longer be undone is the sandbox's death, named for it, unless
    a container had already died before it began (then that is the death). None when there
    is no final disruption: the policy judges as it would anyway. Every built-in policy
    starts with this; a plugin may too."""
    d = s.disruption
    if d is None or not d.final:
        return None
    death = s.container_death
    if (
        death is not None
        and death.finished_at is not None
        and d.since is not None
        and death.finished_at < d.since
        # the kubelet's own DisruptionTarget is sent, and its time stamped, only once the
        # containers it killed have stopped (status_manager.go, mergePodStatus): its `since`
        # always follows the death it caused, a second later where they straddle one
        and d.reason != KUBELET
    ):
        return Decision(State.DEAD, death.cause)
    return Decision(State.DEAD, d.cause)


_ALIVE = Decision(State.ALIVE)


def by_containers(s: Situation) -> Decision:
    """Death only on proof: a container that terminated or restarted after the pod was Ready.
    The `container-state` policy, and what judges a pod whose own policy failed."""
    if s.container_death is not None:
        return Decision(State.DEAD, s.container_death.cause)
    return _ALIVE
