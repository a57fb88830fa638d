"""Deaths the cluster inflicts (issue #29): the DisruptionTarget condition, read by the engine.

Each case is what a component of Kubernetes 1.35 writes, from its source (the fixtures under
tests/data/disruptions are what the real components wrote in the lanes; test_replay holds
the engine to those): the Eviction API, kube-scheduler's preemption, the taint-eviction
controller, pod GC, the kubelet's node-pressure eviction and graceful node shutdown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deathwatch._engine.contract import Decision, PolicySettings, Situation, by_disruption
from deathwatch._engine.engine import SignalKind
from deathwatch._engine.podview import PodView, read_pod
from deathwatch._engine.verdict import Cause, Origin, State, origin_of
from deathwatch._policies import PolicyRegistry
from deathwatch._policies.builtin import BUILTIN_ORDER
from tests.builders import at, exec_probe, pod, running, terminated, termination, ts
from tests.engine_driver import Judge, Pods

DRAIN = ("EvictionByEvictionAPI", "Eviction API: evicting", 100)
PREEMPT = ("PreemptionByScheduler", "default-scheduler: preempting to accommodate a higher priority pod", 100)  # fmt: skip
TAINT = ("DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint", 100)
PODGC = ("DeletionByPodGC", "PodGC: node no longer exists", 100)
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
SHUTDOWN = ("TerminationByKubelet", SHUTDOWN_MESSAGE, 100)
PRESSURE_MESSAGE = (
    "The node was low on resource: memory. Threshold quantity: 100Mi, available: 88Mi. "
)
PRESSURE = ("TerminationByKubelet", PRESSURE_MESSAGE, 100)


def ready() -> dict[str, Any]:
    return pod()


@pytest.mark.parametrize(
    ("disruption", "cause"),
    [(DRAIN, Cause.DRAINED), (PREEMPT, Cause.PREEMPTED), (TAINT, Cause.TAINT_EVICTED)],
)
def test_a_disruption_then_its_deletion_is_dead_named_for_it(
    disruption: tuple[str, str, float], cause: Cause
) -> None:
    """The Eviction API, the scheduler and the taint manager write the condition, then
    delete: Suspect (Disrupting) between the two, Dead from the deletion on."""
    j = Judge()
    j.see(ready(), 2)
    t = j.see(pod(disruption=disruption), 100)
    assert (t.state, t.cause) == (State.SUSPECT, Cause.DISRUPTING)
    assert t.disruption is not None and t.disruption.reason == disruption[0]
    t = j.see(pod(disruption=disruption, deletion_at=100), 100)
    assert (t.state, t.cause) == (State.DEAD, cause)
    e = t.evidence
    assert e is not None
    assert (e.disruption, e.message) == (disruption[0], disruption[1])
    assert e.origin is Origin.INFRASTRUCTURE
    assert e.ready_drop_at == at(100)
    # the kubelet then stops the containers and the pod goes: nothing changes the verdict
    gone = pod(ready=False, ready_at=101, deletion_at=100, disruption=disruption,
               containers=[terminated(code=137, finished=101)])  # fmt: skip
    assert j.see(gone, 101).cause is cause
    assert j.delete(gone, 102).cause is cause
    assert j.signals.count(SignalKind.STATE_CHANGED) == 3  # Alive, Suspect, Dead


def test_condition_and_deletion_seen_together_are_dead_at_once() -> None:
    j = Judge()
    j.see(ready(), 2)
    t = j.see(pod(disruption=DRAIN, deletion_at=100), 100)
    assert (t.state, t.cause) == (State.DEAD, Cause.DRAINED)


def test_a_deleted_event_showing_a_disruption_first_seen_is_dead() -> None:
    """A relist can miss every MODIFIED: the DELETED object alone carries the condition."""
    j = Judge()
    j.see(ready(), 2)
    t = j.delete(pod(disruption=PREEMPT, deletion_at=100), 130)
    assert (t.state, t.cause) == (State.DEAD, Cause.PREEMPTED)


def test_taint_eviction_of_a_pod_whose_node_went_silent_is_node_unreachable() -> None:
    """The node controller took Ready away (containers still say running) before the
    unreachable taint's toleration ran out: NodeUnreachable, not a taint someone set. Under
    exec-probe the window is longer than... nothing: the deletion ends it first."""
    j = Judge(policy="container-state")
    j.see(ready(), 2)
    silent = pod(ready=False, ready_at=60, containers=[running(ready=True)])
    assert j.see(silent, 60).state is State.ALIVE  # container-state: Ready means nothing
    t = j.see(
        pod(ready=False, ready_at=60, containers=[running(ready=True)], disruption=TAINT,
            deletion_at=360),
        360,
    )  # fmt: skip
    assert (t.state, t.cause) == (State.DEAD, Cause.NODE_UNREACHABLE)


def test_pod_gc_after_its_node_was_deleted_is_node_deleted() -> None:
    """Pod GC writes phase Failed with the condition, then deletes with grace 0."""
    j = Judge()
    j.see(ready(), 2)
    t = j.see(pod(phase="Failed", disruption=PODGC), 100)
    assert (t.state, t.cause) == (State.DEAD, Cause.NODE_DELETED)
    assert t.evidence is not None and t.evidence.message == "PodGC: node no longer exists"


def test_graceful_node_shutdown_exit_137_is_node_shutdown_not_oom() -> None:
    """What the kubelet's shutdown manager writes: phase Failed, reason Terminated, its
    message, the condition; the container's SIGKILL is exit 137 with reason Error."""
    j = Judge()
    j.see(ready(), 2)
    t = j.see(
        pod(ready=False, ready_at=100, phase="Failed", reason="Terminated",
            message=SHUTDOWN_MESSAGE, disruption=SHUTDOWN,
            containers=[terminated(code=137, reason="Error", finished=100)]),
        100,
    )  # fmt: skip
    assert (t.state, t.cause) == (State.DEAD, Cause.NODE_SHUTDOWN)
    e = t.evidence
    assert e is not None and (e.exit_code, e.reason, e.message) == (137, "Error", SHUTDOWN_MESSAGE)
    assert e.origin is Origin.INFRASTRUCTURE


