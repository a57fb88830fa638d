"""A container's exit heard on its node (issue #42, ADR 0028): Dead at once, by the rules the
kubelet's report would be judged by, and never a death the kubelet's report would not make.

Each case is the pod as a fresh read shows it at the exit (the kubelet has not relisted), the
exit, then the kubelet's own report; the property test at the end holds the node path to the
kubelet-only path over arbitrary lifecycles.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deathwatch._engine.engine import SignalKind
from deathwatch._engine.nodeexit import NodeExit
from deathwatch._engine.verdict import Cause, Observer, Origin, State
from deathwatch._policies import AUTO
from deathwatch._policies.builtin import BUILTIN_ORDER
from tests.builders import at, exec_probe, pod, running, terminated, termination
from tests.engine_driver import Judge
from tests.examples import examples

CID = "containerd://" + "a" * 64
NEXT = "containerd://" + "b" * 64
POLICIES = [AUTO, *(p.name for p in BUILTIN_ORDER)]


def exit_of(code: int = 3, t: float = 50.25, oom: bool = False, cid: str = CID) -> NodeExit:
    return NodeExit(cid, code, oom, at(t), "node-a")


def live(**kw: Any) -> dict[str, Any]:
    """The sandbox Ready, its container `CID` running: as a read shows it before the relist."""
    kw.setdefault("containers", [running(cid=CID)])
    return pod(**kw)


def kubelet_report(
    code: int = 3, t: float = 51, reason: str = "Error", **kw: Any
) -> dict[str, Any]:
    """What the kubelet writes at its next relist after the exit (restartPolicy Never)."""
    containers = [terminated(code=code, reason=reason, finished=int(t - 1), cid=CID)]
    return pod(ready=False, ready_at=t, containers=containers, **kw)


def probe_for(policy: str) -> dict[str, Any] | None:
    return exec_probe() if policy == "exec-probe" else None


@pytest.mark.parametrize("policy", POLICIES)
def test_an_exit_of_the_watched_container_is_dead_at_once_under_every_built_in(
    policy: str,
) -> None:
    j = Judge(policy)
    probe = probe_for(policy)
    j.see(live(probe=probe), 2)
    t = j.exit(live(probe=probe), exit_of(3), 50.3)
    assert t is not None and (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
    e = t.evidence
    assert e is not None
    assert (e.observed_by, e.container, e.container_id) == (Observer.NODE, "agent", CID)
    assert (e.exit_code, e.reason, e.origin) == (3, "Error", Origin.WORKLOAD)
    assert e.ready_drop_at == at(50.25)  # the exit itself, to the microsecond
    # the kubelet's report agrees: nothing changes, nothing is said
    after = j.see(kubelet_report(probe=probe), 51)
    assert after is t
    assert SignalKind.DISPUTED not in j.signals and SignalKind.FALSE_POSITIVE not in j.signals


@pytest.mark.parametrize("policy", POLICIES)
def test_an_oom_kill_is_oom_killed(policy: str) -> None:
    j = Judge(policy)
    j.see(live(probe=probe_for(policy)), 2)
    t = j.exit(live(probe=probe_for(policy)), exit_of(137, oom=True), 50.3)
    assert t is not None and (t.state, t.cause) == (State.DEAD, Cause.OOM_KILLED)
    assert t.evidence is not None and t.evidence.reason == "OOMKilled"
    j.see(kubelet_report(137, reason="OOMKilled", probe=probe_for(policy)), 51)
    assert SignalKind.DISPUTED not in j.signals


def test_an_exit_of_an_instance_the_status_does_not_name_is_not_judged() -> None:
    """An init container, a sidecar, an exec probe's process, an earlier instance: none is
    the running instance the pod's status names."""
    j = Judge()
    j.see(live(), 2)
    assert j.exit(live(), exit_of(cid=NEXT), 50.3) is None
    assert j.track.state is State.ALIVE
    # the instance already reported terminated by the kubelet: its report judged it
    assert j.exit(live(containers=[terminated(cid=CID)]), exit_of(), 50.3) is None


def test_an_exit_before_the_first_ready_is_start_up() -> None:
    j = Judge()
    starting = pod(ready=False, ready_at=1, containers=[running(ready=False, cid=CID)])
    j.see(starting, 1)
    t = j.exit(starting, exit_of(1), 2)
    assert t is not None and t.state is State.PENDING


@pytest.mark.parametrize(("deletion", "cause"), [(Cause.DELETED, Cause.DELETED),
                                                  (Cause.SUSPENDED, Cause.SUSPENDED)])  # fmt: skip
