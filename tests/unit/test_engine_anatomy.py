"""What a pod's containers are to its sandbox (issue #51, ADR 0029): the regular containers a
DeathWatch names (all of them by default) are the sandbox; native sidecars (vital only where
named), helpers, init and ephemeral containers are evidence, never a death. A completion is
one fate on every path, every replica and every timing: Gone, Completed.

Each case is a pod as the real kubelet 1.35 reports it (pkg/kubelet/kubelet_pods.go getPhase,
status/generate.go): a sidecar's crash drops the pod's Ready with every regular container
ready; a completion is first reported with the phase Running, seconds before Succeeded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deathwatch._api.resources import to_document
from deathwatch._engine import memory
from deathwatch._engine.engine import SignalKind
from deathwatch._engine.nodeexit import NodeExit
from deathwatch._engine.verdict import Cause, State
from deathwatch._operator.reporting import sandbox_verdicts
from deathwatch._policies import AUTO
from deathwatch._policies.builtin import BUILTIN_ORDER
from tests.builders import at, exec_probe, pod, running, terminated, termination
from tests.engine_driver import Judge
from tests.examples import examples

CID = "containerd://" + "a" * 64
NEXT = "containerd://" + "b" * 64
PROXY = "containerd://" + "c" * 64
TOOLS = "containerd://" + "d" * 64
POLICIES = [AUTO, *(p.name for p in BUILTIN_ORDER)]


def probe_for(policy: str) -> dict[str, Any] | None:
    return exec_probe() if policy == "exec-probe" else None


def proxy(**kw: Any) -> dict[str, Any]:
    kw.setdefault("cid", PROXY)
    return running(name="proxy", **kw)


# --- native sidecars ------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_a_sidecar_s_crash_and_restart_is_recorded_never_a_death(policy: str) -> None:
    """The kubelet drops the pod's Ready while the sidecar restarts, every regular container
    ready and running: before, no-probe read that as the node controller's (Dead, NodeLost,
    0.5-1 s after the crash, then a false positive once Ready came back)."""
    j = Judge(policy)
    probe = probe_for(policy)
    j.see(pod(probe=probe, sidecars=[proxy()]), 2)
    crashed = terminated(name="proxy", code=2, finished=30, cid=PROXY)
    t = j.see(pod(probe=probe, ready=False, ready_at=30, ready_reason="ContainersNotReady",
                  sidecars=[crashed]), 30)  # fmt: skip
    assert t.state is State.ALIVE and t.ready_drops == 0
    back = proxy(since=31, restarts=1, ready=False, last=termination(2, finished=30), cid=NEXT)
    t = j.see(pod(probe=probe, ready=False, ready_at=30, ready_reason="ContainersNotReady",
                  sidecars=[back]), 31)  # fmt: skip
    assert (t.state, t.sidecar_restarts) == (State.ALIVE, 1)
    j.tick(200)  # an exec-probe window would have closed
    t = j.see(pod(probe=probe, ready_at=32, sidecars=[proxy(since=31, restarts=1, cid=NEXT)]), 32)
    assert (t.state, t.ready_drops, t.flaps, t.false_positive) == (State.ALIVE, 0, 0, False)
    assert j.signals.count(SignalKind.SIDECAR_RESTARTED) == 1
    assert SignalKind.READY_DROPPED not in j.signals


def test_a_sidecar_named_vital_is_the_sandbox_s_death() -> None:
    j = Judge(vital=frozenset({"proxy"}))
    j.see(pod(sidecars=[proxy()]), 2)
    crashed = terminated(name="proxy", code=2, finished=30, cid=PROXY)
    t = j.see(pod(ready=False, ready_at=30, sidecars=[crashed]), 30)
    assert (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
    assert t.evidence is not None and (t.evidence.container, t.evidence.exit_code) == ("proxy", 2)
    assert t.evidence.container_id == PROXY


def test_a_vital_sidecar_s_exit_heard_on_the_node_is_dead_and_a_plain_sidecar_s_is_not_judged() -> (
    None
):
    live = pod(sidecars=[proxy()], containers=[running(cid=CID)])
    heard = NodeExit(PROXY, 2, False, at(30.1), "node-a")
    plain = Judge()
    plain.see(live, 2)
    assert plain.exit(live, heard, 30.2) is None
    vital = Judge(vital=frozenset({"proxy"}))
    vital.see(live, 2)
    t = vital.exit(live, heard, 30.2)
    assert t is not None and (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
    assert t.evidence is not None and t.evidence.container == "proxy"


def test_the_node_controller_s_not_ready_is_still_node_lost_with_a_sidecar() -> None:
    """Every container ready and running, sidecar included, and the pod not Ready: only the
    node controller writes that (its kubelet silent)."""
    j = Judge("no-probe")
    j.see(pod(sidecars=[proxy()]), 2)
    t = j.see(pod(ready=False, ready_at=40, sidecars=[proxy()]), 40)
    assert (t.state, t.cause) == (State.DEAD, Cause.NODE_LOST)


def test_a_readiness_gate_held_back_is_no_drop() -> None:
    j = Judge("no-probe")
    j.see(pod(), 2)
    t = j.see(pod(ready=False, ready_at=40, ready_reason="ReadinessGatesNotReady"), 40)
    assert t.state is State.ALIVE and t.ready_drops == 0


# --- helpers: regular containers that are not the sandbox ----------------------------------


def test_a_helper_that_completes_beside_the_sandbox_is_no_death_by_default() -> None:
    """restartPolicy Never: `tools` exits 0 while `agent` runs on. Nobody named the sandbox's
    containers, so both are; one of them done for good is no death, and the sandbox ends
    when every one has (before: Dead, ContainerExited 0)."""
    j = Judge("no-probe")
    both = [running(cid=CID), running(name="tools", cid=TOOLS)]
    j.see(pod(restart_policy="Never", spec_containers=["tools"], containers=both), 2)
    done = [running(cid=CID), terminated(name="tools", code=0, reason="Completed", finished=20)]
    t = j.see(pod(restart_policy="Never", spec_containers=["tools"], ready=False, ready_at=20,
                  containers=done), 20)  # fmt: skip
    assert t.state is State.ALIVE and t.ready_drops == 0
    ended = [terminated(code=0, reason="Completed", finished=40, cid=CID), done[1]]
    t = j.see(pod(restart_policy="Never", spec_containers=["tools"], ready=False, ready_at=20,
                  containers=ended), 40)  # fmt: skip
    assert (t.state, t.cause) == (State.GONE, Cause.COMPLETED)


def test_a_helper_s_failure_is_the_sandbox_s_unless_the_deathwatch_names_the_sandbox() -> None:
    failed = [running(cid=CID), terminated(name="tools", code=1, finished=20)]
    kw: dict[str, Any] = {"restart_policy": "Never", "spec_containers": ["tools"]}
    both = [running(cid=CID), running(name="tools", cid=TOOLS)]
    by_default = Judge("no-probe")
    by_default.see(pod(containers=both, **kw), 2)
    t = by_default.see(pod(ready=False, ready_at=20, containers=failed, **kw), 20)
    assert (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
    named = Judge("no-probe", sandbox=frozenset({"agent"}))
    named.see(pod(containers=both, **kw), 2)
    t = named.see(pod(ready=False, ready_at=20, containers=failed, **kw), 20)
    assert t.state is State.ALIVE


def test_a_named_sandbox_s_helper_restarting_is_counted_and_its_completion_ends_nothing() -> None:
    j = Judge("no-probe", sandbox=frozenset({"agent"}))
    both = [running(cid=CID), running(name="tools", cid=TOOLS)]
    j.see(pod(spec_containers=["tools"], containers=both), 2)
    again = [running(cid=CID),
             running(name="tools", since=21, restarts=1, ready=False, last=termination(0))]  # fmt: skip
    t = j.see(pod(spec_containers=["tools"], ready=False, ready_at=20, containers=again), 21)
    assert (t.state, t.sidecar_restarts) == (State.ALIVE, 1)
    # the sandbox's own container completing ends it, the helper running on or not
    ended = [terminated(code=0, reason="Completed", finished=40, cid=CID), again[1]]
    t = j.see(pod(spec_containers=["tools"], restart_policy="Never", ready=False, ready_at=20,
                  containers=ended), 40)  # fmt: skip
    assert (t.state, t.cause) == (State.GONE, Cause.COMPLETED)


def test_containers_a_deathwatch_names_that_the_pod_lacks_leave_every_container_the_sandbox() -> (
    None
):
    j = Judge("no-probe", sandbox=frozenset({"no-such"}))
    j.see(pod(), 2)
    t = j.see(pod(ready=False, ready_at=20, containers=[terminated(code=3, finished=20)]), 20)
    assert (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)


# --- restart rules (KEP-5307) and RestartAllContainers (KEP-5532) ---------------------------

NEVER_BUT_42 = {"restartPolicy": "Never", "restartPolicyRules": [
    {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]}  # fmt: skip
NEVER_BUT_FAILURES = {"restartPolicy": "Never", "restartPolicyRules": [
    {"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0]}}]}  # fmt: skip


@pytest.mark.parametrize(
    ("own", "code", "fate"),
    [
        (NEVER_BUT_42, 0, (State.GONE, Cause.COMPLETED)),  # no rule matched: Never holds
        (NEVER_BUT_42, 42, (State.DEAD, Cause.CONTAINER_EXITED)),  # restarted in place
        (NEVER_BUT_42, 3, (State.DEAD, Cause.CONTAINER_EXITED)),
        ({"restartPolicy": "OnFailure"}, 0, (State.GONE, Cause.COMPLETED)),
        ({"restartPolicy": "Always"}, 0, (State.DEAD, Cause.CONTAINER_EXITED)),
        (NEVER_BUT_FAILURES, 0, (State.GONE, Cause.COMPLETED)),
        (NEVER_BUT_FAILURES, 1, (State.DEAD, Cause.CONTAINER_EXITED)),
    ],
)
def test_a_container_s_own_rules_say_whether_an_exit_0_completes(
    own: dict[str, Any], code: int, fate: tuple[State, Cause]
) -> None:
    """The kubelet's first report after the exit: the phase still Running."""
    j = Judge("no-probe")
    j.see(pod(rules={"agent": own}), 2)
    reason = "Completed" if code == 0 else "Error"
    report = pod(rules={"agent": own}, ready=False, ready_at=20,
                 containers=[terminated(code=code, reason=reason, finished=20)])  # fmt: skip
    t = j.see(report, 20)
    assert (t.state, t.cause) == fate