def test_an_oom_kill_says_oomkilled_only_because_the_kubelet_does() -> None:
    j = Judge()
    j.see(ready(), 2)
    t = j.see(pod(ready=False, ready_at=50, phase="Failed",
                  containers=[terminated(code=137, reason="Error", finished=50)]), 50)  # fmt: skip
    assert (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
    k = Judge()
    k.see(ready(), 2)
    t = k.see(pod(ready=False, ready_at=50, phase="Failed",
                  containers=[terminated(code=137, reason="OOMKilled", finished=50)]), 50)  # fmt: skip
    assert (t.state, t.cause) == (State.DEAD, Cause.OOM_KILLED)
    assert t.evidence is not None and t.evidence.origin is Origin.WORKLOAD


def test_node_pressure_eviction_with_its_condition_is_evicted() -> None:
    j = Judge()
    j.see(ready(), 2)
    t = j.see(
        pod(ready=False, ready_at=100, phase="Failed", reason="Evicted",
            message=PRESSURE_MESSAGE, disruption=PRESSURE,
            containers=[terminated(code=137, finished=100)]),
        100,
    )  # fmt: skip
    assert (t.state, t.cause) == (State.DEAD, Cause.EVICTED)
    assert t.evidence is not None and t.evidence.message == PRESSURE_MESSAGE


def test_kubelet_preemption_for_a_critical_pod_is_preempted() -> None:
    j = Judge()
    j.see(ready(), 2)
    why = ("TerminationByKubelet", "Pod was preempted by Kubelet to accommodate a critical pod.", 100)  # fmt: skip
    t = j.see(pod(phase="Failed", reason="Preempting", disruption=why), 100)
    assert (t.state, t.cause) == (State.DEAD, Cause.PREEMPTED)


def test_an_unknown_disruption_reason_is_disrupted_and_infrastructure() -> None:
    j = Judge()
    j.see(ready(), 2)
    t = j.see(pod(disruption=("DeletionBySomethingNew", "new", 100), deletion_at=100), 100)
    assert (t.state, t.cause) == (State.DEAD, Cause.DISRUPTED)
    assert origin_of(t.cause) is Origin.INFRASTRUCTURE


def test_a_cleared_disruption_is_alive_again_and_never_dead() -> None:
    """The disruption controller sets a stale condition to False after 2 minutes."""
    j = Judge()
    j.see(ready(), 2)
    assert j.see(pod(disruption=DRAIN), 100).state is State.SUSPECT
    t = j.see(pod(disruption=(*DRAIN[:2], 220), disruption_status="False"), 220)
    assert (t.state, t.cause, t.disruption) == (State.ALIVE, None, None)
    # and a later plain deletion is the platform's: Gone Deleted
    t = j.see(pod(deletion_at=300), 300)
    assert (t.state, t.cause) == (State.GONE, Cause.DELETED)
    assert origin_of(t.cause) is Origin.PLATFORM


def test_a_pending_disruption_is_never_dead_without_a_dead_container() -> None:
    """no-probe calls a Ready drop death; with a disruption pending it waits for the
    deletion (or for proof): Dead is never taken back, so never declared early."""
    j = Judge()
    j.see(ready(), 2)
    t = j.see(pod(ready=False, ready_at=100, disruption=DRAIN), 100)
    assert (t.state, t.cause) == (State.SUSPECT, Cause.DISRUPTING)
    t = j.see(pod(ready=True, ready_at=110, disruption=(*DRAIN[:2], 220), disruption_status="False"), 220)  # fmt: skip
    assert t.state is State.ALIVE


def test_a_container_that_dies_while_a_disruption_is_pending_is_the_workload() -> None:
    j = Judge()
    j.see(ready(), 2)
    j.see(pod(disruption=DRAIN), 100)
    t = j.see(pod(ready=False, ready_at=101, phase="Running", disruption=DRAIN,
                  containers=[terminated(code=3, finished=101)]), 101)  # fmt: skip
    assert (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)


@pytest.mark.parametrize("finished", [99, 100])
def test_the_kubelets_eviction_stamped_a_second_after_the_kill_is_still_evicted(
    finished: float,
) -> None:
    """The kubelet sends its DisruptionTarget only once the containers it killed stopped, and
    stamps it then (status_manager.go, mergePodStatus): a kill at 99.9 s and the condition at
    100 s read as 99 and 100 in whole seconds. The kubelet's own `since` never says the
    container died first (the node lane saw it, issue #42)."""
    j = Judge()
    j.see(ready(), 2)
    t = j.see(
        pod(ready=False, ready_at=finished, phase="Failed", reason="Evicted",
            message=PRESSURE_MESSAGE, disruption=PRESSURE,
            containers=[terminated(code=137, finished=finished)]),
        101,
    )  # fmt: skip
    assert (t.state, t.cause) == (State.DEAD, Cause.EVICTED)


def test_a_death_before_the_disruption_stands_as_the_workloads() -> None:
    """Seen only together (a relist): the container had exited before the drain began."""
    j = Judge(policy="container-state")
    j.see(ready(), 2)
    t = j.see(pod(ready=False, ready_at=50, disruption=DRAIN, deletion_at=100,
                  containers=[terminated(code=3, finished=50)]), 120)  # fmt: skip
    assert (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
    assert t.evidence is not None and t.evidence.origin is Origin.WORKLOAD


def test_an_exec_probe_suspect_drained_within_its_window_is_drained() -> None:
    j = Judge()
    j.see(pod(probe=exec_probe()), 12)
    t = j.see(pod(probe=exec_probe(), ready=False, ready_at=90), 90)
    assert t.state is State.SUSPECT and t.cause is Cause.NOT_READY
    t = j.see(pod(probe=exec_probe(), ready=False, ready_at=90, disruption=DRAIN), 100)
    assert (t.state, t.cause) == (State.SUSPECT, Cause.NOT_READY)  # its window still runs
    t = j.see(pod(probe=exec_probe(), ready=False, ready_at=90, disruption=DRAIN, deletion_at=100), 100)  # fmt: skip
    assert (t.state, t.cause) == (State.DEAD, Cause.DRAINED)
    assert t.evidence is not None and t.evidence.ready_drop_at == at(90)


def test_a_disruption_before_the_first_ready_is_gone_named_for_it() -> None:
    j = Judge()
    j.see(pod(ready=False, ready_at=0, phase="Pending", containers=[]), 1)
    t = j.see(pod(ready=False, ready_at=0, phase="Pending", containers=[], disruption=PREEMPT,
                  deletion_at=100), 100)  # fmt: skip
    assert (t.state, t.cause) == (State.GONE, Cause.PREEMPTED)


def test_a_plain_deletion_is_still_the_platforms() -> None:
    j = Judge()
    j.see(ready(), 2)
    t = j.see(pod(deletion_at=100), 100)
    assert (t.state, t.cause) == (State.GONE, Cause.DELETED)


class _Indifferent:
    """A plugin that never calls anything a death."""

    name = "indifferent"

    def applies(self, pod: PodView, settings: PolicySettings) -> bool:
        return False

    def judge(self, s: Situation) -> Decision:
        return Decision(State.ALIVE)


class _Careful:
    """A plugin that calls a pending disruption a death (the engine must not let it)."""

    name = "careful"

    def applies(self, pod: PodView, settings: PolicySettings) -> bool:
        return False

    def judge(self, s: Situation) -> Decision:
        if s.disruption is not None:
            return Decision(State.DEAD, s.disruption.cause)
        return by_disruption(s) or Decision(State.ALIVE)


def _fleet(*plugins: Any) -> Pods:
    policies = {p.name: p for p in (*BUILTIN_ORDER, *plugins)}
    return Pods(PolicyRegistry(policies))


def test_a_plugin_that_does_not_call_a_final_disruption_death_gets_gone_with_its_cause() -> None:
    fleet = _fleet(_Indifferent())
    fleet.observe(read_pod(ready()), at(2), "indifferent", PolicySettings())
    step = fleet.observe(read_pod(pod(disruption=DRAIN, deletion_at=100)), at(100), "indifferent", PolicySettings())  # fmt: skip
    assert (step.track.state, step.track.cause) == (State.GONE, Cause.DRAINED)
    assert origin_of(step.track.cause) is Origin.INFRASTRUCTURE


def test_a_plugin_cannot_call_a_pending_disruption_death() -> None:
    fleet = _fleet(_Careful())
    fleet.observe(read_pod(ready()), at(2), "careful", PolicySettings())
    step = fleet.observe(read_pod(pod(disruption=DRAIN)), at(100), "careful", PolicySettings())
    assert (step.track.state, step.track.cause) == (State.SUSPECT, Cause.DISRUPTING)
    step = fleet.observe(read_pod(pod(disruption=DRAIN, deletion_at=100)), at(100), "careful", PolicySettings())  # fmt: skip
    assert (step.track.state, step.track.cause) == (State.DEAD, Cause.DRAINED)


@pytest.mark.parametrize(
    ("cause", "origin"),
    [
        (Cause.CONTAINER_EXITED, Origin.WORKLOAD),
        (Cause.OOM_KILLED, Origin.WORKLOAD),
        (Cause.UNRESPONSIVE, Origin.WORKLOAD),
        (Cause.FAILED_BEFORE_READY, Origin.WORKLOAD),
        (Cause.EVICTED, Origin.INFRASTRUCTURE),
        (Cause.NODE_LOST, Origin.INFRASTRUCTURE),
        (Cause.DRAINED, Origin.INFRASTRUCTURE),
        (Cause.NODE_SHUTDOWN, Origin.INFRASTRUCTURE),
        (Cause.DELETED, Origin.PLATFORM),
        (Cause.COMPLETED, Origin.PLATFORM),
        (Cause.SUSPENDED, Origin.PLATFORM),
        (Cause.EXPIRED, Origin.PLATFORM),
        (Cause.UNKNOWN, Origin.UNKNOWN),
        (Cause.UNOBSERVED, Origin.UNKNOWN),
        (None, Origin.UNKNOWN),
    ],
)
def test_every_terminal_cause_has_an_origin(cause: Cause | None, origin: Origin) -> None:
    assert origin_of(cause) is origin


def test_every_cause_of_dead_or_gone_is_attributed_on_purpose() -> None:
    """A new cause must be placed: only Unknown and Unobserved may be Unknown."""
    suspect = {Cause.NOT_READY, Cause.DISRUPTING}
    unknown = {c for c in Cause if c not in suspect and origin_of(c) is Origin.UNKNOWN}
    assert unknown == {Cause.UNKNOWN, Cause.UNOBSERVED}


# --- Kubernetes 1.35 restarts in place ---------------------------------------------------
# A sandbox is its processes: a restart in place ends them, whatever asked for it (the pod's
# restartPolicy, a container restart rule (ContainerRestartRules, beta and on in 1.35), or
# a restart of every container (RestartAllContainersOnContainerExits, alpha)). Dead at the
# restart with the exit's evidence, the workload's doing; the pod Ready again afterwards is
# its restarted container, so no false positive.


def test_a_container_restarted_by_a_restart_rule_is_dead_and_ready_again_is_no_false_positive() -> None:  # fmt: skip
    j = Judge()
    j.see(ready(), 2)
    # the rule's exit code: the kubelet writes the exit, then restarts the container
    t = j.see(pod(ready=False, ready_at=50, containers=[terminated(code=42, finished=50)]), 50)
    assert (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
    assert t.evidence is not None and (t.evidence.exit_code, t.evidence.origin) == (
        42,
        Origin.WORKLOAD,
    )
    back = pod(ready=True, ready_at=61, containers=[
        running(since=61, restarts=1, last=termination_of(42, 50))])  # fmt: skip
    t = j.see(back, 61)
    assert (t.state, t.false_positive) == (State.DEAD, False)
    assert SignalKind.FALSE_POSITIVE not in j.signals


def test_every_container_restarted_in_place_is_dead_from_the_restart_counts() -> None:
    """RestartAllContainersOnContainerExits: the AllContainersRestarting condition, then
    every container running again with its restart count up."""
    j = Judge()
    j.see(ready(), 2)
    restarting = pod(ready=True, ready_at=61, containers=[
        running(since=61, restarts=1, last=termination_of(7, 50))])  # fmt: skip
    restarting["status"]["conditions"].append(
        {"type": "AllContainersRestarting", "status": "False", "lastTransitionTime": "2026-11-29T10:01:01Z"}
    )  # fmt: skip
    t = j.see(restarting, 61)
    assert (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
    assert t.evidence is not None and t.evidence.exit_code == 7
    assert SignalKind.FALSE_POSITIVE not in j.signals


def test_ready_again_without_a_restart_is_still_a_false_positive() -> None:
    j = Judge()
    j.see(ready(), 2)
    assert (
        j.see(pod(ready=False, ready_at=50, containers=[running(ready=False)]), 50).state
        is State.DEAD
    )
    t = j.see(pod(ready=True, ready_at=60), 60)
    assert t.false_positive
    assert SignalKind.FALSE_POSITIVE in j.signals


def termination_of(code: int, finished: float) -> dict[str, Any]:
    from tests.builders import termination

    return termination(code=code, finished=finished)


# --- what the real components wrote (tests/data/disruptions.json, from tests/apiserver/test_disruptions.py)


DATA = Path(__file__).parents[1] / "data"


def _replayed(
    name: str, selector: str = "app=sandbox", policy: str = "auto"
) -> dict[str, tuple[str, str | None, str | None]]:
    """Every pod of the recording the selector picks: its final verdict, as replay says."""
    from deathwatch._kube.selector import parse_selector
    from deathwatch._policies import default_registry
    from deathwatch._replay.events import DECODER, view_events
    from deathwatch._replay.run import Replay
    from deathwatch._replay.stream import read_values

    replay = Replay(default_registry(), policy, PolicySettings(), parse_selector(selector))
    with (DATA / name).open("rb") as f:
        for event in view_events(read_values(f, decode=DECODER.decode)):
            replay.feed(event)
    replay.finish()
    return {
        t.name: (str(t.state), str(t.cause) if t.cause else None,
                 t.evidence.disruption if t.evidence else None)
        for t in replay.tracks
    }  # fmt: skip


def test_the_recorded_components_give_every_verdict_of_the_lane() -> None:
    """kubectl drain, kube-scheduler, the taint-eviction controller, pod GC and the node
    lifecycle controller of Kubernetes 1.35, as the pod watch showed them."""
    assert _replayed("disruptions.json") == {
        "stale": ("Alive", None, None),  # its DisruptionTarget cleared by the disruption controller
        "drained-0": ("Dead", "Drained", "EvictionByEvictionAPI"),
        "drained-1": ("Dead", "Drained", "EvictionByEvictionAPI"),
        "drained-exec": ("Dead", "Drained", "EvictionByEvictionAPI"),
        "guarded": ("Alive", None, None),  # its drain blocked by a PodDisruptionBudget
        "preempted": ("Dead", "Preempted", "PreemptionByScheduler"),
        "tainted": ("Dead", "TaintEvicted", "DeletionByTaintManager"),
        "tolerates-3s": ("Dead", "TaintEvicted", "DeletionByTaintManager"),
        "tolerates": ("Alive", None, None),
        "orphaned": ("Dead", "NodeDeleted", "DeletionByPodGC"),
        "silent": ("Dead", "NodeLost", None),
        "deleted": ("Gone", "Deleted", None),
        "oom": ("Dead", "OOMKilled", None),
    }
    assert _replayed("disruptions.json", "app=patient", "container-state") == {
        "silent-patient": ("Dead", "NodeUnreachable", "DeletionByTaintManager"),
    }


def test_the_recorded_kubelet_gives_evicted_and_a_restart_without_a_false_positive() -> None:
    """The real kubelet of the node lane (tests/node/test_deaths.py): a node-pressure eviction (PID
    pressure), and a container restarted in place by its restart rule on exit 42."""
    assert _replayed("node-pressure.json") == {
        "forker": ("Dead", "Evicted", "TerminationByKubelet")
    }
    assert _replayed("restart-rule.json") == {
        "ruled": ("Dead", "ContainerExited", None),
        "marker": ("Alive", None, None),
    }


def _all_restarting(pod_body: dict[str, Any], status: str, since: float) -> dict[str, Any]:
    pod_body["status"]["conditions"].append(
        {"type": "AllContainersRestarting", "status": status, "lastTransitionTime": ts(since)}
    )
    return pod_body


@pytest.mark.parametrize("policy", ["no-probe", "container-state", "exec-probe"])
def test_all_containers_restarted_in_place_is_dead_and_its_new_life_no_false_positive(
    policy: str,
) -> None:
    """Kubernetes 1.36 turns RestartAllContainersOnContainerExits on (beta): a container rule
    with action RestartAllContainers restarts every container of the pod in place on a
    matching exit, the pod keeping its uid, with the condition AllContainersRestarting True
    while it does (ADR 0026). The sandbox's processes ended: Dead, ContainerExited, the code
    of the container that exited; the pod Ready again afterwards is its new life."""
    j = Judge(policy)
    probe = exec_probe() if policy == "exec-probe" else None
    j.see(pod(ready=True, ready_at=2, probe=probe), 2)
    restarting = pod(ready=False, ready_at=10, probe=probe, phase="Running",
                     containers=[terminated(code=3, finished=10)])  # fmt: skip
    dead = j.see(_all_restarting(restarting, "True", 10), 10)
    assert (dead.state, dead.cause) == (State.DEAD, Cause.CONTAINER_EXITED), dead
    assert dead.evidence is not None and dead.evidence.exit_code == 3
    again = pod(ready=True, ready_at=14, probe=probe,
                containers=[running(since=13, restarts=1, last=termination(code=3, finished=10))])  # fmt: skip
    after = j.see(_all_restarting(again, "False", 13), 14)
    assert after.state is State.DEAD and not after.false_positive
    assert SignalKind.FALSE_POSITIVE not in j.signals
