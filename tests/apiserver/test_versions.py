"""The Kubernetes releases users run (issue #40): 1.33, 1.34, 1.36 and 1.37 beside the pinned
1.35 every other lane runs (hack/versions.env: K8S_MATRIX).

For each release, its own kube-apiserver, kube-controller-manager (every controller: node
lifecycle, taint eviction, pod GC, disruption) and kube-scheduler, built from its module; etcd
and kubectl stay the pinned release's. On that control plane, the controller under its
ServiceAccount and the shipped RBAC, and agent-sandbox v1.0.3's controller, do the core of
the apiserver lanes at once (the cheapest run that proves each part, ADR 0026):

- the controller scenario: a sandbox exits (Dead, ContainerExited, its exit code, one Event),
  is OOM-killed (OOMKilled), is deleted by the platform (Gone, Deleted);
- the cluster's own disruptions, each by its real component: `kubectl drain` (the Eviction
  API: Drained), kube-scheduler's preemption (Preempted), a NoExecute taint and the taint
  eviction controller (TaintEvicted), a node gone silent and the node lifecycle controller
  (NodeLost);
- agent-sandbox: a Sandbox's pod judged naming its Sandbox, then suspended (Gone, Suspended).

Pod GC's 40 s quarantine and the disruption controller's 2 minute stale timeout are the
pinned release's only (tests/apiserver/test_disruptions.py): they are fixed constants, and
waiting them out on every release would cost minutes of CI for nothing new.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from hack import deferred
from hack.localcluster import agentsandbox, controlplane
from hack.localcluster.fakenodes import NodeKeeper, Terminator
from hack.localcluster.sandbox_script import Fate, SandboxScript, pod_manifest, timeline
from tests.controller_env import Env, admin_api, fate_status, prepare, ready_status
from tests.kube import fresh_namespace, wait_for

pytestmark = pytest.mark.apiserver
NS = "versions"
NODES = ("node-drain", "node-preempt", "node-taint", "node-silent", "node-spare")
GRACE = 8  # --node-monitor-grace-period: how long a silent node is believed
SANDBOX_API = ("agents.x-k8s.io", "v1beta1")
RESULTS: dict[str, dict[str, Any]] = {}


@dataclass
class Cluster:
    release: str
    cp: controlplane.ControlPlane
    e: Env
    keeper: NodeKeeper
    started: float

    @property
    def core(self) -> client.CoreV1Api:
        return self.e.core

    def kubectl(self, *args: str, timeout: float = 120) -> str:
        done = self.cp.kubectl_run(*args, check=False, timeout=timeout)
        assert done.returncode == 0, f"kubectl {args[:2]}: {done.stdout}{done.stderr}"
        return str(done.stdout)

    def sandbox(self, name: str, node: str, *, fate: Fate = Fate.EXITS, exit_code: int = 1,
                tolerations: list[dict[str, Any]] | None = None, cpu: str | None = None,
                ) -> SandboxScript:  # fmt: skip
        """A sandbox pod bound to `node`, made Ready as its kubelet would."""
        script = self.e.script(name, node=node, fate=fate, exit_code=exit_code)
        ready_at = next(m.at for m in timeline(script) if m.status == ready_status(script))
        script = dataclasses.replace(script, start=script.start - ready_at)
        body = pod_manifest(script)
        if tolerations:
            body["spec"]["tolerations"] = tolerations
        if cpu:
            body["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
        self.core.create_namespaced_pod(NS, body, _request_timeout=30)
        self.e.kubelet.status(NS, name, ready_status(script))
        return script

    def dead(self, name: str, cause: str, timeout: float = 60) -> dict[str, Any]:
        status: dict[str, Any] = self.e.wait_state(name, "Dead", timeout=timeout)["status"]
        assert status["cause"] == cause, (self.release, name, status)
        return status


@pytest.fixture(scope="module", params=controlplane.matrix())
def cluster(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:  # fmt: skip
    release: str = request.param
    deferred.wait("k8s-matrix")  # in a CI run, built beside the lanes (this module runs last)
    parts = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
    missing = [p for p in parts if not (controlplane.bin_dir(release) / p).exists()]
    if missing:
        pytest.skip(f"{release}: {', '.join(missing)} not built (hack/setup.sh)")
    reason = agentsandbox.missing()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp(f"k8s-{release}")
    started = time.monotonic()
    with (
        controlplane.running(
            release=release,
            with_scheduler=True,
            with_node_controllers=True,
            controller_manager_args=[
                f"--node-monitor-grace-period={GRACE}s",
                "--node-monitor-period=1s",
            ],
        ) as cp,
        contextlib.ExitStack() as stack,  # stopped before the control plane, however we end
    ):
        prepare(cp)
        api = admin_api(cp)
        fresh_namespace(api, NS)
        agentsandbox.install_crds(cp)
        agentsandbox.install_rbac(cp)
        sandboxes = agentsandbox.AgentSandboxController(cp, api, tmp).start()
        stack.callback(sandboxes.stop)
        keeper = NodeKeeper(api, NODES, capacity={"node-preempt": "1"}).start()
        stack.callback(keeper.stop)
        stack.callback(Terminator(api, NS, keeper).start().stop)
        client.SchedulingV1Api(api).create_priority_class(
            {"metadata": {"name": "urgent"}, "value": 1000}, _request_timeout=30
        )
        e = Env(cp, api, NS, tmp)
        e.bind_controller()
        e.start_controller()
        e.deathwatch()  # app=sandbox
        e.deathwatch("boxes", podSelector={"matchLabels": {"app": "box"}},
                     sandboxes="agent-sandbox")  # fmt: skip
        served = json.loads(cp.kubectl_run("version", "-o", "json").stdout)["serverVersion"]
        assert served["gitVersion"] == release, served
        RESULTS[release] = {"control_plane_seconds": round(time.monotonic() - started, 1)}
        try:
            yield Cluster(release, cp, e, keeper, started)
        finally:
            if e.controller is not None:
                print(e.controller.tail(40))
                forbidden = e.forbidden_calls()
                e.controller.stop()
                assert forbidden == 0, f"{release}: the controller was refused an API call"
            RESULTS[release]["seconds"] = round(time.monotonic() - started, 1)
            print(f"\nversion lane {release}:", json.dumps(RESULTS[release]))


def test_deaths_and_a_deletion(cluster: Cluster) -> None:
    c = cluster
    exits = c.sandbox("exits", "node-spare", exit_code=7)
    oom = c.sandbox("oom", "node-spare", fate=Fate.OOM)
    deleted = c.sandbox("deleted", "node-spare")
    for s in (exits, oom, deleted):
        c.e.wait_state(s.name, "Alive", timeout=30)
    c.e.kubelet.status(NS, exits.name, fate_status(exits))
    c.e.kubelet.status(NS, oom.name, fate_status(oom))
    c.core.delete_namespaced_pod(deleted.name, NS, _request_timeout=30)
    status = c.dead("exits", "ContainerExited")
    assert (status["container"], status["exitCode"]) == ("agent", 7)
    c.dead("oom", "OOMKilled")
    gone = c.e.wait_state("deleted", "Gone")["status"]
    assert (gone["cause"], gone["origin"]) == ("Deleted", "Platform")
    for name in ("exits", "oom"):
        events = wait_for(lambda n=name: c.e.events(n, "SandboxDead"), timeout=30,  # type: ignore[misc]
                          what=f"{c.release}: the SandboxDead Event of {name}")  # fmt: skip
        assert len(events) == 1


def test_the_clusters_own_disruptions(cluster: Cluster) -> None:
    c = cluster
    unreachable = [{"key": k, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 4}
                   for k in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")]  # fmt: skip
    c.sandbox("drained", "node-drain")
    c.sandbox("preempted", "node-preempt", cpu="600m")
    c.sandbox("tainted", "node-taint")
    c.sandbox("silent", "node-silent", tolerations=unreachable)
    for name in ("drained", "preempted", "tainted", "silent"):
        c.e.wait_state(name, "Alive", timeout=30)
    began = time.monotonic()
    c.keeper.silence("node-silent")
    c.kubectl("taint", "nodes", "node-taint", "dw-evict=now:NoExecute")
    c.core.create_namespaced_pod(NS, {
        "metadata": {"name": "urgent"},
        "spec": {
            "priorityClassName": "urgent",
            "nodeSelector": {"kubernetes.io/hostname": "node-preempt"},
            "containers": [{"name": "batch", "image": "deathwatch.local/agent:demo",
                            "resources": {"requests": {"cpu": "600m"}}}],
        },
    }, _request_timeout=30)  # fmt: skip
    c.kubectl("drain", "node-drain", "--ignore-daemonsets", "--force",
              "--delete-emptydir-data", "--timeout=60s", timeout=90)  # fmt: skip
    expected = {
        "drained": ("Drained", "EvictionByEvictionAPI"),
        "preempted": ("Preempted", "PreemptionByScheduler"),
        "tainted": ("TaintEvicted", "DeletionByTaintManager"),
    }
    for name, (cause, reason) in expected.items():
        status = c.dead(name, cause)
        assert status["origin"] == "Infrastructure", status
        assert status["disruption"]["reason"] == reason, (c.release, name, status)
    lost = c.dead("silent", "NodeLost", timeout=GRACE + 60)
    assert lost["origin"] == "Infrastructure", lost
    RESULTS[c.release]["disruptions_seconds"] = round(time.monotonic() - began, 1)


def test_agent_sandbox_names_its_sandbox_and_says_suspended(cluster: Cluster) -> None:
    c = cluster
    c.e.custom.create_namespaced_custom_object(*SANDBOX_API, NS, "sandboxes", {
        "apiVersion": "/".join(SANDBOX_API), "kind": "Sandbox", "metadata": {"name": "box"},
        "spec": {"podTemplate": {"metadata": {"labels": {"app": "box"}}, "spec": {
            "nodeName": "node-spare", "containers": [{"name": "agent", "image": "agent:1"}]}}},
    }, _request_timeout=30)  # fmt: skip
    wait_for(lambda: c.core.read_namespaced_pod("box", NS, _request_timeout=10), timeout=30,
             what=f"{c.release}: agent-sandbox's pod", ignore=(client.ApiException,))  # fmt: skip
    ready = {k: v for k, v in ready_status(c.e.script("box")).items() if k != "qosClass"}
    c.e.kubelet.status(NS, "box", ready)  # its QoS class is BestEffort: no resources asked
    alive = c.e.wait_state("box", "Alive", timeout=30)
    assert alive["status"]["sandbox"]["name"] == "box", alive["status"]
    c.e.custom.patch_namespaced_custom_object(*SANDBOX_API, NS, "sandboxes", "box",
                                              {"spec": {"operatingMode": "Suspended"}},
                                              _request_timeout=30)  # fmt: skip
    gone = c.e.wait_state("box", "Gone", timeout=60)["status"]
    assert gone["cause"] == "Suspended", (c.release, gone)


def test_the_release_ran(cluster: Cluster) -> None:
    """The controller's own view: no API call refused, no task crashed, ready."""
    c = cluster
    assert c.e.controller is not None
    report = c.e.controller.get("/readyz")
    assert report["details"]["failing_tasks"] == {}, report
    assert set(report["details"]["task_restarts"].values()) == {0}, report