def test_a_container_stopped_to_restart_them_all_is_a_death() -> None:
    """A helper's exit matched a RestartAllContainers rule: the kubelet stops the sandbox's
    container too (reason RestartingAllContainers) and runs the pod again."""
    j = Judge("no-probe", sandbox=frozenset({"agent"}))
    both = [running(cid=CID), running(name="tools", cid=TOOLS)]
    j.see(pod(spec_containers=["tools"], restart_policy="Never", containers=both), 2)
    stopped = [terminated(code=137, reason="RestartingAllContainers", finished=20, cid=CID),
               terminated(name="tools", code=7, finished=20, cid=TOOLS)]  # fmt: skip
    t = j.see(pod(spec_containers=["tools"], restart_policy="Never", ready=False, ready_at=20,
                  containers=stopped), 20)  # fmt: skip
    assert (t.state, t.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
    assert t.evidence is not None and t.evidence.reason == "RestartingAllContainers"


# --- one fate for every history: kubelet's reports and the node's exit, every timing --------


@dataclass(frozen=True)
class Shape:
    policy: str
    restart_policy: str
    own_rules: bool
    code: int
    oom: bool
    sidecar: bool  # a native sidecar runs beside it (stopped once the pod ends)
    helper: str | None  # a second regular container: running on, or completed before
    named: bool  # the DeathWatch names `agent` the sandbox's container

    @property
    def restarts(self) -> bool:
        if self.own_rules:
            return self.code == 42
        return self.restart_policy == "Always" or (
            self.restart_policy == "OnFailure" and self.code != 0
        )

    @property
    def fate(self) -> tuple[State, Cause | None]:
        """What happened, said independently of the engine."""
        if self.restarts or self.code != 0:
            return State.DEAD, Cause.OOM_KILLED if self.oom else Cause.CONTAINER_EXITED
        if self.helper == "running" and not self.named:
            return State.ALIVE, None  # a container of the sandbox runs on
        return State.GONE, Cause.COMPLETED

    def kw(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"probe": probe_for(self.policy), "restart_policy": self.restart_policy,
                              "own_restart_rules": self.own_rules}  # fmt: skip
        if self.helper:
            kw["spec_containers"] = ["tools"]
        return kw

    def others(self, ended: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        helper = (
            [] if self.helper is None
            else [running(name="tools", cid=TOOLS)] if self.helper == "running"
            else [terminated(name="tools", code=0, reason="Completed", finished=10, cid=TOOLS)]
        )  # fmt: skip
        if not self.sidecar:
            return helper, None
        stopped = ended and self.helper != "running"
        side = (terminated(name="proxy", code=143, finished=54, cid=PROXY) if stopped
                else proxy())  # fmt: skip
        return helper, [side]

    def live(self) -> dict[str, Any]:
        helper, sidecars = self.others(False)
        ready = self.helper != "completed"
        return pod(ready=ready, ready_at=2, containers=[running(cid=CID), *helper],
                   sidecars=sidecars, **self.kw())  # fmt: skip

    def reports(self) -> list[tuple[float, dict[str, Any]]]:
        """The kubelet's reports after the exit at 50.25, as 1.35 writes them."""
        reason = "OOMKilled" if self.oom else "Completed" if self.code == 0 else "Error"
        kw = self.kw()
        helper, sidecars = self.others(False)
        if self.restarts:
            back = running(since=52, restarts=1, ready=False, cid=NEXT,
                           last=termination(self.code, reason, finished=50))  # fmt: skip
            first = [terminated(code=self.code, reason=reason, finished=50, cid=CID), *helper]
            return [
                (51, pod(ready=False, ready_at=51, containers=first, sidecars=sidecars, **kw)),
                (52, pod(ready=False, ready_at=51, containers=[back, *helper], sidecars=sidecars,
                         **kw)),
                (53, pod(ready_at=53, containers=[running(since=52, restarts=1, cid=NEXT,
                         last=termination(self.code, reason, finished=50)), *helper],
                         sidecars=sidecars, **kw)),
            ]  # fmt: skip
        ended = [terminated(code=self.code, reason=reason, finished=50, cid=CID), *helper]
        out: list[tuple[float, dict[str, Any]]] = [(51, pod(ready=False, ready_at=51, phase="Running", containers=ended,
                        sidecars=sidecars, **kw))]  # fmt: skip
        if self.helper != "running":
            _, stopped = self.others(True)
            phase = "Succeeded" if self.code == 0 else "Failed"
            out.append((55, pod(ready=False, ready_at=51, phase=phase, containers=ended,
                                sidecars=stopped, **kw)))  # fmt: skip
        return out


shapes = st.builds(
    Shape,
    policy=st.sampled_from(POLICIES),
    restart_policy=st.sampled_from(["Always", "OnFailure", "Never"]),
    own_rules=st.booleans(),
    code=st.sampled_from([0, 0, 1, 42]),
    oom=st.sampled_from([False, False, True]),
    sidecar=st.booleans(),
    helper=st.sampled_from([None, None, "running", "completed"]),
    named=st.booleans(),
).map(lambda s: Shape(**{
    **s.__dict__,
    "code": 137 if s.oom else s.code,
    # under Always the kubelet restarts a helper that exits 0: it never stays completed
    "helper": None if s.helper == "completed" and s.restart_policy == "Always" else s.helper,
}))  # fmt: skip


def _final(shape: Shape, exit_at: int | None, join_at: int | None) -> tuple[State, Cause | None]:
    """One replica's final verdict: it sees the live pod (or, joining late, restores the
    leader's verdict of it as written and sees only the reports from `join_at`), the node's
    exit judged with the pod as the API held it when it was judged (before report
    `exit_at`; None: never heard, the node path off)."""
    j = Judge(shape.policy, sandbox=frozenset({"agent"}) if shape.named else frozenset())
    live = shape.live()
    j.see(live, 2)
    reports = shape.reports()
    if join_at is not None:
        status = sandbox_verdicts.verdict_status(j.track, None)
        restored = sandbox_verdicts.track_from_status("sandboxes", "sbx-1",
                                               to_document(status))  # fmt: skip
        assert restored is not None
        j = Judge(shape.policy, sandbox=j.settings.sandbox_containers)
        j.fleet.memories["uid-1"] = memory.restored(restored, j.fleet.policies, j.fleet.deadlines)
        j.fleet.memories["uid-1"].settings = j.settings
    heard = NodeExit(CID, shape.code, shape.oom, at(50.25), "node-a")
    fresh = live
    for i, (now, report) in enumerate(reports):
        if exit_at == i:
            j.exit(fresh, heard, now - 0.5)
        if join_at is None or i >= join_at:
            j.see(report, now)
        fresh = report
    if exit_at == len(reports):  # a standby's deferred judgement: after every report
        j.exit(fresh, heard, 60)
    j.tick(400)  # any Suspect window closes
    return j.track.state, j.track.cause


@examples(300, slow=True)
@given(shapes, st.data())
def test_every_history_has_one_fate_on_every_path_replica_and_timing(
    shape: Shape, data: st.DataObject
) -> None:
    """The kubelet's reports alone; the node's exit before, between or after them (a
    leader hears it first; a standby judges it 2 s late); a replica that joins late from the
    written verdict: the same final state and cause, and the one the history means."""
    n = len(shape.reports())
    exit_at = data.draw(st.sampled_from([None, *range(n + 1)]), label="exit_at")
    join_at = data.draw(st.sampled_from([None, *range(n)]), label="join_at")
    expected = shape.fate
    assert _final(shape, None, None) == expected, "kubelet only"
    assert _final(shape, exit_at, None) == expected, f"the node's exit before report {exit_at}"
    assert _final(shape, exit_at, join_at) == expected, f"joined at report {join_at}"