def test_an_exit_after_the_deletion_the_api_holds_is_gone(deletion: Cause, cause: Cause) -> None:
    """The kubelet stops the containers of a pod being deleted: the read shows the deletion
    the kill answers (a Sandbox suspended, a pod deleted), so it is Gone, never Dead."""
    j = Judge()
    j.see(live(), 2)
    t = j.exit(live(deletion_at=50), exit_of(143, t=50.4), 50.5, deletion=deletion)
    assert t is not None and (t.state, t.cause) == (State.GONE, cause)


def test_an_exit_under_a_final_disruption_is_dead_named_for_the_disruption() -> None:
    j = Judge()
    j.see(live(), 2)
    drained = live(disruption=("EvictionByEvictionAPI", "Eviction API: evicting", 50), deletion_at=50)  # fmt: skip
    j.see(drained, 50)
    assert (j.track.state, j.track.cause) == (State.DEAD, Cause.DRAINED)
    assert j.exit(drained, exit_of(143, t=50.6), 50.7) is None  # terminal: nothing to add


def test_an_exit_under_a_pending_disruption_is_the_container_s_death() -> None:
    """As the kubelet's report would be: a pending disruption is Dead only on a dead
    container's proof, and the exit is that proof."""
    j = Judge()
    j.see(live(), 2)
    pending = live(disruption=("PreemptionByScheduler", "preempting", 49))
    assert j.see(pending, 49).state is State.SUSPECT
    t = j.exit(pending, exit_of(1), 50.5)
    assert t is not None and (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)


@pytest.mark.parametrize(
    ("restart_policy", "code", "state", "cause"),
    [
        ("Never", 0, State.GONE, Cause.COMPLETED),
        ("OnFailure", 0, State.GONE, Cause.COMPLETED),
        ("Never", 1, State.DEAD, Cause.CONTAINER_EXITED),
        ("OnFailure", 1, State.DEAD, Cause.CONTAINER_EXITED),  # restarted: its life ended
        ("Always", 0, State.DEAD, Cause.CONTAINER_EXITED),  # restarted: its life ended
    ],
)
def test_a_clean_exit_the_kubelet_will_call_succeeded_is_left_to_its_report(
    restart_policy: str, code: int, state: State, cause: Cause
) -> None:
    """A death is the node's at once; a completion is the kubelet's report's (issue #61): the
    clean exit may be the end of an eviction whose word is not read yet, and Gone is final."""
    j = Judge()
    j.see(live(restart_policy=restart_policy), 2)
    t = j.exit(live(restart_policy=restart_policy), exit_of(code), 50.3)
    if state is State.GONE:
        assert t is None and j.track.state is State.ALIVE
        reported = kubelet_report(code, reason="Completed", restart_policy=restart_policy,
                                  phase="Succeeded")  # fmt: skip
        t = j.see(reported, 51)
        assert t.evidence is None or t.evidence.observed_by is Observer.KUBELET
    assert t is not None and (t.state, t.cause) == (state, cause)


