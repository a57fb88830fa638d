"""gVisor on the real node (ADR 0033): containerd 2.x with gVisor's runsc shim beside runc, the
RuntimeClass `gvisor` (systrap), runsc and its shim built from their module
(hack/build-gvisor.sh). Sandboxes as platforms run them: `runtimeClassName: gvisor`.

What differs from runc, and is held here:
- a pod's containers run in its sandbox's own kernel (the Sentry), whose processes sit in the
  pod's cgroup: the host cannot signal one container's process, only the whole sandbox;
- the host's OOM killer takes the whole sandbox, and its containers exit 128 (the shim's code
  for a status it could not read), with containerd's OOM event before;
- a sandbox SIGKILLed on the host: its containers exit 128, no OOM;
- exec probes run through runsc: slower, and their exits are execs' (not the container's).

Every death is judged with its cause, heard on the node first, the kubelet's report agreeing;
the firewall refuses the host and a source outside the pod network at a gVisor sandbox's agent
port. This machine lacks CAP_SYS_RESOURCE: build-gvisor.sh makes runsc and its shim tolerate a
refused oom_score_adj (the harness only, never a shipped artifact)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hack.localcluster import controlplane
from hack.localcluster.node import (
    GVISOR_RUNTIME_CLASS,
    POD_SUBNET,
    Node,
    gvisor_available,
    gvisor_sandbox_pid,
)
from tests.controller_env import Env
from tests.kube import wait_for
from tests.node.parts import (
    EXEC_PROBE,
    NODE_EXITS,
    Exits,
    FirewallAgent,
    Stamps,
    agent_pod,
    connect,
    connect_from,
    ctl,
    outside,
    pod_ready,
    shielded,
)

pytestmark = pytest.mark.node
ROOT = Path(__file__).resolve().parents[2]
RESULTS: dict[str, Any] = {}
GVISOR = GVISOR_RUNTIME_CLASS
AGENT_PORT = 49983


@pytest.fixture(scope="module")
def node(control_plane: controlplane.ControlPlane) -> Iterator[Node]:
    reason = gvisor_available()
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    n = Node(control_plane, runtime="containerd2", gvisor=True).up()
    RESULTS["node_up_seconds"] = round(time.monotonic() - started, 1)
    try:
        yield n
    finally:
        n.down()
        assert n.leftovers() == []
        print("\ngVisor node measurements:", json.dumps(RESULTS, indent=1))


def sandbox_pid(e: Env, name: str) -> int:
    uid = e.core.read_namespaced_pod(name, e.ns, _request_timeout=10).metadata.uid
    pid = gvisor_sandbox_pid(uid)
    assert pid is not None, f"no gVisor sandbox for {name} ({uid})"
    return pid


def runs_under_gvisor(e: Env, name: str) -> None:
    pod = e.core.read_namespaced_pod(name, e.ns, _request_timeout=10)
    assert pod.spec.runtime_class_name == GVISOR
    sandbox_pid(e, name)  # its processes are a gVisor sandbox's, not runc's


# (how, cause, exit code): an exit of its own, an OOM kill (the host's OOM killer takes the
# sandbox: 128, the status unread), the sandbox SIGKILLed on the host (128, no OOM)
DEATHS = [("exit", "ContainerExited", 3), ("oom", "OOMKilled", 128),
          ("sandbox-sigkill", "ContainerExited", 128)]  # fmt: skip


def test_each_death_under_gvisor_is_heard_on_the_node_with_its_cause(
    nenv: Env, heard: Exits
) -> None:
    """With the exits observer reading containerd's task events from runsc's shim: each death
    Dead with its cause and code, observedBy node, before the kubelet's report, which agrees
    (no dispute, one SandboxDead)."""
    e = nenv
    e.start_controller(extra=NODE_EXITS)
    e.deathwatch()
    stamps = Stamps(e)
    stamps.start()
    kill_to_dead: list[float] = []
    ahead: list[float] = []
    for i, (how, cause, code) in enumerate(DEATHS):
        name = agent_pod(e, f"gv-{i}", runtime_class=GVISOR)
        e.wait_state(name, "Alive", timeout=60)
        runs_under_gvisor(e, name)
        started = time.monotonic()
        if how == "sandbox-sigkill":
            os.kill(sandbox_pid(e, name), signal.SIGKILL)
        else:
            (ctl(e, name) / how).write_text("3" if how == "exit" else "")
        dead = e.wait_state(name, "Dead", timeout=30)["status"]
        wait_for(lambda n=name: n in stamps.dead, what="the test's verdict watch")  # type: ignore[misc]
        kill_to_dead.append((stamps.dead[name] - started) * 1e3)
        assert (dead["cause"], dead["exitCode"], dead["observedBy"]) == (cause, code, "node"), dead
        wait_for(lambda n=name: n in stamps.terminated, timeout=30, what="the kubelet's report")  # type: ignore[misc]
        ahead.append((stamps.terminated[name] - stamps.dead[name]) * 1e3)
    stamps.stop = True
    # a pod made after the reports: once it is Alive, the controller has judged them
    e.wait_state(agent_pod(e, "gv-marker", runtime_class=GVISOR), "Alive", timeout=60)
    for i in range(len(DEATHS)):
        sv = (e.sv(f"gv-{i}") or {})["status"]
        assert sv["state"] == "Dead" and "disputed" not in sv, sv
        assert e.events(f"gv-{i}", "NodeExitDisputed") == []
        assert len(e.events(f"gv-{i}", "SandboxDead")) == 1
    pod = e.core.read_namespaced_pod("gv-1", e.ns, _request_timeout=10)
    reported = pod.status.container_statuses[0].state.terminated
    assert (reported.reason, reported.exit_code) == ("OOMKilled", 128)  # the kubelet's, agreeing
    # the OOM kill was counted at the pod's cgroup and waited for its event; the sandbox's
    # SIGKILL counted none there and was published at once
    assert heard.sigkills().get("gv-2") == "none", heard.sigkills()
    RESULTS["kill_to_dead_ms"] = [round(x, 1) for x in kill_to_dead]
    RESULTS["node_verdict_ahead_of_kubelet_report_ms"] = [round(x, 1) for x in ahead]


def test_with_no_observer_the_kubelets_report_judges_each_gvisor_death(nenv: Env) -> None:
    e = nenv
    e.start_controller(extra=NODE_EXITS)
    e.deathwatch()
    for i, (how, cause, code) in enumerate(DEATHS[:2]):
        name = agent_pod(e, f"kubelet-{i}", runtime_class=GVISOR)
        e.wait_state(name, "Alive", timeout=60)
        (ctl(e, name) / how).write_text("3" if how == "exit" else "")
        dead = e.wait_state(name, "Dead", timeout=30)["status"]
        assert (dead["cause"], dead["exitCode"]) == (cause, code), dead
        assert dead.get("observedBy", "kubelet") == "kubelet", dead


def test_exec_probe_flaps_under_gvisor_keep_each_policys_meaning(nenv: Env, heard: Exits) -> None:
    """runsc runs each exec probe in the sandbox (slower than runc's), and its exits are
    execs', never the container's. Under exec-probe a flap is Suspect then Alive, a hang Dead
    Unresponsive; under container-state (a DeathWatch of its own, the same probes, at the
    same time) a probe failing past exec-probe's window leaves the sandbox Alive, and only its
    own exit is its death."""
    e = nenv
    e.start_controller(extra=NODE_EXITS)
    e.deathwatch(execProbe={"windowMultiplier": 3})  # W = 3 x (1 x 1 s + 1 s) = 6 s
    e.deathwatch("steady", podSelector={"matchLabels": {"app": "steady"}},
                 policy="container-state")  # fmt: skip
    name = agent_pod(e, "probed", probe=EXEC_PROBE, runtime_class=GVISOR)
    steady = agent_pod(e, "steady", probe=EXEC_PROBE, runtime_class=GVISOR,
                       labels={"app": "steady"})  # fmt: skip
    e.wait_state(name, "Alive", timeout=60)
    e.wait_state(steady, "Alive", timeout=60)
    started = time.monotonic()
    for pod in (name, steady):
        (ctl(e, pod) / "unready").write_text("")
    suspect = e.wait_state(name, "Suspect", timeout=15)["status"]
    RESULTS["exec_probe_fail_to_suspect_s"] = round(time.monotonic() - started, 2)
    assert suspect["cause"] == "NotReady"
    (ctl(e, name) / "unready").unlink()
    assert e.wait_state(name, "Alive", timeout=15)["status"]["flaps"] == 1
    (ctl(e, name) / "unready").write_text("")
    dead = e.wait_state(name, "Dead", timeout=40)["status"]
    assert (dead["cause"], dead["flaps"]) == ("Unresponsive", 1), dead
    assert dead.get("observedBy", "kubelet") == "kubelet"  # no exit: the probes said it
    pod = e.core.read_namespaced_pod(name, e.ns, _request_timeout=10)
    assert pod.status.container_statuses[0].state.running is not None  # it runs on, unready
    # container-state's sandbox has failed its probe as long, past exec-probe's window: Alive,
    # and for a while more, not once
    assert not pod_ready(e, steady)
    assert time.monotonic() - started > 6
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        sv = (e.sv(steady) or {})["status"]
        assert (sv["state"], sv["policy"]) == ("Alive", "container-state"), sv
        time.sleep(0.5)
    (ctl(e, steady) / "exit").write_text("4")
    dead = e.wait_state(steady, "Dead", timeout=30)["status"]
    assert (dead["cause"], dead["exitCode"], dead["observedBy"]) == ("ContainerExited", 4, "node")


def test_the_firewall_refuses_the_host_and_outside_sources_at_a_gvisor_sandbox(
    nenv: Env, control_plane: controlplane.ControlPlane, exits_token: Path, tmp_path: Path
) -> None:
    """gVisor's netstack answers in the pod's network namespace, behind the same veth as a
    runc pod's: the output rule refuses the host, the inbound rule a source outside the pod
    network, and a pod still reaches the agent port; the other port stays open. The verdict
    says Shielded only while that holds: the node's agent (its coverage Lease) in force."""
    e = nenv
    e.start_controller(extra=["--firewall-daemonset", "deathwatch-system/deathwatch-firewall",
                              "--coverage-interval", "0.5"])  # fmt: skip
    e.deathwatch()
    target = agent_pod(e, "target", runtime_class=GVISOR)
    wait_for(lambda: pod_ready(e, target), timeout=60, what="the gVisor sandbox Ready")
    shielded(e, target, ("False", "NoAgent"))  # no agent on its node
    ip = e.core.read_namespaced_pod(target, e.ns, _request_timeout=10).status.pod_ip
    with outside() as ns:
        before = (connect(ip, AGENT_PORT), connect_from(ns, ip, AGENT_PORT))
        assert before == ("connected", "connected"), before  # the holes, before the firewall
        agent = FirewallAgent(tmp_path, POD_SUBNET, AGENT_PORT, (control_plane, exits_token))
        agent.up()
        try:
            # the inbound rule is keyed on the node's sandboxes, learned from the API
            wait_for(lambda: connect_from(ns, ip, AGENT_PORT) != "connected", timeout=20,
                     what="the gVisor sandbox in the inbound rule's set")  # fmt: skip
            shielded(e, target, ("True", "RuleInForce"))
            assert connect(ip, AGENT_PORT) == "refused"
            assert connect_from(ns, ip, AGENT_PORT) != "connected"
            assert connect(ip, 8080) == "connected"
            assert connect_from(ns, ip, 8080) == "connected"
            client = agent_pod(e, "client", environment={"TARGET": f"{ip}:{AGENT_PORT}"},
                               labels={"app": "client"}, runtime_class=GVISOR)  # fmt: skip
            result = ctl(e, client) / "result"
            wait_for(lambda: result.exists() and result.read_text().strip() == "connected",
                     timeout=60, what="a gVisor pod reaching the agent port")  # fmt: skip
            refusals = [connect(ip, AGENT_PORT) for _ in range(50)]
            assert set(refusals) == {"refused"}
        finally:
            agent.down()
            print(f"--- firewall agent:\n{agent.log.read_text()[-3000:]}")
        assert connect(ip, AGENT_PORT) == "connected"
        shielded(e, target, ("False", None))  # the agent and its table gone: never True
