"""The kubelet's own evictions (issue #61, ADR 0044): named by the kubelet's message and billed
to whoever caused them, on both paths alike, whatever the exit code and the phase left.

What the kubelet writes (Kubernetes 1.35, pkg/kubelet/eviction): for the pod's own limits
(a container's or the pod's ephemeral storage, an emptyDir's sizeLimit) phase Failed, reason
Evicted and its message, with no DisruptionTarget; for node pressure the same and a
DisruptionTarget TerminationByKubelet with the message. It posts an Evicted Event before it
kills, and withholds the pod's reason until every container has stopped; a process that exits
0 on the SIGTERM leaves the pod Succeeded. The controller reads the Event (`notice` here)."""

from __future__ import annotations

import pytest

from deathwatch._engine.contract import eviction_cause
from deathwatch._engine.engine import SignalKind
from deathwatch._engine.nodeexit import NodeExit
from deathwatch._engine.verdict import Cause, Observer, Origin, State
from tests.builders import at, pod, running, terminated
from tests.engine_driver import Judge

CID = "containerd://" + "e" * 64
POD_LIMIT = "Pod ephemeral local storage usage exceeds the total limit of containers 20Mi. "
CONTAINER_LIMIT = 'Container agent exceeded its local ephemeral storage limit "20Mi". '
EMPTY_DIR = 'Usage of EmptyDir volume "scratch" exceeds the limit "10Mi". '
NODE_LOW = ("The node was low on resource: ephemeral-storage. Threshold quantity: 1Gi, "
            "available: 900Mi. Container agent was using 2Gi, request is 0, has larger "
            "consumption of ephemeral-storage. ")  # fmt: skip


def live() -> dict[str, object]:
    return pod(containers=[running(cid=CID)], restart_policy="Never")


def ended(code: int, phase: str, reason: str | None = None, message: str | None = None,
          disruption: tuple[str, str, float] | None = None) -> dict[str, object]:  # fmt: skip
    """The kubelet's report once every container has stopped."""
    why = "Completed" if code == 0 else "Error"
    return pod(ready=False, ready_at=51, phase=phase, reason=reason, message=message,
               disruption=disruption, restart_policy="Never",
               containers=[terminated(code=code, reason=why, finished=51, cid=CID)])  # fmt: skip


@pytest.mark.parametrize(
    ("message", "cause", "origin"),
    [
        (POD_LIMIT, Cause.STORAGE_LIMIT_EXCEEDED, Origin.WORKLOAD),
        (CONTAINER_LIMIT, Cause.STORAGE_LIMIT_EXCEEDED, Origin.WORKLOAD),
        (EMPTY_DIR, Cause.STORAGE_LIMIT_EXCEEDED, Origin.WORKLOAD),
        (NODE_LOW, Cause.EVICTED, Origin.INFRASTRUCTURE),
        ("words this version does not know", Cause.EVICTED, Origin.INFRASTRUCTURE),
        ("", Cause.EVICTED, Origin.INFRASTRUCTURE),
    ],
)
def test_the_kubelets_message_says_whose_doing_an_eviction_was(
    message: str, cause: Cause, origin: Origin
) -> None:
    assert eviction_cause(message) is cause
    j = Judge()
    j.see(live(), 2)
    t = j.see(ended(137, "Failed", "Evicted", message), 52)
    assert (t.state, t.cause) == (State.DEAD, cause)
    assert t.evidence is not None and t.evidence.origin is origin
    assert t.evidence.message == (message or None) and t.evidence.exit_code == 137


@pytest.mark.parametrize("notice", [None, POD_LIMIT])
def test_a_graceful_exit_0_under_eviction_is_a_death_not_a_completion(notice: str | None) -> None:
    """The process traps SIGTERM and exits 0: the kubelet leaves the pod Succeeded. With the
    pod's reason kept, or only the Event read, it is Dead StorageLimitExceeded."""
    j = Judge()
    j.see(live(), 2, notice=notice)
    reason, message = (None, None) if notice else ("Evicted", POD_LIMIT)
    t = j.see(ended(0, "Succeeded", reason, message), 52, notice=notice)
    assert (t.state, t.cause) == (State.DEAD, Cause.STORAGE_LIMIT_EXCEEDED)
    assert t.evidence is not None and t.evidence.exit_code == 0
    assert t.evidence.message == POD_LIMIT and t.evidence.origin is Origin.WORKLOAD