def _minor(release: str) -> int:
    return int(release.split(".")[1])


def test_all_containers_restarted_in_place_is_one_death_and_no_false_positive(
    cluster: Cluster,
) -> None:
    """1.36 turns RestartAllContainersOnContainerExits on (beta, ADR 0026): a container rule
    with action RestartAllContainers restarts every container of the pod in place on a
    matching exit (the pod keeps its uid; AllContainersRestarting True meanwhile). The API of
    1.36 and later keeps the rule; the kubelet's part is played (a 1.36 kubelet needs cgroup
    v2). The sandbox's processes ended: Dead, ContainerExited 3; Ready again is its new life."""
    c = cluster
    script = c.e.script("restarts-all", node="node-spare", exit_code=3)
    body = pod_manifest(script)
    container = body["spec"]["containers"][0]
    container["restartPolicy"] = "Never"
    container["restartPolicyRules"] = [
        {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [3]}}
    ]
    refusal: client.ApiException | None = None
    try:
        made = c.core.create_namespaced_pod(NS, body, _request_timeout=30)
    except client.ApiException as exc:
        refusal = exc
    if refusal is None:
        kept = [r.action for r in made.spec.containers[0].restart_policy_rules or []]
    else:  # an older release's validation: a regular container's restartPolicy is new
        assert (refusal.status, _minor(c.release) < 36) == (422, True), (c.release, refusal.body)
        kept = ["refused"]
    RESULTS[c.release]["restart_all_containers_rule"] = kept
    if _minor(c.release) >= 36:
        assert kept == ["RestartAllContainers"], (c.release, kept)
    elif kept != ["RestartAllContainers"]:  # refused, or dropped with its gate off: the pod's
        # own restartPolicy Always restarts its container in place there
        if refusal is None:
            c.core.delete_namespaced_pod(script.name, NS, grace_period_seconds=0,
                                         _request_timeout=30)  # fmt: skip
        script = dataclasses.replace(script, name="restarts-always")
        body = pod_manifest(script)
        body["spec"]["restartPolicy"] = "Always"
        c.core.create_namespaced_pod(NS, body, _request_timeout=30)
    ready = ready_status(script)
    c.e.kubelet.status(NS, script.name, ready)
    c.e.wait_state(script.name, "Alive", timeout=30)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    started = ready["containerStatuses"][0]["state"]["running"]["startedAt"]

    def status(ready_now: bool, restarting: bool, container: dict[str, Any]) -> dict[str, Any]:
        flag = "True" if ready_now else "False"
        return {"conditions": [
            {"type": "Ready", "status": flag, "lastTransitionTime": now},
            {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
            {"type": "AllContainersRestarting", "status": "True" if restarting else "False",
             "lastTransitionTime": now},
        ], "containerStatuses": [{"name": "agent", "image": "deathwatch.local/agent:demo",
                                  "imageID": "", "ready": ready_now, **container}]}  # fmt: skip

    exited = {"exitCode": 3, "reason": "Error", "startedAt": started, "finishedAt": now}
    c.e.kubelet.status(NS, script.name, status(False, True, {
        "restartCount": 0, "started": False, "state": {"terminated": exited}}))  # fmt: skip
    dead = c.dead(script.name, "ContainerExited")
    assert dead["exitCode"] == 3, dead
    c.e.kubelet.status(NS, script.name, status(True, False, {
        "restartCount": 1, "started": True, "state": {"running": {"startedAt": now}},
        "lastState": {"terminated": exited}}))  # fmt: skip
    marker = c.sandbox("after-restart", "node-spare")  # judged after the Ready again, in order
    c.e.wait_state(marker.name, "Alive", timeout=30)
    sv = c.e.sv(script.name)
    assert sv is not None and (sv["status"]["state"], sv["status"]["falsePositive"]) == (
        "Dead",
        False,
    )
    assert c.e.events(script.name, "SandboxFalsePositive") == []
