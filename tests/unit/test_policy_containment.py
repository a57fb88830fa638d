"""A third-party policy is untrusted code: when its judge() raises, returns garbage or hangs,
only its own pods suffer. They are judged by container-state (Dead only on proof) and their
track carries the error; every other pod, and the fleet's deadlines, carry on."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from deathwatch._engine.engine import SignalKind, Step, Track
from deathwatch._engine.podview import PodView, read_pod
from deathwatch._engine.verdict import Cause, State
from deathwatch._policies import PolicyRegistry, PolicySettings
from deathwatch._policies.builtin import BUILTIN_ORDER, EXEC_PROBE
from deathwatch._policies.guard import Guarded, PolicyTimeout
from deathwatch.policy import Decision, Situation
from tests.builders import at, exec_probe, pod, running, terminated
from tests.engine_driver import Pods

SETTINGS = PolicySettings(agent_ports=frozenset({49983}))


@dataclass
class Plugin:
    """A plugin whose judge() does whatever the test sets `behaviour` to."""

    behaviour: Any = None
    name: str = "plugin"
    calls: int = 0
    release: threading.Event = field(default_factory=threading.Event)

    def applies(self, pod: PodView, settings: PolicySettings) -> bool:
        return False

    def window(self, pod: PodView, settings: PolicySettings) -> timedelta | None:
        return None

    def judge(self, s: Situation) -> Decision:
        self.calls += 1
        if self.behaviour == "hang":
            self.release.wait(10)
        if isinstance(self.behaviour, BaseException):
            raise self.behaviour
        if callable(self.behaviour):
            return self.behaviour(s)  # type: ignore[no-any-return]
        if self.behaviour is not None:
            return self.behaviour  # type: ignore[no-any-return]
        return EXEC_PROBE.judge(s)


def fleet_with(plugin: Any) -> Pods:
    policies = {p.name: p for p in BUILTIN_ORDER}
    policies["plugin"] = plugin
    return Pods(PolicyRegistry(policies))


def see(fleet: Pods, obj: dict[str, Any], now: float, policy: str = "plugin") -> Step:
    return fleet.observe(read_pod(obj), at(now), policy, SETTINGS)


def ready(uid: str = "uid-1", name: str = "sbx-1") -> dict[str, Any]:
    return pod(uid=uid, name=name, ready=True, ready_at=2, probe=exec_probe())


def dropped(uid: str = "uid-1", name: str = "sbx-1", at_s: float = 10) -> dict[str, Any]:
    return pod(
        uid=uid,
        name=name,
        ready=False,
        ready_at=at_s,
        probe=exec_probe(),
        containers=[running(ready=False)],
    )


def failures(step: Step) -> list[str | None]:
    return [step.track.policy_error for s in step.signals if s.kind is SignalKind.POLICY_FAILED]


@pytest.mark.parametrize(
    ("behaviour", "error"),
    [
        (RuntimeError("boom"), "RuntimeError: boom"),
        (lambda s: None, "returned NoneType, not a Decision"),
        ("Dead", "returned str, not a Decision: 'Dead'"),
        (lambda s: Decision(State.SUSPECT, Cause.NOT_READY, s.now - timedelta(seconds=1)), "a Suspect deadline outside"),
        (lambda s: Decision(State.SUSPECT, Cause.NOT_READY, s.now + timedelta(days=400)), "a Suspect deadline outside"),
        (lambda s: Decision(State.SUSPECT, Cause.NOT_READY, s.now.replace(tzinfo=None) + timedelta(seconds=5)), "not an aware datetime"),
        (lambda s: Decision(State.DEAD, "Unresponsive"), "a cause that is not a Cause"),  # type: ignore[arg-type]
        (lambda s: Decision(State.GONE), "ValueError: a policy decides Alive, Suspect or Dead"),
    ],
)  # fmt: skip
def test_a_failing_policy_falls_back_to_container_state_for_its_pod(
    behaviour: Any, error: str
) -> None:
    plugin = Plugin()
    fleet = fleet_with(plugin)
    see(fleet, ready(), 2)
    plugin.behaviour = behaviour
    step = see(fleet, dropped(), 10)
    # container-state does not judge by Ready: not Ready is not dead without proof
    assert step.track.state is State.ALIVE
    assert step.track.policy == "plugin"  # still the pod's policy; it is only being stood in for
    assert [error in (d or "") for d in failures(step)] == [True], failures(step)
    assert error in (step.track.policy_error or "")
    # proof is still proof: the container exits while the policy is broken -> Dead
    exited = pod(
        ready=False,
        ready_at=20,
        phase="Failed",
        probe=exec_probe(),
        containers=[terminated(code=3)],
    )
    dead = see(fleet, exited, 20).track
    assert (dead.state, dead.cause, dead.evidence.exit_code if dead.evidence else None) == (
        State.DEAD,
        Cause.CONTAINER_EXITED,
        3,
    )


def test_the_error_clears_when_the_policy_works_again() -> None:
    plugin = Plugin(RuntimeError("boom"))
    fleet = fleet_with(plugin)
    see(fleet, ready(), 2)
    assert see(fleet, dropped(), 10).track.policy_error == "RuntimeError: boom"
    plugin.behaviour = None  # fixed: exec-probe's judgement from here on
    step = see(fleet, dropped(), 11)
    assert step.track.policy_error is None
    assert failures(step) == []
    assert (step.track.state, step.track.cause) == (State.SUSPECT, Cause.NOT_READY)


def test_other_pods_are_untouched_and_due_deadlines_are_judged_one_by_one() -> None:
    plugin = Plugin()  # behaves as exec-probe until told otherwise
    fleet = fleet_with(plugin)
    see(fleet, ready("a", "a"), 2)
    see(fleet, ready("b", "b"), 2, policy="exec-probe")
    see(fleet, dropped("a", "a"), 10)
    see(fleet, dropped("b", "b"), 10, policy="exec-probe")
    assert {t.uid: t.state for t in fleet.tracks.values()} == {
        "a": State.SUSPECT, "b": State.SUSPECT}  # fmt: skip
    plugin.behaviour = RuntimeError("raises when the window closes")
    steps = fleet.expire_due(at(10 + 62))
    by_uid = {s.track.uid: s.track for s in steps}
    assert (by_uid["b"].state, by_uid["b"].cause) == (State.DEAD, Cause.UNRESPONSIVE)
    assert by_uid["a"].state is State.ALIVE and by_uid["a"].policy_error is not None
    assert fleet.next_deadline() is None  # nothing left pending, nothing looping


def test_a_hung_judge_costs_one_budget_then_is_skipped_until_it_returns() -> None:
    plugin = Plugin("hang")
    guarded = Guarded(plugin, budget=0.05)
    fleet = fleet_with(guarded)
    plugin.behaviour = None
    see(fleet, ready(), 2)
    plugin.behaviour = "hang"
    started = time.perf_counter()
    first = see(fleet, dropped(), 10)
    took = time.perf_counter() - started
    assert 0.04 <= took < 1.0, took
    assert "PolicyTimeout" in (first.track.policy_error or "")
    started = time.perf_counter()
    second = see(fleet, dropped(), 11)
    assert time.perf_counter() - started < 0.02  # the stuck call is not waited on again
    assert "still running" in (second.track.policy_error or "")
    assert plugin.calls == 2  # one for Ready, one that hung: none queued behind it
    plugin.behaviour = None
    plugin.release.set()
    deadline = time.monotonic() + 5
    while guarded.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    third = see(fleet, dropped(), 12)
    assert third.track.policy_error is None
    assert third.track.state is State.SUSPECT


def test_the_guard_passes_results_and_exceptions_through() -> None:
    guarded = Guarded(Plugin(KeyError("k")), budget=1)
    track = Track(uid="u", namespace="n", name="p", policy="plugin")
    assert guarded.name == "plugin"
    s = Situation(read_pod(ready()), at(3), None, None, SETTINGS)
    with pytest.raises(KeyError):
        guarded.judge(s)
    assert Guarded(Plugin(), budget=1).judge(s) == Decision(State.ALIVE)
    assert issubclass(PolicyTimeout, Exception)
    assert track.policy_error is None