def test_the_kubelets_report_before_its_terminal_phase_is_judged_by_the_event() -> None:
    """The relist shows the container ended 0 while the phase is still Running (the kubelet
    withholds the terminal status until every container has stopped): with the Event read, a
    death; the terminal report that follows changes nothing and says nothing."""
    j = Judge()
    j.see(live(), 2, notice=POD_LIMIT)
    relisted = pod(ready=False, ready_at=51, phase="Running", restart_policy="Never",
                   containers=[terminated(code=0, reason="Completed", finished=51, cid=CID)])  # fmt: skip
    t = j.see(relisted, 51.5, notice=POD_LIMIT)
    assert (t.state, t.cause) == (State.DEAD, Cause.STORAGE_LIMIT_EXCEEDED)
    after = j.see(ended(0, "Succeeded"), 52, notice=POD_LIMIT)
    assert after is t and SignalKind.DISPUTED not in j.signals


@pytest.mark.parametrize("code", [0, 137])
def test_on_the_node_path_an_eviction_read_first_names_the_exit_and_the_report_agrees(
    code: int,
) -> None:
    """The Event came before the kill (the kubelet posts it first): the node's exit is Dead
    with the eviction's cause at once, and the kubelet's report is no dispute."""
    j = Judge()
    j.see(live(), 2, notice=POD_LIMIT)
    t = j.exit(live(), NodeExit(CID, code, False, at(50.3), "node-a"), 50.31, notice=POD_LIMIT)
    assert t is not None and (t.state, t.cause) == (State.DEAD, Cause.STORAGE_LIMIT_EXCEEDED)
    assert t.evidence is not None and t.evidence.observed_by is Observer.NODE
    phase = "Succeeded" if code == 0 else "Failed"
    j.see(ended(code, phase, "Evicted", POD_LIMIT), 52, notice=POD_LIMIT)
    assert j.track is t and SignalKind.DISPUTED not in j.signals


def test_on_the_node_path_a_node_pressure_eviction_read_first_agrees_with_its_condition() -> None:
    j = Judge()
    j.see(live(), 2, notice=NODE_LOW)
    t = j.exit(live(), NodeExit(CID, 137, False, at(50.3), "node-a"), 50.31, notice=NODE_LOW)
    assert t is not None and (t.state, t.cause) == (State.DEAD, Cause.EVICTED)
    report = ended(137, "Failed", "Evicted", NODE_LOW,
                   disruption=("TerminationByKubelet", NODE_LOW, 52))  # fmt: skip
    j.see(report, 52, notice=NODE_LOW)
    assert j.track is t and SignalKind.DISPUTED not in j.signals


def test_on_the_node_path_a_clean_exit_not_known_as_an_eviction_waits_for_the_report() -> None:
    """The Event not read yet when the exit 0 comes: the node leaves the completion to the
    kubelet's report, which says the eviction: Dead, never Gone Completed first."""
    j = Judge()
    j.see(live(), 2)
    assert j.exit(live(), NodeExit(CID, 0, False, at(50.3), "node-a"), 50.31) is None
    t = j.see(ended(0, "Succeeded"), 52, notice=POD_LIMIT)
    assert (t.state, t.cause) == (State.DEAD, Cause.STORAGE_LIMIT_EXCEEDED)


def test_a_signal_exit_heard_before_the_eviction_is_read_stays_dead_and_is_disputed() -> None:
    """What remains of the race (ADR 0044): the exit judged before the Event was read is the
    workload's exit; the kubelet's report then tells the eviction, said as a dispute, and the
    verdict stands (Dead is never taken back)."""
    j = Judge()
    j.see(live(), 2)
    t = j.exit(live(), NodeExit(CID, 137, False, at(50.3), "node-a"), 50.31)
    assert t is not None and (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
    j.see(ended(137, "Failed", "Evicted", POD_LIMIT), 52, notice=POD_LIMIT)
    assert j.track.state is State.DEAD and SignalKind.DISPUTED in j.signals


def test_an_eviction_notice_on_a_running_pod_is_not_yet_a_death() -> None:
    """The kubelet's Event comes before its kill: nothing has died until the sandbox stops."""
    j = Judge()
    j.see(live(), 2)
    assert j.see(live(), 50, notice=POD_LIMIT).state is State.ALIVE


def test_an_eviction_before_the_first_ready_is_a_failed_start() -> None:
    j = Judge()
    t = j.see(pod(ready=False, ready_at=1, phase="Failed", reason="Evicted",
                  message="The node had condition: [DiskPressure]. ",
                  containers=[]), 3)  # fmt: skip
    assert (t.state, t.cause) == (State.GONE, Cause.FAILED_BEFORE_READY)
