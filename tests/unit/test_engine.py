"""Every transition and cause of the verdict engine, on hand-made Pod dicts."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from deathwatch._engine.engine import SignalKind
from deathwatch._engine.podview import read_pod
from deathwatch._engine.verdict import Cause, State
from deathwatch._policies import AUTO, PolicySettings, UnknownPolicy, default_registry
from deathwatch._policies.builtin import exec_window
from tests.builders import at, exec_probe, pod, running, tcp_probe, terminated, termination, waiting
from tests.engine_driver import Judge, Pods

AGENT = frozenset({49983})


def pending() -> dict[str, Any]:
    return pod(ready=False, ready_at=0, phase="Pending", containers=[waiting()])


# --- no-probe ---------------------------------------------------------------------------


def test_no_probe_pod_is_pending_then_alive() -> None:
    j = Judge()
    assert j.see(pending(), 0).state is State.PENDING
    t = j.see(pod(ready_at=2), 2)
    assert t.state is State.ALIVE
    assert t.policy == "no-probe"
    assert t.last_ready_at == at(2)


def test_no_probe_exit_is_dead_at_once_with_full_evidence() -> None:
    j = Judge()
    j.see(pending(), 0)
    j.see(pod(ready_at=2), 2)
    t = j.see(
        pod(ready=False, ready_at=50, phase="Failed", containers=[terminated(code=3, finished=50)]),
        50.4,
    )
    assert t.state is State.DEAD
    e = t.evidence
    assert e is not None
    assert (e.cause, e.container, e.exit_code, e.reason, e.restart_count) == (
        Cause.CONTAINER_EXITED,
        "agent",
        3,
        "Error",
        0,
    )
    assert (e.pod_uid, e.policy, e.namespace, e.name) == ("uid-1", "no-probe", "sandboxes", "sbx-1")
    assert (e.last_ready_at, e.ready_drop_at, e.declared_at) == (at(2), at(50), at(50.4))
    assert j.signals.count(SignalKind.READY_DROPPED) == 1


def test_no_probe_drop_while_phase_still_running_is_dead() -> None:
    j = Judge()
    j.see(pod(), 2)
    t = j.see(
        pod(
            ready=False,
            ready_at=30,
            containers=[terminated(code=0, reason="Completed", finished=30)],
        ),
        30,
    )
    assert (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
    assert t.evidence is not None and t.evidence.exit_code == 0


def test_oom_killed() -> None:
    j = Judge()
    j.see(pod(), 2)
    t = j.see(
        pod(
            ready=False,
            ready_at=9,
            phase="Failed",
            containers=[terminated(code=137, reason="OOMKilled", finished=9)],
        ),
        9,
    )
    assert (t.state, t.cause) == (State.DEAD, Cause.OOM_KILLED)


def test_oom_is_preferred_evidence_among_several_containers() -> None:
    j = Judge()
    j.see(pod(containers=[running("a"), running("b")]), 2)
    t = j.see(
        pod(
            ready=False,
            ready_at=9,
            containers=[
                terminated("a", code=0, reason="Completed", finished=9),
                terminated("b", code=137, reason="OOMKilled", finished=9),
            ],
        ),
        9,
    )
    assert t.evidence is not None and (t.cause, t.evidence.container) == (Cause.OOM_KILLED, "b")


def test_eviction_is_death() -> None:
    j = Judge()
    j.see(pod(), 2)
    t = j.see(
        pod(
            ready=False,
            ready_at=20,
            phase="Failed",
            reason="Evicted",
            containers=[terminated(code=137, finished=20)],
        ),
        20,
    )
    assert (t.state, t.cause) == (State.DEAD, Cause.EVICTED)
    assert t.evidence is not None and t.evidence.reason == "Error"


def test_eviction_before_ready_is_not_death() -> None:
    j = Judge()
    j.see(pending(), 0)
    t = j.see(
        pod(ready=False, ready_at=0, phase="Failed", reason="Evicted", containers=[waiting()]), 5
    )
    assert (t.state, t.cause) == (State.GONE, Cause.FAILED_BEFORE_READY)


def test_failure_before_first_ready_is_not_death() -> None:
    j = Judge()
    j.see(pending(), 0)
    assert (
        j.see(
            pod(
                ready=False,
                ready_at=0,
                phase="Pending",
                containers=[waiting(reason="CrashLoopBackOff")],
            ),
            3,
        ).state
        is State.PENDING
    )
    t = j.see(
        pod(ready=False, ready_at=0, phase="Failed", containers=[terminated(code=1, finished=4)]), 4
    )
    assert (t.state, t.cause) == (State.GONE, Cause.FAILED_BEFORE_READY)


def test_crashes_before_first_ready_do_not_count_as_restarts_later() -> None:
    j = Judge()
    j.see(pod(ready=False, ready_at=0, containers=[running(restarts=2, ready=False)]), 1)
    assert j.see(pod(ready_at=5, containers=[running(restarts=2)]), 5).state is State.ALIVE
    assert j.see(pod(ready_at=5, containers=[running(restarts=2)]), 8).state is State.ALIVE


def test_deletion_then_drop_is_gone_not_dead() -> None:
    j = Judge()
    j.see(pod(), 2)
    t = j.see(pod(deletion_at=100), 100)
    assert (t.state, t.cause) == (State.GONE, Cause.DELETED)
    t = j.see(
        pod(
            deletion_at=100,
            ready=False,
            ready_at=101,
            containers=[terminated(code=143, finished=101)],
        ),
        101,
    )
    assert (t.state, t.cause) == (State.GONE, Cause.DELETED)
    assert SignalKind.READY_DROPPED not in j.signals


def test_deletion_and_drop_seen_together_is_gone_when_drop_is_after_request() -> None:
    j = Judge()
    j.see(pod(), 2)
    t = j.see(
        pod(
            deletion_at=100,
            ready=False,
            ready_at=101,
            containers=[terminated(code=143, finished=101)],
        ),
        101,
    )
    assert (t.state, t.cause) == (State.GONE, Cause.DELETED)


def test_death_before_deletion_request_stands() -> None:
    j = Judge()
    j.see(pod(), 2)
    t = j.see(
        pod(
            deletion_at=100, ready=False, ready_at=60, containers=[terminated(code=2, finished=60)]
        ),
        101,
    )
    assert (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)


def test_exec_suspect_deleted_within_window_is_gone() -> None:
    j = Judge()
    j.see(pod(probe=exec_probe()), 2)
    assert j.see(pod(probe=exec_probe(), ready=False, ready_at=10), 10).state is State.SUSPECT
    t = j.see(pod(probe=exec_probe(), ready=False, ready_at=10, deletion_at=30), 30)
    assert (t.state, t.cause) == (State.GONE, Cause.DELETED)


def test_exec_suspect_past_window_before_deletion_is_dead() -> None:
    j = Judge()
    j.see(pod(probe=exec_probe()), 2)
    j.see(pod(probe=exec_probe(), ready=False, ready_at=10, containers=[running(ready=False)]), 10)
    # the controller missed its timer (down): the deletion came after the window closed
    t = j.see(
        pod(
            probe=exec_probe(),
            ready=False,
            ready_at=10,
            deletion_at=80,
            containers=[running(ready=False)],
        ),
        200,
    )
    assert (t.state, t.cause) == (State.DEAD, Cause.UNRESPONSIVE)


def test_completion_is_gone() -> None:
    j = Judge()
    j.see(pod(), 2)
    t = j.see(
        pod(
            ready=False,
            ready_at=9,
            phase="Succeeded",
            containers=[terminated(code=0, reason="Completed", finished=9)],
        ),
        9,
    )
    assert (t.state, t.cause) == (State.GONE, Cause.COMPLETED)


def test_dead_is_sticky_and_false_positive_counted_once() -> None:
    j = Judge()
    j.see(pod(), 2)
    j.see(pod(ready=False, ready_at=9, containers=[running(ready=False)]), 9)
    assert (j.track.state, j.track.cause) == (State.DEAD, Cause.UNKNOWN)
    for now in (12, 15, 20):
        assert j.see(pod(ready=True, ready_at=12), now).state is State.DEAD
        j.see(pod(ready=False, ready_at=21, containers=[running(ready=False)]), now + 1)
    assert j.track.false_positive
    assert j.signals.count(SignalKind.FALSE_POSITIVE) == 1
    assert j.track.evidence is not None and j.track.evidence.declared_at == at(9)


def test_gone_is_terminal() -> None:
    j = Judge()
    j.see(pod(), 2)
    j.see(pod(deletion_at=10), 10)
    assert (
        j.see(
            pod(ready=False, ready_at=11, phase="Failed", containers=[terminated(finished=11)]), 11
        ).state
        is State.GONE
    )


def test_restart_while_ready_is_death_even_if_the_drop_was_missed() -> None:
    j = Judge()
    j.see(pod(), 2)
    t = j.see(
        pod(
            ready_at=45,
            containers=[running(since=44, restarts=1, last=termination(code=2, finished=40))],
        ),
        45,
    )
    assert (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
    assert t.evidence is not None
    assert (t.evidence.exit_code, t.evidence.restart_count, t.evidence.ready_drop_at) == (
        2,
        1,
        at(40),
    )


def test_restart_without_last_state_is_still_death() -> None:
    j = Judge()
    j.see(pod(), 2)
    t = j.see(pod(ready_at=2, containers=[running(restarts=1)]), 45)
    assert (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
    assert t.evidence is not None and t.evidence.exit_code is None


def test_node_lost_under_no_probe() -> None:
    j = Judge()
    j.see(pod(), 2)
    # the node controller flips Ready only; containers still say ready and running
    t = j.see(pod(ready=False, ready_at=300, containers=[running(ready=True)]), 300)
    assert (t.state, t.cause) == (State.DEAD, Cause.NODE_LOST)


def test_stale_ready_transition_time_is_not_used_as_drop_time() -> None:
    j = Judge()
    j.see(pod(ready_at=20), 20)
    t = j.see(pod(ready=False, ready_at=5, containers=[terminated(finished=30)]), 30)
    assert t.ready_drop_at == at(30)


# --- exec-probe -------------------------------------------------------------------------


def exec_pod(**kw: Any) -> dict[str, Any]:
    kw.setdefault("probe", exec_probe())
    return pod(**kw)


def test_exec_window_defaults_to_62s() -> None:
    assert exec_window(read_pod(exec_pod()), 2.0) == timedelta(seconds=62)
    assert exec_window(read_pod(exec_pod(probe={"exec": {"command": ["x"]}})), 2.0) == timedelta(
        seconds=62
    )
    slow = exec_pod(probe=exec_probe(period=5, threshold=6, timeout=4))
    assert exec_window(read_pod(slow), 1.5) == timedelta(seconds=(6 * 5 + 4) * 1.5)


def test_exec_drop_is_suspect_with_deadline_then_recovery_is_a_flap() -> None:
    j = Judge()
    j.see(exec_pod(), 12)
    t = j.see(exec_pod(ready=False, ready_at=100, containers=[running(ready=False)]), 100)
    assert (t.state, t.cause, t.deadline) == (State.SUSPECT, Cause.NOT_READY, at(162))
    assert t.policy == "exec-probe"
    j.tick(161)
    assert j.track.state is State.SUSPECT
    t = j.see(exec_pod(ready=True, ready_at=140), 140)
    assert (t.state, t.flaps) == (State.ALIVE, 1)
    assert t.deadline is None


def test_exec_every_flap_counts() -> None:
    j = Judge()
    j.see(exec_pod(), 12)
    for k in range(3):
        base = 100 + 100 * k
        j.see(exec_pod(ready=False, ready_at=base, containers=[running(ready=False)]), base)
        j.see(exec_pod(ready_at=base + 30), base + 30)
    assert (j.track.state, j.track.flaps, j.track.ready_drops) == (State.ALIVE, 3, 3)
    assert j.signals.count(SignalKind.FLAPPED) == 3


def test_exec_hang_past_window_is_unresponsive_at_the_deadline() -> None:
    j = Judge()
    j.see(exec_pod(), 12)
    j.see(exec_pod(ready=False, ready_at=100, containers=[running(ready=False)]), 100)
    j.tick(162)
    t = j.track
    assert (t.state, t.cause) == (State.DEAD, Cause.UNRESPONSIVE)
    assert t.evidence is not None and t.evidence.declared_at == at(162)
    assert t.evidence.ready_drop_at == at(100)


def test_exec_recovery_exactly_at_deadline_is_not_death_in_replay_order() -> None:
    j = Judge()
    j.see(exec_pod(), 12)
    j.see(exec_pod(ready=False, ready_at=100, containers=[running(ready=False)]), 100)
    for s in j.fleet.expire_before(at(162)):
        j._record(s)
    assert j.see(exec_pod(ready_at=162), 162).state is State.ALIVE


def test_exec_container_exit_during_suspect_is_dead_at_once() -> None:
    j = Judge()
    j.see(exec_pod(), 12)
    j.see(exec_pod(ready=False, ready_at=100, containers=[running(ready=False)]), 100)
    t = j.see(
        exec_pod(
            ready=False, ready_at=100, phase="Failed", containers=[terminated(code=9, finished=105)]
        ),
        105,
    )
    assert (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
    assert t.evidence is not None and t.evidence.ready_drop_at == at(100)


def test_exec_restart_is_dead_at_once() -> None:
    j = Judge()
    j.see(exec_pod(), 12)
    t = j.see(
        exec_pod(
            ready=False,
            ready_at=50,
            containers=[running(restarts=1, ready=False, last=termination(finished=49))],
        ),
        50,
    )
    assert (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)


def test_exec_node_lost_waits_for_the_window() -> None:
    j = Judge()
    j.see(exec_pod(), 12)
    t = j.see(exec_pod(ready=False, ready_at=100, containers=[running(ready=True)]), 100)
    assert t.state is State.SUSPECT
    j.tick(170)
    assert (j.track.state, j.track.cause) == (State.DEAD, Cause.NODE_LOST)


def test_multiplier_changes_the_window() -> None:
    j = Judge(multiplier=1.0)
    j.see(exec_pod(), 12)
    t = j.see(exec_pod(ready=False, ready_at=100, containers=[running(ready=False)]), 100)
    assert t.deadline == at(131)


# --- container-state and the firewall flag ----------------------------------------------


def test_tcp_probe_on_agent_port_selects_container_state_and_is_flagged() -> None:
    j = Judge()
    t = j.see(pod(probe=tcp_probe("agent"), ready=False, ready_at=0), 5)
    assert (t.policy, t.probe_blocked, t.state) == ("container-state", True, State.PENDING)
    assert j.signals.count(SignalKind.PROBE_BLOCKED) == 1
    j.see(pod(probe=tcp_probe("agent"), ready=False, ready_at=0), 6)
    assert j.signals.count(SignalKind.PROBE_BLOCKED) == 1


def test_tcp_probe_on_numeric_agent_port_is_flagged_but_other_port_is_not() -> None:
    assert Judge().see(pod(probe=tcp_probe(49983)), 5).probe_blocked
    assert not Judge().see(pod(probe=tcp_probe(8080)), 5).probe_blocked
    assert not Judge().see(pod(probe=tcp_probe("http")), 5).probe_blocked
    assert not Judge(agent_ports=frozenset()).see(pod(probe=tcp_probe("agent")), 5).probe_blocked


def test_http_probe_selects_container_state() -> None:
    assert (
        Judge().see(pod(probe={"httpGet": {"port": 8080, "path": "/"}}), 5).policy
        == "container-state"
    )


def test_container_state_ignores_ready_but_counts_flaps() -> None:
    j = Judge(policy="container-state")
    j.see(pod(), 2)
    assert j.see(pod(ready=False, ready_at=10), 10).state is State.ALIVE
    t = j.see(pod(ready_at=20), 20)
    assert (t.state, t.flaps) == (State.ALIVE, 1)
    t = j.see(pod(ready=False, ready_at=30, containers=[terminated(code=4, finished=30)]), 30)
    assert (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)


def test_configured_policy_overrides_selection() -> None:
    j = Judge(policy="no-probe")
    j.see(exec_pod(), 12)
    t = j.see(exec_pod(ready=False, ready_at=100, containers=[running(ready=False)]), 100)
    assert (t.policy, t.state) == ("no-probe", State.DEAD)


def test_unknown_policy_names_itself_and_the_known_ones() -> None:
    with pytest.raises(
        UnknownPolicy,
        match=r"'nope' is not known; known: auto, container-state, exec-probe, no-probe",
    ):
        default_registry().validate("nope")


# --- records and removal ----------------------------------------------------------------


def test_first_sight_of_a_stopped_no_probe_pod_is_a_death() -> None:
    # the controller was down while the pod started, ran and died
    j = Judge()
    t = j.see(
        pod(
            ready=False,
            ready_at=50,
            phase="Failed",
            containers=[terminated(code=5, started=1, finished=50)],
        ),
        70,
    )
    assert (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
    assert t.evidence is not None and (t.evidence.ready_drop_at, t.evidence.last_ready_at) == (
        at(50),
        at(1),
    )


def test_first_sight_of_a_restarted_running_pod_is_not_a_death() -> None:
    j = Judge()
    t = j.see(pod(containers=[running(restarts=3, last=termination())]), 70)
    assert t.state is State.ALIVE


def test_first_sight_of_a_pod_that_never_started_is_pending() -> None:
    j = Judge()
    t = j.see(
        pod(ready=False, ready_at=0, phase="Failed", containers=[waiting(reason="ErrImagePull")]),
        70,
    )
    assert t.state is State.GONE and t.cause is Cause.FAILED_BEFORE_READY


def test_delete_event_of_an_alive_pod_is_gone() -> None:
    j = Judge()
    j.see(pod(), 2)
    t = j.delete(pod(), 30)
    assert (t.state, t.cause) == (State.GONE, Cause.DELETED)


def test_delete_event_whose_last_object_shows_an_earlier_death_is_dead() -> None:
    j = Judge()
    j.see(pod(), 2)
    t = j.delete(
        pod(
            deletion_at=40, grace=0, ready=False, ready_at=30, containers=[terminated(finished=30)]
        ),
        41,
    )
    assert (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)


def test_only_suspects_keep_their_pod_view() -> None:
    """What a Suspect's window is judged on when it closes; nothing else is kept per pod."""
    j = Judge()
    j.see(pod(probe=exec_probe(), ready_at=2), 2)
    remembered = j.fleet.memories["uid-1"]
    assert remembered.seen and remembered.last is None  # Alive: no view kept
    latest = pod(probe=exec_probe(), ready=False, ready_at=10)
    assert j.see(latest, 10).state is State.SUSPECT
    assert remembered.last == read_pod(latest)
    assert j.see(pod(probe=exec_probe(), ready_at=12), 12).state is State.ALIVE
    assert remembered.last is None
    j.see(pod(probe=exec_probe(), deletion_at=20), 20)  # terminal: nothing more to know
    assert not remembered.seen and remembered.last is None


def test_restart_counts_are_read_only_and_shared() -> None:
    a, b = read_pod(pod()), read_pod(pod(uid="uid-2"))
    assert a.restart_counts() is b.restart_counts()
    assert dict(a.restart_counts()) == {"agent": 0}
    with pytest.raises(TypeError):
        a.restart_counts()["agent"] = 1  # type: ignore[index]


def test_state_change_signal_carries_the_previous_state() -> None:
    fleet = Pods(default_registry())
    settings = PolicySettings()
    fleet.observe(read_pod(pod()), at(2), AUTO, settings)
    step = fleet.observe(read_pod(pod(ready=False, ready_at=9)), at(9), AUTO, settings)
    changes = [s for s in step.signals if s.kind is SignalKind.STATE_CHANGED]
    assert [c.previous for c in changes] == [State.ALIVE]
    assert step.track.changed_at == at(9)


def test_next_deadline_skips_recovered_pods() -> None:
    j = Judge()
    j.see(exec_pod(), 12)
    j.see(exec_pod(ready=False, ready_at=100, containers=[running(ready=False)]), 100)
    assert j.fleet.next_deadline() == at(162)
    j.see(exec_pod(ready_at=110), 110)
    assert j.fleet.next_deadline() is None
