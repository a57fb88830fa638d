"""The contract between the engine and a policy: plain data in, a decision out.

The bottom of the import graph with the rest of `_engine`: policies (`_policies`, plugins
through `deathwatch.policy`) import it, it imports nothing above it.

A policy is consulted only for a pod that has been Ready at least once and is not yet Dead
or Gone; deletion, completion and eviction are decided by the engine before any policy is
asked, so no policy can turn a deletion into a death. A Suspect decision carries its own
deadline: that is the policy's window, and the only place it is stated (`window()`, which
nothing ever called, left the contract; a plugin that still defines it loads as before).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from deathwatch._engine.podview import PodView
from deathwatch._engine.verdict import Cause, State

ENTRY_POINT_GROUP = "deathwatch.policies"  # where plugins register (name = the policy's name)


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """Per-DeathWatch knobs a policy may read."""

    exec_window_multiplier: float = 2.0
    agent_ports: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class ContainerDeath:
    """A container that terminated, or restarted, after the pod had been Ready."""

    container: str
    exit_code: int | None
    reason: str | None
    finished_at: datetime | None
    restart_count: int

    @property
    def cause(self) -> Cause:
        return Cause.OOM_KILLED if self.reason == "OOMKilled" else Cause.CONTAINER_EXITED


@dataclass(frozen=True, slots=True)
class Situation:
    pod: PodView
    now: datetime
    # Start of the current not-Ready spell, or None while Ready.
    ready_drop_at: datetime | None
    container_death: ContainerDeath | None
    settings: PolicySettings

    @property
    def node_lost(self) -> bool:
        """The node, not the kubelet, changed the pod: its kubelet stopped reporting."""
        return self.pod.node_lost


@dataclass(frozen=True, slots=True)
class Decision:
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


def by_containers(s: Situation) -> Decision:
    """Death only on proof: a container that terminated or restarted after the pod was Ready.
    The `container-state` policy, and what judges a pod whose own policy failed."""
    if s.container_death is not None:
        return Decision(State.DEAD, s.container_death.cause)
    return Decision(State.ALIVE)
