"""The public API for policy plugins: everything a third-party death policy may import.

    from deathwatch.policy import (
        Cause, Decision, PodView, PolicySettings, Situation, State, by_disruption,
    )

    class Patient:
        name = "patient"
        # optional: Ready means "the containers run" for the pods it judges (no readiness
        # probe), so the engine may infer that a pod first seen stopped was Ready and died
        ready_means_running = False

        def applies(self, pod: PodView, settings: PolicySettings) -> bool:
            return False  # plugins are never picked automatically; a DeathWatch names them

        def judge(self, s: Situation) -> Decision:
            # the cluster took it (drain, preemption, taint eviction, node deleted or shut
            # down, node pressure): Dead, named for it. Without this, a final disruption the
            # policy does not call a death is Gone with the same cause.
            if (disrupted := by_disruption(s)) is not None:
                return disrupted
            if s.container_death is not None:
                return Decision(State.DEAD, s.container_death.cause)
            if s.ready_drop_at is None:
                return Decision(State.ALIVE)
            deadline = s.ready_drop_at + timedelta(minutes=5)
            if s.now >= deadline:
                return Decision(State.DEAD, Cause.UNRESPONSIVE)
            return Decision(State.SUSPECT, Cause.NOT_READY, deadline)

`s.disruption` is the pod's DisruptionTarget condition, read (`ClusterDisruption`: its cause,
the component's reason and message, when it was set, and whether it is `final`). While it is
pending the engine holds every policy to "at most Suspect" unless a container is dead: the
control plane clears a disruption that does not go ahead, and Dead is never taken back.

Register it under the entry-point group `deathwatch.policies` (name = the policy's name,
value = the object or a no-argument factory) and name it in a DeathWatch's `spec.policy`.

This module is the whole promise: the names in `__all__` keep their meaning across minor
releases. Every other module under `deathwatch` is private (`deathwatch._*`) and may change
without notice. A policy must be pure (no clock, no I/O): the engine passes `now` in.
"""

from deathwatch._engine.contract import (
    ENTRY_POINT_GROUP,
    ClusterDisruption,
    ContainerDeath,
    Decision,
    Policy,
    PolicySettings,
    Situation,
    by_containers,
    by_disruption,
)
from deathwatch._engine.podview import ContainerView, Disruption, PodView, ProbeView, Termination
from deathwatch._engine.verdict import Cause, Origin, State, origin_of

__all__ = [
    "ENTRY_POINT_GROUP",
    "Cause",
    "ClusterDisruption",
    "ContainerDeath",
    "ContainerView",
    "Decision",
    "Disruption",
    "Origin",
    "PodView",
    "Policy",
    "PolicySettings",
    "ProbeView",
    "Situation",
    "State",
    "Termination",
    "by_containers",
    "by_disruption",
    "origin_of",
]
