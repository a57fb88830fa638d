"""The public API for policy plugins: everything a third-party death policy may import.

    from deathwatch.policy import Cause, Decision, PodView, PolicySettings, Situation, State

    class Patient:
        name = "patient"

        def applies(self, pod: PodView, settings: PolicySettings) -> bool:
            return False  # plugins are never picked automatically; a DeathWatch names them

        def judge(self, s: Situation) -> Decision:
            if s.container_death is not None:
                return Decision(State.DEAD, s.container_death.cause)
            if s.ready_drop_at is None:
                return Decision(State.ALIVE)
            deadline = s.ready_drop_at + timedelta(minutes=5)
            if s.now >= deadline:
                return Decision(State.DEAD, Cause.UNRESPONSIVE)
            return Decision(State.SUSPECT, Cause.NOT_READY, deadline)

Register it under the entry-point group `deathwatch.policies` (name = the policy's name,
value = the object or a no-argument factory) and name it in a DeathWatch's `spec.policy`.

This module is the whole promise: the names in `__all__` keep their meaning across minor
releases. Every other module under `deathwatch` is private (`deathwatch._*`) and may change
without notice. A policy must be pure (no clock, no I/O): the engine passes `now` in.
"""

from deathwatch._engine.contract import (
    ENTRY_POINT_GROUP,
    ContainerDeath,
    Decision,
    Policy,
    PolicySettings,
    Situation,
)
from deathwatch._engine.podview import ContainerView, PodView, ProbeView, Termination
from deathwatch._engine.verdict import Cause, State

__all__ = [
    "ENTRY_POINT_GROUP",
    "Cause",
    "ContainerDeath",
    "ContainerView",
    "Decision",
    "PodView",
    "Policy",
    "PolicySettings",
    "ProbeView",
    "Situation",
    "State",
    "Termination",
]
