"""Deaths the cluster inflicts, on the real control plane's own components (issue #29).

kube-scheduler and kube-controller-manager run every controller (node lifecycle, taint
eviction, pod GC, disruption); the nodes have no kubelet and are kept alive the way a kubelet
keeps them (hack/localcluster/fakenodes.py: Lease renewals, the Ready heartbeat), and a pod's
deletion is confirmed as a kubelet confirms it (containers stopped, phase Failed, grace 0).
The controller runs as a process under its ServiceAccount. Each sandbox is Ready and judged
Alive first; then the real component does its real thing:

- `kubectl drain` (the Eviction API), and one a PodDisruptionBudget blocks (not a death);
- kube-scheduler preempting a sandbox for a higher-priority pod;
- a NoExecute taint and the taint-eviction controller, with and without tolerationSeconds;
- a Node deleted, then pod GC;
- a node whose kubelet goes silent: the node lifecycle controller marks its pods not Ready
  and taints it unreachable (NodeLost under no-probe; NodeUnreachable under container-state);
- controls: a platform deletion, an OOM kill, and a DisruptionTarget the disruption
  controller clears because no deletion followed (Alive again, never Dead).

The pod watch is recorded as `kubectl get pods --watch --output-watch-events -o json` writes
it; `deathwatch replay` of the recording must agree with every live verdict, and the
recording is what tests/data/disruptions.json holds (DEATHWATCH_RECORD_DIR=DIR writes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from deathwatch.client import Client
from hack.localcluster import controlplane
from hack.localcluster.fakenodes import NodeKeeper, Terminator
from hack.localcluster.sandbox_script import ProbeStyle, pod_manifest, timeline
from tests.conftest import _binaries_or_skip
from tests.controller_env import (
    Env,
    Recording,
    admin_api,
    prepare,
    ready_status,
)
from tests.kube import fresh_namespace, wait_for

pytestmark = pytest.mark.apiserver
NS = "disrupted"
NODES = ("node-drain", "node-guarded", "node-preempt", "node-taint", "node-gone", "node-silent",
         "node-spare")  # fmt: skip
GRACE = 8  # --node-monitor-grace-period: how long a silent node is believed
STALE_CLEARED_AFTER = 120  # the disruption controller's stalePodDisruptionTimeout (fixed)
RESULTS: dict[str, Any] = {}


@dataclass
class Lane:
    cp: controlplane.ControlPlane
    e: Env
    keeper: NodeKeeper
    recording: Recording
    started: float

    @property
    def core(self) -> client.CoreV1Api:
        return self.e.core

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        done = self.cp.kubectl_run(*args, check=False, timeout=timeout)
        assert not check or done.returncode == 0, f"kubectl {args[:2]}: {done.stdout}{done.stderr}"
        return done

    def sandbox(self, name: str, node: str, *, app: str = "sandbox",
                tolerations: list[dict[str, Any]] | None = None, cpu: str | None = None,
                probe: ProbeStyle = "none") -> str:  # fmt: skip
        """A sandbox pod bound to `node`, made Ready as its kubelet would, judged Alive."""
        script = self.e.script(name, node=node, labels={"app": app}, probe=probe)
        # the kubelet's Ready written now, not at the script's own offset from its start: the
        # recording's times are then the wall clock's, as a real kubelet's are
        ready_at = next(m.at for m in timeline(script) if m.status == ready_status(script))
        script = dataclasses.replace(script, start=script.start - ready_at)
        body = pod_manifest(script)
        if tolerations:
            body["spec"]["tolerations"] = tolerations
        if cpu:
            body["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
        self.core.create_namespaced_pod(NS, body, _request_timeout=30)
        self.e.kubelet.status(NS, name, ready_status(script))
        self.e.wait_state(name, "Alive", timeout=30)
        return name

    def verdict(self, name: str) -> dict[str, Any]:
        sv = self.e.sv(name)
        assert sv is not None, f"no verdict for {name}"
        return sv

    def dead(self, name: str, cause: str, timeout: float = 60) -> dict[str, Any]:
        sv = self.e.wait_state(name, "Dead", timeout=timeout)
        status = sv["status"]
        assert status["cause"] == cause, (name, status)
        return sv

    def dead_event(self, name: str) -> str:
        """The one SandboxDead Event of the pod, its message."""
        events = wait_for(lambda: self.e.events(name, "SandboxDead"), timeout=30,
                          what=f"the SandboxDead Event of {name}")  # fmt: skip
        assert len(events) == 1, [e.message for e in events]
        return str(events[0].message)


@pytest.fixture(scope="module")
def lane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lane]:
    _binaries_or_skip("kube-scheduler")
    tmp = tmp_path_factory.mktemp("disruptions")
    with (
        controlplane.running(
            with_scheduler=True,
            with_node_controllers=True,
            controller_manager_args=[
                f"--node-monitor-grace-period={GRACE}s",
                "--node-monitor-period=1s",
            ],
        ) as cp,
        contextlib.ExitStack() as threads,  # stopped before the control plane, however we end
    ):
        prepare(cp)
        api = admin_api(cp)
        fresh_namespace(api, NS)
        keeper = NodeKeeper(api, NODES, capacity={"node-preempt": "1"}).start()
        threads.callback(keeper.stop)
        terminator = Terminator(api, NS, keeper).start()
        threads.callback(terminator.stop)
        scheduling = client.SchedulingV1Api(api)
        scheduling.create_priority_class({"metadata": {"name": "urgent"}, "value": 1000},
                                         _request_timeout=30)  # fmt: skip
        e = Env(cp, api, NS, tmp)
        e.bind_controller()
        recording = Recording(cp, NS, tmp / "recording.json")
        e.start_controller()
        e.deathwatch()  # app=sandbox, policy auto: no-probe for these pods
        e.deathwatch("patient", podSelector={"matchLabels": {"app": "patient"}},
                     policy="container-state")  # fmt: skip
        lane = Lane(cp, e, keeper, recording, time.monotonic())
        try:
            yield lane
        finally:
            recording.stop()
            if e.controller is not None:
                print(e.controller.tail(80))
                forbidden = e.forbidden_calls()
                e.controller.stop()
                assert forbidden == 0, "the controller was refused an API call"
            print("\ndisruption lane:", json.dumps(RESULTS, indent=1))


# --- a DisruptionTarget nobody follows: set first, cleared by the real controller last -----


def test_a_disruption_announced_and_not_followed_is_suspect(lane: Lane) -> None:
    """A component wrote the condition and never deleted the pod (the scheduler crashed
    between its two calls): Suspect (Disrupting); the disruption controller sets the stale
    condition to False after 2 minutes (checked at the end of the module)."""
    lane.sandbox("stale", "node-spare")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    lane.core.patch_namespaced_pod_status("stale", NS, {"status": {"conditions": [{
        "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
        "message": "default-scheduler: preempting to accommodate a higher priority pod",
        "lastTransitionTime": now}]}}, _request_timeout=30)  # fmt: skip
    sv = lane.e.wait_state("stale", "Suspect")
    assert sv["status"]["cause"] == "Disrupting"
    assert sv["status"]["disruption"]["reason"] == "PreemptionByScheduler"
    RESULTS["stale_set_at"] = time.monotonic() - lane.started


# --- kubectl drain --------------------------------------------------------------------------


def test_kubectl_drain_is_dead_drained_with_the_eviction_apis_words(lane: Lane) -> None:
    names = [lane.sandbox(f"drained-{i}", "node-drain") for i in range(2)]
    names.append(lane.sandbox("drained-exec", "node-drain", probe="exec"))
    started = time.monotonic()
    done = lane.kubectl("drain", "node-drain", "--ignore-daemonsets", "--force",
                        "--delete-emptydir-data", "--timeout=60s", timeout=90)  # fmt: skip
    RESULTS["drain_seconds"] = round(time.monotonic() - started, 2)
    assert "drained" in done.stdout, done.stdout
    for name in names:
        sv = lane.dead(name, "Drained")
        status = sv["status"]
        assert status["origin"] == "Infrastructure"
        assert status["disruption"]["reason"] == "EvictionByEvictionAPI"
        assert "deathwatch.dev/origin" not in sv["metadata"]["labels"]  # a field, no label (#43)
        message = lane.dead_event(name)
        assert "Drained" in message and "Eviction API: evicting" in message, message
    lane.kubectl("uncordon", "node-drain")


def test_a_drain_a_disruption_budget_blocks_is_no_death(lane: Lane) -> None:
    lane.sandbox("guarded", "node-guarded", app="sandbox")
    lane.core.patch_namespaced_pod("guarded", NS, {"metadata": {"labels": {"guard": "yes"}}},
                                   _request_timeout=30)  # fmt: skip
    client.PolicyV1Api(lane.e.api).create_namespaced_pod_disruption_budget(NS, {
        "metadata": {"name": "guard"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"guard": "yes"}}},
    }, _request_timeout=30)  # fmt: skip
    # the disruption controller must have counted the pod before an eviction asks it
    wait_for(lambda: (client.PolicyV1Api(lane.e.api).read_namespaced_pod_disruption_budget(
        "guard", NS, _request_timeout=10).status.current_healthy or 0) >= 1,
        timeout=30, what="the PDB counting the guarded pod")  # fmt: skip
    done = lane.kubectl("drain", "node-guarded", "--ignore-daemonsets", "--force",
                        "--timeout=8s", check=False, timeout=60)  # fmt: skip
    assert done.returncode != 0, done.stdout
    assert "disruption budget" in (done.stdout + done.stderr), done.stderr
    pod = lane.core.read_namespaced_pod("guarded", NS, _request_timeout=10)
    assert pod.metadata.deletion_timestamp is None
    assert not [c for c in pod.status.conditions if c.type == "DisruptionTarget"]
    assert lane.verdict("guarded")["status"]["state"] == "Alive"
    assert lane.e.events("guarded", "SandboxDead") == []
    lane.kubectl("uncordon", "node-guarded")


# --- kube-scheduler's preemption --------------------------------------------------------------


def test_preemption_by_the_scheduler_is_dead_preempted(lane: Lane) -> None:
    lane.sandbox("preempted", "node-preempt", cpu="600m")
    lane.core.create_namespaced_pod(NS, {
        "metadata": {"name": "urgent"},
        "spec": {
            "priorityClassName": "urgent",
            "nodeSelector": {"kubernetes.io/hostname": "node-preempt"},
            "containers": [{"name": "batch", "image": "deathwatch.local/agent:demo",
                            "resources": {"requests": {"cpu": "600m"}}}],
        },
    }, _request_timeout=30)  # fmt: skip
    sv = lane.dead("preempted", "Preempted")
    assert sv["status"]["disruption"]["reason"] == "PreemptionByScheduler"
    message = lane.dead_event("preempted")
    assert "preempting to accommodate a higher priority pod" in message, message
    # and the preemptor took its place: the scheduler did the whole thing
    wait_for(lambda: lane.core.read_namespaced_pod("urgent", NS, _request_timeout=10)
             .spec.node_name == "node-preempt", timeout=60, what="urgent scheduled")  # fmt: skip


# --- the taint-eviction controller ----------------------------------------------------------


def test_a_noexecute_taint_evicts_with_and_without_toleration_seconds(lane: Lane) -> None:
    lane.sandbox("tainted", "node-taint")
    toleration = {"key": "dw-evict", "operator": "Exists", "effect": "NoExecute"}
    lane.sandbox("tolerates-3s", "node-taint", tolerations=[{**toleration, "tolerationSeconds": 3}])
    lane.sandbox("tolerates", "node-taint", tolerations=[toleration])
    tainted = time.monotonic()
    lane.kubectl("taint", "nodes", "node-taint", "dw-evict=now:NoExecute")
    sv = lane.dead("tainted", "TaintEvicted")
    assert sv["status"]["disruption"]["reason"] == "DeletionByTaintManager"
    assert "Taint manager: deleting due to NoExecute taint" in lane.dead_event("tainted")
    lane.dead("tolerates-3s", "TaintEvicted", timeout=60)
    RESULTS["toleration_3s_dead_after"] = round(time.monotonic() - tainted, 2)
    assert RESULTS["toleration_3s_dead_after"] >= 3
    # the one that tolerates it for ever lives on
    assert lane.verdict("tolerates")["status"]["state"] == "Alive"
    lane.kubectl("taint", "nodes", "node-taint", "dw-evict-")


# --- pod GC after a Node is deleted -------------------------------------------------------------


def test_a_deleted_node_leaves_its_pods_to_pod_gc_node_deleted(lane: Lane) -> None:
    lane.sandbox("orphaned", "node-gone")
    lane.keeper.forget("node-gone")
    deleted = time.monotonic()
    lane.core.delete_node("node-gone", _request_timeout=30)
    # pod GC quarantines a missing node for 40 s and runs every 20 s
    sv = lane.dead("orphaned", "NodeDeleted", timeout=120)
    RESULTS["pod_gc_after_seconds"] = round(time.monotonic() - deleted, 1)
    assert sv["status"]["disruption"]["message"] == "PodGC: node no longer exists"
    assert "PodGC: node no longer exists" in lane.dead_event("orphaned")


# --- a node that stops reporting --------------------------------------------------------------


def test_a_silent_node_is_node_lost_then_node_unreachable(lane: Lane) -> None:
    unreachable = [{"key": k, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 4}
                   for k in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")]  # fmt: skip
    lane.sandbox("silent", "node-silent", tolerations=unreachable)
    lane.sandbox("silent-patient", "node-silent", app="patient", tolerations=unreachable)
    silenced = time.monotonic()
    lane.keeper.silence("node-silent")
    # no-probe: Ready taken away by the node controller (its kubelet silent) is death
    lane.dead("silent", "NodeLost", timeout=GRACE + 60)
    RESULTS["node_lost_after_seconds"] = round(time.monotonic() - silenced, 1)
    # container-state: Ready means nothing; the unreachable taint's eviction is the end
    sv = lane.dead("silent-patient", "NodeUnreachable", timeout=GRACE + 60)
    RESULTS["node_unreachable_after_seconds"] = round(time.monotonic() - silenced, 1)
    assert sv["status"]["disruption"]["reason"] == "DeletionByTaintManager"
    assert sv["status"]["origin"] == "Infrastructure"


# --- controls: the platform's deletion, the workload's own death --------------------------------


def test_controls_a_platform_deletion_and_an_oom_kill(lane: Lane) -> None:
    lane.sandbox("deleted", "node-spare")
    lane.core.delete_namespaced_pod("deleted", NS, _request_timeout=30)
    sv = lane.e.wait_state("deleted", "Gone")
    assert (sv["status"]["cause"], sv["status"]["origin"]) == ("Deleted", "Platform")
    assert "disruption" not in sv["status"]
    lane.sandbox("oom", "node-spare")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    lane.core.patch_namespaced_pod_status("oom", NS, {"status": {
        "phase": "Failed",
        "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}],
        "containerStatuses": [{"name": "agent", "ready": False, "restartCount": 0,
                               "image": "deathwatch.local/agent:demo", "imageID": "",
                               "state": {"running": None,
                                         "terminated": {"exitCode": 137, "reason": "OOMKilled",
                                                        "startedAt": now, "finishedAt": now}}}],
    }}, _request_timeout=30)  # fmt: skip
    sv = lane.dead("oom", "OOMKilled")
    assert sv["status"]["origin"] == "Workload"


# --- the end: the stale disruption cleared, the counts, the recording -----------------------------


def test_the_stale_disruption_is_cleared_and_the_sandbox_is_alive_never_dead(lane: Lane) -> None:
    sv = lane.e.wait_state("stale", "Alive", timeout=STALE_CLEARED_AFTER + 90)
    assert "disruption" not in sv["status"]
    pod = lane.core.read_namespaced_pod("stale", NS, _request_timeout=10)
    (condition,) = [c for c in pod.status.conditions if c.type == "DisruptionTarget"]
    assert condition.status == "False"
    assert lane.e.events("stale", "SandboxDead") == []


INFRASTRUCTURE = {
    "drained-0": "Drained", "drained-1": "Drained", "drained-exec": "Drained",
    "preempted": "Preempted", "tainted": "TaintEvicted", "tolerates-3s": "TaintEvicted",
    "orphaned": "NodeDeleted", "silent": "NodeLost", "silent-patient": "NodeUnreachable",
}  # fmt: skip


def test_origin_selects_exactly_the_infrastructures_deaths(lane: Lane) -> None:
    """By field (the CRD's selectableFields, #43), on the real API server: origin alone, and
    with the state and the cause."""
    done = lane.kubectl("get", "sv", "-n", NS, "--field-selector", "status.origin=Infrastructure",
                        "-o", "json")  # fmt: skip
    found = {i["metadata"]["name"]: i["status"]["cause"] for i in json.loads(done.stdout)["items"]}
    assert found == INFRASTRUCTURE
    drained = lane.kubectl("get", "sv", "-n", NS, "--field-selector",
                           "status.state=Dead,status.cause=Drained", "-o", "name").stdout.split()  # fmt: skip
    assert sorted(n.rsplit("/", 1)[1] for n in drained) == sorted(
        n for n, cause in INFRASTRUCTURE.items() if cause == "Drained"
    )
    bad = lane.kubectl("get", "sv", "-n", NS, "--field-selector", "status.flaps=0", check=False)
    assert bad.returncode != 0 and "field label not supported" in bad.stderr, bad.stderr

    async def listed() -> dict[str, str]:
        async with Client.from_kubeconfig(str(lane.cp.kubeconfig)) as c:
            verdicts, _ = await c.verdicts(NS, field_selector="status.origin=Infrastructure")
        return {v.pod: str(v.cause) for v in verdicts}

    assert asyncio.run(listed()) == INFRASTRUCTURE  # the typed client, by the same field
    wide = lane.kubectl("get", "sv", "-n", NS, "drained-0", "-o", "wide").stdout
    assert "ORIGIN" in wide and "Infrastructure" in wide, wide
    sandboxes = lane.e.dw("sandboxes")["status"]
    patient = lane.e.dw("patient")["status"]
    assert sandboxes["deaths"]["infrastructure"] + patient["deaths"]["infrastructure"] == 9
    assert sandboxes["deaths"]["workload"] == 1  # the OOM kill
    metric = lane.e.controller.metric  # type: ignore[union-attr]
    assert metric("deathwatch_sandbox_deaths_total", origin="Infrastructure") == 9
    assert metric("deathwatch_sandbox_deaths_total", cause="Drained", origin="Infrastructure") == 3
    # no death here was a false positive: pod GC marks an orphan Failed and leaves its Ready
    false_positives = lane.core.list_namespaced_event(
        NS, field_selector="reason=SandboxFalsePositive", _request_timeout=10).items  # fmt: skip
    assert [e.involved_object.name for e in false_positives] == []


def test_replay_of_the_recorded_stream_agrees_with_every_live_verdict(lane: Lane) -> None:
    """What the real components wrote, replayed offline, gives the verdicts the controller
    gave live; the recording becomes the pure tests' fixture (DEATHWATCH_RECORD_DIR)."""
    recorded = lane.recording.stop()
    live = {i["metadata"]["name"]: (i["status"]["state"], i["status"].get("cause"))
            for i in json.loads(lane.kubectl("get", "sv", "-n", NS, "-o", "json").stdout)["items"]}  # fmt: skip
    replayed: dict[str, tuple[str, str | None]] = {}
    for selector, policy in (("app=sandbox", "auto"), ("app=patient", "container-state")):
        done = subprocess.run(
            [sys.executable, "-m", "deathwatch._cli", "replay", str(recorded), "-l", selector,
             "--policy", policy, "--format", "json"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        report = json.loads(done.stdout)
        for d in report["dead"]:
            replayed[d["name"]] = ("Dead", d["cause"])
    dead_live = {k: v for k, v in live.items() if v[0] == "Dead"}
    assert replayed == dead_live
    lane.recording.keep("disruptions.json")