def test_under_a_container_s_own_restart_rules_the_rules_decide_completion_or_death() -> None:
    """Its rule restarts it on 42; on anything else its own policy (Never) holds: an exit 0
    no rule restarts is a completion, as the kubelet's report makes it (issue #51: judged Gone
    on one path and Dead on the other; the node leaves a completion to that report, #61). A
    restart is a death."""
    j = Judge()
    j.see(live(own_restart_rules=True), 2)
    assert j.exit(live(own_restart_rules=True), exit_of(0), 50.3) is None  # the kubelet's to say
    done = kubelet_report(0, reason="Completed", own_restart_rules=True)
    completed = j.see(done, 51)
    assert (completed.state, completed.cause) == (State.GONE, Cause.COMPLETED)
    j = Judge()
    j.see(live(own_restart_rules=True), 2)
    t = j.exit(live(own_restart_rules=True), exit_of(42), 50.3)
    assert t is not None and (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
    # the rule restarts it in place: its new life is no false positive
    back = pod(containers=[running(since=52, restarts=1, last=termination(42, finished=50),
                                   cid=NEXT)], ready_at=52, own_restart_rules=True)  # fmt: skip
    assert j.see(back, 52).state is State.DEAD
    assert SignalKind.FALSE_POSITIVE not in j.signals and SignalKind.DISPUTED not in j.signals


def test_a_stale_report_still_showing_the_instance_running_is_no_false_positive() -> None:
    """An update of the pod between the exit and the relist still shows it Ready, running."""
    j = Judge()
    j.see(live(), 2)
    j.exit(live(), exit_of(), 50.3)
    relabelled = live(labels={"app": "sandbox", "billing": "done"})
    t = j.see(relabelled, 50.5)
    assert (t.state, t.false_positive) == (State.DEAD, False)
    assert SignalKind.FALSE_POSITIVE not in j.signals


def test_a_kubelet_report_with_another_exit_code_is_disputed_once_and_dead_stands() -> None:
    j = Judge()
    j.see(live(), 2)
    dead = j.exit(live(), exit_of(3), 50.3)
    t = j.see(kubelet_report(code=4), 51)
    assert (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
    assert t.evidence == dead.evidence if dead else False
    assert t.disputed == "exit code: the node saw 3, the kubelet reports 4"
    j.see(kubelet_report(code=4, labels={"x": "y"}), 52)
    assert j.signals.count(SignalKind.DISPUTED) == 1


def test_the_kubelet_evicting_it_before_the_exit_is_disputed() -> None:
    """Node-pressure eviction: the kubelet kills first and writes its status after; a read
    that lost that race calls the kill the workload's. The verdict stands, the dispute says
    the kubelet's word."""
    j = Judge()
    j.see(live(), 2)
    j.exit(live(), exit_of(137, t=50.2), 50.3)
    evicted = kubelet_report(137, t=51, phase="Failed", reason="Evicted",
                             disruption=("TerminationByKubelet", "The node was low on memory.", 50))  # fmt: skip
    t = j.see(evicted, 51)
    assert t.state is State.DEAD and t.cause is Cause.CONTAINER_EXITED
    assert t.disputed is not None and "TerminationByKubelet" in t.disputed
    assert SignalKind.DISPUTED in j.signals


def test_a_deletion_after_the_exit_is_no_dispute() -> None:
    """The platform reclaims the dead sandbox: its deletion comes after the exit."""
    j = Judge()
    j.see(live(), 2)
    j.exit(live(), exit_of(3, t=50.2), 50.3)
    t = j.see(kubelet_report(deletion_at=51), 51)
    assert t.disputed is None
    assert SignalKind.DISPUTED not in j.signals


def test_a_restart_in_place_reported_later_is_the_same_death_and_no_false_positive() -> None:
    """restartPolicy Always: the kubelet restarts the container and reports its new life."""
    j = Judge()
    j.see(live(), 2)
    j.exit(live(), exit_of(7), 50.3)
    back = pod(ready_at=52, containers=[running(since=52, restarts=1, cid=NEXT,
                                                last=termination(7, finished=50))])  # fmt: skip
    t = j.see(back, 52)
    assert (t.state, t.false_positive, t.disputed) == (State.DEAD, False, None)
    assert t.evidence is not None and t.evidence.exit_code == 7


def test_every_container_restarting_in_place_is_one_death() -> None:
    """RestartAllContainers (1.36 beta): the exit the node heard ends every container."""
    j = Judge()
    two = [running(cid=CID), running(name="tools", cid="containerd://t1")]
    j.see(live(containers=two, spec_containers=["tools"]), 2)
    t = j.exit(live(containers=two, spec_containers=["tools"]), exit_of(3), 50.3)
    assert t is not None and (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
    again = [running(since=52, restarts=1, cid=NEXT, last=termination(3, finished=50)),
             running(name="tools", since=52, restarts=1, cid="containerd://t2",
                     last=termination(137, finished=50))]  # fmt: skip
    restarting = live(containers=again, spec_containers=["tools"], ready_at=52)
    restarting["status"]["conditions"].append({"type": "AllContainersRestarting",
                                               "status": "False"})  # fmt: skip
    assert j.see(restarting, 52).state is State.DEAD
    assert SignalKind.FALSE_POSITIVE not in j.signals and SignalKind.DISPUTED not in j.signals


def test_an_exec_probe_flap_has_no_exit_and_a_suspect_s_exit_ends_it() -> None:
    j = Judge("exec-probe")
    probe = exec_probe()
    j.see(live(probe=probe), 2)
    flapping = pod(
        ready=False, ready_at=20, probe=probe, containers=[running(ready=False, cid=CID)]
    )
    assert j.see(flapping, 20).state is State.SUSPECT
    t = j.exit(flapping, exit_of(1, t=21), 21.1)
    assert t is not None and (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
    assert t.evidence is not None and t.evidence.ready_drop_at == at(20)  # the drop came first


# --- the node path never makes a death the kubelet's report would not ---------------------


@examples(400, slow=True)
@given(
    policy=st.sampled_from(POLICIES),
    restart_policy=st.sampled_from(["Always", "OnFailure", "Never"]),
    own_rules=st.booleans(),
    code=st.sampled_from([0, 1, 2, 42, 137, 143]),
    oom=st.booleans(),
    ever_ready=st.booleans(),
    sidecar=st.sampled_from([None, "running", "exited"]),
    deletion_before=st.sampled_from([False, False, False, True]),
    disruption=st.sampled_from([None, None, None, "pending", "final"]),
    ours=st.sampled_from([True, True, True, False]),
    kill_delay=st.floats(0.001, 0.999),
)
def test_the_node_path_agrees_with_the_kubelet_path(
    policy: str,
    restart_policy: str,
    own_rules: bool,
    code: int,
    oom: bool,
    ever_ready: bool,
    sidecar: str | None,
    deletion_before: bool,
    disruption: str | None,
    ours: bool,
    kill_delay: float,
) -> None:
    """Judged by the kubelet's report alone, and by the node's exit first then that report:
    the same state and cause in the end, or a dispute said; Dead from the node only where
    the kubelet's report makes it Dead too."""
    code = 137 if oom else code
    probe = probe_for(policy)
    exited_at = 50 + kill_delay
    kw: dict[str, Any] = {"probe": probe, "restart_policy": restart_policy,
                          "own_restart_rules": own_rules}  # fmt: skip
    if sidecar is not None:
        kw["spec_containers"] = ["tools"]
    other = ([running(name="tools", cid="containerd://t1")] if sidecar == "running" else
             [terminated(name="tools", code=0, reason="Completed", finished=30,
                         cid="containerd://t1")] if sidecar == "exited" else [])  # fmt: skip
    first = pod(ready=ever_ready, ready_at=2, containers=[running(ready=ever_ready, cid=CID), *other], **kw)  # fmt: skip
    # what the API holds at the exit besides (the kubelet has not relisted): a deletion
    # requested, a disruption announced or carried out
    if deletion_before:
        kw["deletion_at"] = 50
    if disruption is not None:
        kw["disruption"] = ("EvictionByEvictionAPI", "Eviction API: evicting", 50)
        if disruption == "final":
            kw["deletion_at"] = 50
    read = pod(ready=ever_ready, ready_at=2, containers=[running(ready=ever_ready, cid=CID), *other], **kw)  # fmt: skip
    codes = [code, *([0] if sidecar == "exited" else [])]
    running_other = sidecar == "running"
    restarts = restart_policy == "Always" or (restart_policy == "OnFailure" and code != 0)
    if own_rules:
        restarts = code == 42
    reason = "OOMKilled" if oom else "Completed" if code == 0 else "Error"
    if restarts:
        report_containers = [running(since=52, restarts=1, ready=False, cid=NEXT,
                                     last=termination(code, reason, finished=50)), *other]  # fmt: skip
        phase = "Running"
    else:
        report_containers = [terminated(code=code, reason=reason, finished=50, cid=CID), *other]
        phase = ("Running" if running_other else
                 "Succeeded" if all(c == 0 for c in codes) else "Failed")  # fmt: skip
    report = pod(ready=False, ready_at=51, phase=phase, containers=report_containers, **kw)

    kubelet_only = Judge(policy)
    kubelet_only.see(first, 2)
    k = kubelet_only.see(report, 51)

    node = Judge(policy)
    node.see(first, 2)
    exit = exit_of(code, t=exited_at, oom=oom, cid=CID if ours else NEXT)
    seen = node.exit(read, exit, exited_at + 0.01)
    n = node.see(report, 51)
    if seen is not None and seen.state is State.DEAD:
        assert k.state is State.DEAD, (seen, k)  # never a death the kubelet would not make
        assert seen.evidence is not None and seen.evidence.observed_by is Observer.NODE
    if n.disputed is None:
        assert (n.state, n.cause) == (k.state, k.cause), (n, k)
    else:
        assert n.state is State.DEAD and SignalKind.DISPUTED in node.signals
    assert SignalKind.FALSE_POSITIVE not in node.signals or (
        SignalKind.FALSE_POSITIVE in kubelet_only.signals
    )
    assert node.track.ready_drop_at is None or node.track.ready_drop_at <= at(51) + timedelta(0)
