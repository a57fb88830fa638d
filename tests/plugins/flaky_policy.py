"""A third-party death policy for the chaos lane, installed into the controller process
through an entry point: it judges like exec-probe with a 2 s window, except that it raises
the moment a Suspect window closes (the failure that once killed the deadline loop).
Like any plugin it imports only `deathwatch.policy`."""

from __future__ import annotations

from datetime import timedelta

from deathwatch.policy import Cause, Decision, PodView, PolicySettings, Situation, State

WINDOW = timedelta(seconds=2)


class Flaky:
    name = "flaky"

    def applies(self, pod: PodView, settings: PolicySettings) -> bool:
        return False

    def window(self, pod: PodView, settings: PolicySettings) -> timedelta | None:
        return WINDOW

    def judge(self, s: Situation) -> Decision:
        if s.container_death is not None:
            return Decision(State.DEAD, s.container_death.cause)
        if s.ready_drop_at is None:
            return Decision(State.ALIVE)
        deadline = s.ready_drop_at + WINDOW
        if s.now >= deadline:
            raise RuntimeError("flaky: cannot decide once the window has closed")
        return Decision(State.SUSPECT, Cause.NOT_READY, deadline)
