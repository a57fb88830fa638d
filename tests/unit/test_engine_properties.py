"""Properties of the engine that must hold for every input, checked with hypothesis."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from deathwatch._engine.podview import MalformedPod, read_pod
from deathwatch._engine.timeutil import format_time
from deathwatch._engine.verdict import State
from deathwatch._policies import AUTO, PolicySettings, default_registry
from deathwatch._policies.builtin import exec_window
from tests.builders import at, exec_probe, pod, running, terminated
from tests.engine_driver import Pods
from tests.examples import examples
from tests.lifecycles import lifecycle, observation, probes

SETTINGS = PolicySettings(agent_ports=frozenset({49983}))


def play(
    observations: list[dict[str, Any]], probe: dict[str, Any] | None, policy: str = AUTO
) -> list[tuple[State, bool]]:
    """Run a lifecycle; return (state, ready seen so far) after each step."""
    fleet = Pods(default_registry())
    ever_ready = False
    history: list[tuple[State, bool]] = []
    (_, first), *rest = lifecycle(observations, probe)
    fleet.observe(read_pod(first), at(0), policy, SETTINGS)
    for o, (now, obj) in zip(observations, rest, strict=True):
        step = fleet.observe(read_pod(obj), at(now), policy, SETTINGS)
        ever_ready = ever_ready or o["ready"] is True
        history.append((step.track.state, ever_ready))
        if o["tick"]:
            for s in fleet.expire_due(at(now + 30)):
                history.append((s.track.state, ever_ready))
    return history


@examples(400, slow=True)
@given(
    st.lists(observation, min_size=1, max_size=25),
    probes,
    st.sampled_from([AUTO, "no-probe", "exec-probe", "container-state"]),
)
def test_dead_is_sticky_and_gone_is_terminal(
    obs: list[dict[str, Any]], probe: dict[str, Any] | None, policy: str
) -> None:
    states = [s for s, _ in play(obs, probe, policy)]
    for terminal in (State.DEAD, State.GONE):
        if terminal in states:
            first = states.index(terminal)
            assert all(s is terminal for s in states[first:]), states


@examples(400, slow=True)
@given(
    st.lists(observation, min_size=1, max_size=25),
    probes,
    st.sampled_from([AUTO, "no-probe", "exec-probe", "container-state"]),
)
def test_no_death_without_a_prior_ready(
    obs: list[dict[str, Any]], probe: dict[str, Any] | None, policy: str
) -> None:
    for state, ever_ready in play(obs, probe, policy):
        if state is State.DEAD:
            assert ever_ready


# --- exec-probe: a drop that recovers within W is never death ---------------------------


@examples(300)
@given(
    period=st.integers(1, 30),
    threshold=st.integers(1, 6),
    timeout=st.integers(1, 5),
    multiplier=st.floats(0.5, 4, allow_nan=False),
    up_for=st.integers(0, 500),
    share=st.floats(0, 1, exclude_max=True),
    pokes=st.lists(st.floats(0, 1, exclude_max=True), max_size=8),
)
def test_exec_probe_never_kills_a_drop_that_recovers_within_the_window(
    period: int,
    threshold: int,
    timeout: int,
    multiplier: float,
    up_for: int,
    share: float,
    pokes: list[float],
) -> None:
    probe = exec_probe(period=period, threshold=threshold, timeout=timeout)
    settings_ = PolicySettings(exec_window_multiplier=multiplier)
    fleet = Pods(default_registry())
    ready = pod(ready_at=2, probe=probe)
    window = exec_window(read_pod(ready), multiplier)
    drop = at(2 + up_for)
    # within W: the window is half-open, [drop, drop + W); at drop + W a live timer fires.
    # Times are whole microseconds, as the API and datetime hold them.
    within = timedelta(microseconds=int(share * (window // timedelta(microseconds=1))))
    recover = drop + within
    fleet.observe(read_pod(ready), at(2), "exec-probe", settings_)
    down = read_pod(
        pod(ready=False, ready_at=2 + up_for, probe=probe, containers=[running(ready=False)])
    )
    assert fleet.observe(down, drop, "exec-probe", settings_).track.state is State.SUSPECT
    for p in sorted(pokes):  # the probe keeps failing; timers and replay expiry in between
        t = drop + timedelta(microseconds=int(p * (within // timedelta(microseconds=1))))
        assert fleet.observe(down, t, "exec-probe", settings_).track.state is not State.DEAD
        for s in fleet.expire_before(t):
            assert s.track.state is not State.DEAD
    for s in fleet.expire_before(recover):
        assert s.track.state is not State.DEAD
    up = pod(ready_at=2, probe=probe)
    up["status"]["conditions"][1]["lastTransitionTime"] = format_time(recover)
    back = fleet.observe(read_pod(up), recover, "exec-probe", settings_)
    assert back.track.state is State.ALIVE
    assert back.track.flaps == 1


# --- arbitrary input never raises -------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)

POD_PATHS = [
    ("metadata",),
    ("metadata", "uid"),
    ("metadata", "name"),
    ("metadata", "labels"),
    ("metadata", "deletionTimestamp"),
    ("metadata", "deletionGracePeriodSeconds"),
    ("metadata", "creationTimestamp"),
    ("spec",),
    ("spec", "containers"),
    ("spec", "containers", 0, "readinessProbe"),
    ("spec", "containers", 0, "ports"),
    ("status",),
    ("status", "phase"),
    ("status", "conditions"),
    ("status", "conditions", 1),
    ("status", "conditions", 1, "status"),
    ("status", "conditions", 1, "lastTransitionTime"),
    ("status", "containerStatuses"),
    ("status", "containerStatuses", 0, "state"),
    ("status", "containerStatuses", 0, "restartCount"),
    ("status", "containerStatuses", 0, "lastState"),
]


def mutate(obj: dict[str, Any], path: tuple[Any, ...], value: object) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    node: Any = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return obj


@examples(500)
@given(json_values)
def test_read_pod_of_any_value_raises_only_malformed(value: object) -> None:
    try:
        read_pod(value)
    except MalformedPod as exc:
        error = exc
    else:
        return
    assert error.field


@examples(1000, slow=True)
@given(
    st.lists(st.tuples(st.sampled_from(POD_PATHS), json_values), min_size=1, max_size=3),
    probes,
    st.sampled_from([AUTO, "no-probe", "exec-probe", "container-state"]),
)
def test_pod_shaped_garbage_never_crashes_the_engine(
    mutations: list[tuple[tuple[Any, ...], object]], probe: dict[str, Any] | None, policy: str
) -> None:
    fleet = Pods(default_registry())
    fleet.observe(read_pod(pod(probe=probe)), at(2), policy, SETTINGS)
    obj = pod(ready=False, ready_at=9, probe=probe, containers=[terminated(finished=9)])
    for path, value in mutations:
        try:
            obj = mutate(obj, path, value)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed the parent; keep what we have
    try:
        view = read_pod(obj)
    except MalformedPod:
        return
    fleet.observe(view, at(9), policy, SETTINGS)
    fleet.expire_due(at(500))
    fleet.remove(view.uid, at(600), view)
