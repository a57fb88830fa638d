"""The three built-in policies, in the order automatic selection tries them.

no-probe        no readinessProbe: Ready means "the container is running", so a drop with no
                recovery is death, declared at once. Field evidence: 33,959 sandboxes in 24 h,
                147 drops, 0 recoveries.
exec-probe      exec readiness probes can flap (slow command, loaded container): a drop with the
                containers still running is Suspect for a window W, then Dead (Unresponsive).
container-state Ready means nothing (e.g. a tcpSocket/httpGet/grpc probe that the node firewall
                refuses, since kubelet probes from the host): only a terminated or restarted
                container is death.

All three first ask `by_disruption`: a disruption of the cluster's that can no longer be
undone (drain, preemption, taint eviction, node deleted, node shutdown, node pressure) is the
sandbox's death, named for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from deathwatch._engine.contract import (
    Decision,
    PolicySettings,
    Situation,
    by_containers,
    by_disruption,
)
from deathwatch._engine.podview import PodView, ProbeView
from deathwatch._engine.verdict import Cause, State

_DEFAULT_FAILING_FOR = ProbeView("", "exec", None, 3, 10, 1).failing_for
# The window of each (probes, multiplier) met: a pod's probes are its spec's, the same in each
# of its events, and a few shapes serve a fleet. Bounded: past the cap, computed each time.
_WINDOWS: dict[tuple[tuple[ProbeView, ...], float], timedelta] = {}
_WINDOWS_CAP = 1024


def exec_window(pod: PodView, multiplier: float) -> timedelta:
    """W = multiplier x (failureThreshold x periodSeconds + timeoutSeconds) of the slowest probe.

    With Kubernetes defaults (3, 10 s, 1 s) and multiplier 2 this is 62 s: long enough for a
    probe that fails its threshold once to pass again, short enough to strand nobody long.
    """
    key = (pod.readiness_probes, multiplier)
    window = _WINDOWS.get(key)
    if window is None:
        slowest = max((p.failing_for for p in pod.readiness_probes), default=_DEFAULT_FAILING_FOR)
        window = slowest * multiplier
        if len(_WINDOWS) < _WINDOWS_CAP:
            _WINDOWS[key] = window
    return window


# Decisions are values: the ones that carry no deadline are made once (replay's hot loop)
ALIVE = Decision(State.ALIVE)
_DEAD = {cause: Decision(State.DEAD, cause) for cause in Cause}


def _dead(cause: Cause) -> Decision:
    return _DEAD[cause]


@dataclass(frozen=True, slots=True)
class NoProbe:
    name: str = "no-probe"
    # Ready means "the containers run": a pod first seen stopped was Ready and died
    ready_means_running: bool = True

    def applies(self, pod: PodView, settings: PolicySettings) -> bool:
        return not pod.readiness_probes

    def judge(self, s: Situation) -> Decision:
        if s.disruption is not None and (disrupted := by_disruption(s)) is not None:
            return disrupted
        if s.container_death is not None:
            return _dead(s.container_death.cause)
        if s.ready_drop_at is not None:
            return _dead(Cause.NODE_LOST if s.node_lost else Cause.UNKNOWN)
        return ALIVE


@dataclass(frozen=True, slots=True)
class ExecProbe:
    name: str = "exec-probe"

    def applies(self, pod: PodView, settings: PolicySettings) -> bool:
        return bool(pod.readiness_probes) and all(p.kind == "exec" for p in pod.readiness_probes)

    def judge(self, s: Situation) -> Decision:
        if s.disruption is not None and (disrupted := by_disruption(s)) is not None:
            return disrupted
        if s.container_death is not None:
            return _dead(s.container_death.cause)
        if s.ready_drop_at is None:
            return ALIVE
        deadline = s.ready_drop_at + exec_window(s.pod, s.settings.exec_window_multiplier)
        if s.now >= deadline:
            return _dead(Cause.NODE_LOST if s.node_lost else Cause.UNRESPONSIVE)
        return Decision(State.SUSPECT, Cause.NOT_READY, deadline)


@dataclass(frozen=True, slots=True)
class ByContainerState:
    name: str = "container-state"

    def applies(self, pod: PodView, settings: PolicySettings) -> bool:
        # The fallback of automatic selection: whatever probes a pod has, container state
        # is always observable.
        return True

    def judge(self, s: Situation) -> Decision:
        return by_disruption(s) or by_containers(s)


NO_PROBE = NoProbe()
EXEC_PROBE = ExecProbe()
CONTAINER_STATE = ByContainerState()
BUILTIN_ORDER = (NO_PROBE, EXEC_PROBE, CONTAINER_STATE)
