"""agent-sandbox v1.0 as its users run it, on the real node: the release's controller (core
and extensions, built from its Go module), its CRDs and RBAC, a real kubelet running the
Sandboxes' pods. deathwatch judges them with no label of the user's (`spec.sandboxes:
agent-sandbox`); each verdict names its Sandbox, claim, template and warm pool; a suspended,
expired or deleted Sandbox is Gone with that cause; a death under a live Sandbox is Dead with
its evidence. Next to each verdict, what agent-sandbox's own Sandbox status said (printed at
the end, for the README's table).

Every Sandbox runs under gVisor (`runtimeClassName: gvisor`, on containerd 2.x: node.py), as
agent-sandbox's examples and GKE Sandbox run them; runc is every other node module's runtime
(pairwise: agent-sandbox x gVisor here, runc x the rest). Under gVisor an OOM kill takes the
whole sandbox, whose container exits 128 (ADR 0033)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from deathwatch._engine.timeutil import format_time
from hack.localcluster import agentpods, agentsandbox, controlplane
from hack.localcluster.node import (
    GVISOR_RUNTIME_CLASS,
    NODE_NAME,
    POD_SUBNET,
    Node,
    gvisor_available,
)
from tests.controller_env import Env
from tests.kube import wait_for
from tests.node.parts import ROOT, FirewallAgent, connect, connect_from, outside, shielded

pytestmark = pytest.mark.node
CORE = ("agents.x-k8s.io", "v1beta1")
EXT = ("extensions.agents.x-k8s.io", "v1beta1")
SIDE_BY_SIDE: dict[str, dict[str, Any]] = {}
AGENT_PORT = 49983  # case -> agent-sandbox's status and our verdict


@pytest.fixture(scope="module")
def node(control_plane: controlplane.ControlPlane) -> Iterator[Node]:
    reason = gvisor_available() or agentsandbox.missing()
    if reason:
        pytest.skip(reason)
    n = Node(control_plane, runtime="containerd2", gvisor=True).up()
    try:
        yield n
    finally:
        n.down()
        assert n.leftovers() == []
        print("\nagent-sandbox side by side:", json.dumps(SIDE_BY_SIDE, indent=1))


@pytest.fixture(scope="module")
def agent_sandbox(
    control_plane: controlplane.ControlPlane, api: client.ApiClient, node: Node,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[agentsandbox.AgentSandboxController]:  # fmt: skip
    agentsandbox.install_crds(control_plane)
    agentsandbox.install_rbac(control_plane)
    controller = agentsandbox.AgentSandboxController(
        control_plane, api, tmp_path_factory.mktemp("agent-sandbox")
    ).start()
    try:
        yield controller
    finally:
        print(controller.tail(30))
        controller.stop()


@pytest.fixture
def aenv(env: Env, node: Node, agent_sandbox: agentsandbox.AgentSandboxController) -> Env:
    env.node = node  # type: ignore[attr-defined]
    env.start_controller()
    env.deathwatch(podSelector={}, sandboxes="agent-sandbox")
    return env


def pod_spec(e: Env, ctl_name: str, memory: str = "32Mi", per_pod: bool = False) -> dict[str, Any]:
    """The test agent's pod spec (agentpods.py), pinned to the node. `per_pod`: one control
    directory per pod under the shared one (a template's pods all have the same spec)."""
    ctl = e.node.ctl(f"{e.ns}-{ctl_name}")  # type: ignore[attr-defined]
    spec: dict[str, Any] = agentpods.agent_pod(ctl_name, ctl, node=NODE_NAME, memory=memory,
                                               runtime_class=GVISOR_RUNTIME_CLASS)["spec"]  # fmt: skip
    if per_pod:
        container = spec["containers"][0]
        container["env"] = [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
        ]
        container["volumeMounts"][0]["subPathExpr"] = "$(POD_NAME)"
    return spec


def cli(e: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deathwatch._cli", *args, "--kubeconfig",
                           str(e.cp.kubeconfig)], text=True, capture_output=True, timeout=60,
                          check=False)  # fmt: skip


def ctl_of(e: Env, ctl_name: str, pod: str | None = None) -> Path:
    path: Path = e.node.ctl(f"{e.ns}-{ctl_name}")  # type: ignore[attr-defined]
    return path / pod if pod else path


def create(e: Env, api: tuple[str, str], plural: str, kind: str, name: str,
           spec: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    body = {"apiVersion": "/".join(api), "kind": kind, "metadata": {"name": name}, "spec": spec}
    obj: dict[str, Any] = e.custom.create_namespaced_custom_object(
        *api, e.ns, plural, body, _request_timeout=30
    )
    return obj


def sandbox(e: Env, name: str, spec: dict[str, Any], **more: Any) -> None:
    create(e, CORE, "sandboxes", "Sandbox", name, {"podTemplate": {"spec": spec}, **more})


def sandbox_status(e: Env, name: str) -> dict[str, Any]:
    """agent-sandbox's own word: its Sandbox's Ready condition and mode (or that it is gone)."""
    try:
        obj = e.custom.get_namespaced_custom_object(*CORE, e.ns, "sandboxes", name,
                                                    _request_timeout=10)  # fmt: skip
    except client.ApiException as exc:
        if exc.status == 404:
            return {"sandbox": "deleted"}
        raise
    conditions: list[dict[str, Any]] = obj.get("status", {}).get("conditions", [])
    ready: dict[str, Any] = next((c for c in conditions if c["type"] == "Ready"), {})
    return {"Ready": ready.get("status"), "reason": ready.get("reason"),
            "operatingMode": obj["spec"].get("operatingMode")}  # fmt: skip


def pod_of(e: Env, sandbox_name: str) -> client.V1Pod | None:
    for pod in e.core.list_namespaced_pod(e.ns, _request_timeout=10).items:
        if any(
            o.kind == "Sandbox" and o.name == sandbox_name
            for o in pod.metadata.owner_references or ()
        ):
            return pod
    return None


def alive(e: Env, sandbox_name: str, timeout: float = 90) -> dict[str, Any]:
    pod = wait_for(
        lambda: pod_of(e, sandbox_name), timeout=30, what=f"pod of Sandbox {sandbox_name}"
    )
    return e.wait_state(pod.metadata.name, "Alive", timeout=timeout)


def record(case: str, e: Env, sandbox_name: str, verdict: dict[str, Any]) -> None:
    s = verdict["status"]
    SIDE_BY_SIDE[case] = {
        "agent-sandbox": sandbox_status(e, sandbox_name),
        "deathwatch": {k: s.get(k) for k in ("state", "cause", "exitCode", "reason")}
        | {"sandbox": s.get("sandbox")},
    }


def test_a_death_under_a_live_sandbox_is_dead_with_its_evidence(aenv: Env) -> None:
    e = aenv
    # a pod no Sandbox owns is not judged by this DeathWatch, whatever its labels: it runs
    # first, so the deaths below (later events in the same stream) prove it was passed over
    body = agentpods.agent_pod("loose", ctl_of(e, "loose"), node=NODE_NAME)
    e.core.create_namespaced_pod(e.ns, body, _request_timeout=30)
    wait_for(lambda: e.core.read_namespaced_pod("loose", e.ns, _request_timeout=10).status.phase
             == "Running", timeout=60, what="loose pod running")  # fmt: skip
    sandbox(e, "killed", pod_spec(e, "killed"))
    sandbox(e, "hungry", pod_spec(e, "hungry", memory="24Mi"))
    pods = {}
    for name in ("killed", "hungry"):
        v = alive(e, name)
        assert v["status"]["sandbox"] == {"name": name}
        assert v["metadata"]["labels"]["deathwatch.dev/sandbox"] == name
        pods[name] = v["metadata"]["name"]
    (ctl_of(e, "killed") / "exit").write_text("3")
    (ctl_of(e, "hungry") / "oom").write_text("")
    dead = e.wait_state(pods["killed"], "Dead", timeout=30)
    assert (dead["status"]["cause"], dead["status"]["exitCode"]) == ("ContainerExited", 3)
    record("container exits 3", e, "killed", dead)
    oom = e.wait_state(pods["hungry"], "Dead", timeout=30)
    # gVisor: the host's OOM killer takes the sandbox, its container's status unread (128)
    assert (oom["status"]["cause"], oom["status"]["reason"], oom["status"]["exitCode"]) == (
        "OOMKilled", "OOMKilled", 128)  # fmt: skip
    record("OOM-killed", e, "hungry", oom)
    assert e.sv("loose") is None
    # the verdicts of one Sandbox, by label
    listed = e.custom.list_namespaced_custom_object(
        "deathwatch.dev", "v1alpha1", e.ns, "sandboxverdicts",
        label_selector="deathwatch.dev/sandbox=killed", _request_timeout=10,
    )["items"]  # fmt: skip
    assert [v["metadata"]["name"] for v in listed] == [pods["killed"]]


def test_suspended_expired_and_deleted_sandboxes_are_gone_with_that_cause(aenv: Env) -> None:
    e = aenv
    expires = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=40)
    sandbox(e, "paused", pod_spec(e, "paused"))
    sandbox(e, "timed", pod_spec(e, "timed"), shutdownTime=format_time(expires))
    sandbox(e, "removed", pod_spec(e, "removed"))
    first = alive(e, "paused")
    pods = {name: alive(e, name)["metadata"]["name"] for name in ("timed", "removed")}

    e.custom.patch_namespaced_custom_object(*CORE, e.ns, "sandboxes", "paused",
                                            {"spec": {"operatingMode": "Suspended"}}, _request_timeout=30)  # fmt: skip
    gone = e.wait_state(first["metadata"]["name"], "Gone", timeout=60)
    assert gone["status"]["cause"] == "Suspended"
    wait_for(lambda: pod_of(e, "paused") is None, timeout=60, what="suspended: its pod deleted")
    record("suspended", e, "paused", gone)

    e.custom.delete_namespaced_custom_object(
        *CORE, e.ns, "sandboxes", "removed", _request_timeout=30
    )
    deleted = e.wait_state(pods["removed"], "Gone", timeout=60)
    assert deleted["status"]["cause"] == "Deleted"
    record("Sandbox deleted", e, "removed", deleted)

    expired = e.wait_state(pods["timed"], "Gone", timeout=90)
    assert expired["status"]["cause"] == "Expired"
    record("shutdownTime reached", e, "timed", expired)

    # resumed: a new pod, with a verdict of its own (a new pod uid), Alive
    e.custom.patch_namespaced_custom_object(*CORE, e.ns, "sandboxes", "paused",
                                            {"spec": {"operatingMode": "Running"}}, _request_timeout=30)  # fmt: skip
    resumed = wait_for(
        lambda: (v := e.sv(first["metadata"]["name"])) and v.get("status", {}).get("state") == "Alive"
        and v["status"]["podUID"] != first["status"]["podUID"] and v,
        timeout=90, what="the resumed Sandbox's new pod Alive",
    )  # fmt: skip
    record("resumed", e, "paused", resumed)
    # a Sandbox outlives its pods: waiting on it follows the current one
    waited = cli(e, "wait", "--sandbox", "paused", "-n", e.ns, "--for", "alive", "--timeout", "10s")
    assert waited.returncode == 0, waited
    expired_wait = cli(
        e, "wait", "--sandbox", "timed", "-n", e.ns, "--for", "alive", "--timeout", "10s"
    )
    assert expired_wait.returncode == 1 and "Expired" in expired_wait.stderr, expired_wait


def test_a_warm_pool_sandbox_claimed_keeps_its_verdict_and_gains_the_claim(aenv: Env) -> None:
    e = aenv
    create(e, EXT, "sandboxtemplates", "SandboxTemplate", "agent",
           {"podTemplate": {"spec": pod_spec(e, "pool", per_pod=True)},
            "networkPolicyManagement": "Unmanaged"})  # fmt: skip
    create(e, EXT, "sandboxwarmpools", "SandboxWarmPool", "warm",
           {"replicas": 1, "sandboxTemplateRef": {"name": "agent"}})  # fmt: skip

    def warm_sandbox() -> str | None:
        """The pool's one Sandbox once it has settled: agent-sandbox v1.0.3 may make two at
        first and delete one (seen in CI: the first listed was the one it deleted)."""
        items = e.custom.list_namespaced_custom_object(
            *CORE, e.ns, "sandboxes", _request_timeout=10
        )["items"]
        kept = [s["metadata"]["name"] for s in items if not s["metadata"].get("deletionTimestamp")]
        return kept[0] if len(kept) == 1 and len(items) == 1 else None

    def warm_alive() -> tuple[str, dict[str, Any]] | None:
        """Its verdict Alive, and the pool still its one Sandbox after: the one listed alone
        may be the one it is about to delete (seen in CI: that pod was judged Gone Deleted,
        rightly, while the test waited for it to live)."""
        name = warm_sandbox()
        pod = pod_of(e, name) if name else None
        if name is None or pod is None or pod.metadata.deletion_timestamp:
            return None
        verdict = e.sv(pod.metadata.name)
        # created before its status is written: a verdict without one yet is not Alive yet
        if verdict is None or (verdict.get("status") or {}).get("state") != "Alive":
            return None
        return (name, verdict) if warm_sandbox() == name else None

    name, warm = wait_for(warm_alive, timeout=90, what="the warm pool's one Sandbox, Alive")
    assert warm["status"]["sandbox"] == {"name": name, "template": "agent", "warmPool": "warm"}
    SIDE_BY_SIDE["warm, unclaimed"] = {"agent-sandbox": sandbox_status(e, name),
                                       "deathwatch": {"state": "Alive", "sandbox": warm["status"]["sandbox"]}}  # fmt: skip
    pod = warm["metadata"]["name"]
    create(e, EXT, "sandboxclaims", "SandboxClaim", "alice", {"warmPoolRef": {"name": "warm"}})
    claimed = wait_for(
        lambda: (v := e.sv(pod)) and v["status"].get("sandbox", {}).get("claim") == "alice" and v,
        timeout=60, what="the verdict naming the claim",
    )  # fmt: skip
    assert claimed["status"]["podUID"] == warm["status"]["podUID"]  # one pod, one verdict
    assert claimed["metadata"]["uid"] == warm["metadata"]["uid"]
    assert claimed["status"]["sandbox"] == {"name": name, "claim": "alice", "template": "agent",
                                            "warmPool": "warm"}  # fmt: skip
    assert claimed["status"]["state"] == "Alive"
    record("claimed from the warm pool", e, name, claimed)
    explained = cli(e, "explain", "--sandbox", name, "-n", e.ns, "-o", "json")
    assert explained.returncode == 0, explained.stderr
    assert json.loads(explained.stdout)["sandbox"]["claim"] == "alice"
    (ctl_of(e, "pool", pod) / "exit").write_text("3")
    waited = cli(e, "wait", "--sandbox", name, "-n", e.ns, "--for", "dead", "--timeout", "30s")
    assert (waited.returncode, waited.stdout) == (0, f"{e.ns}/{pod} Dead (ContainerExited)\n"), (
        waited
    )
    dead = e.wait_state(pod, "Dead", timeout=30)
    assert dead["status"]["cause"] == "ContainerExited"
    assert dead["status"]["sandbox"]["claim"] == "alice"
    record("claimed, then exits 3", e, name, dead)
    rows = e.cp.kubectl_run("get", "sv", "-n", e.ns, "-o", "wide").stdout
    assert "alice" in rows and name in rows, rows


def test_on_the_charts_defaults_a_sandboxs_pod_is_guarded_with_no_label_of_ours(
    nenv: Env, agent_sandbox: agentsandbox.AgentSandboxController,
    control_plane: controlplane.ControlPlane, exits_token: Path, tmp_path: Path,
) -> None:  # fmt: skip
    """One definition of a sandbox (#59, ADR 0037): with the chart's defaults (no
    `firewall.sandboxSelector`, no controller id) the node's agent guards exactly the pods
    the DeathWatch selects, here agent-sandbox's by its ownerReference and label, which carry
    no label of ours. Measured from the host and from outside the pod network: the Sandbox's
    pod is refused on its agent port and says Shielded=True; a pod no Sandbox owns, with the
    same program, is no sandbox and stays reachable from outside."""
    values = yaml.safe_load((ROOT / "charts/deathwatch/values.yaml").read_text())
    assert (values["firewall"]["sandboxSelector"], values["controller"]["controllerId"]) == ("", "")
    e = nenv
    e.start_controller(extra=["--firewall-daemonset", "deathwatch-system/deathwatch-firewall",
                              "--coverage-interval", "0.5"])  # fmt: skip
    e.deathwatch(podSelector={}, sandboxes="agent-sandbox")
    body = agentpods.agent_pod("loose", ctl_of(e, "loose"), node=NODE_NAME,
                               runtime_class=GVISOR_RUNTIME_CLASS)  # fmt: skip
    e.core.create_namespaced_pod(e.ns, body, _request_timeout=30)
    sandbox(e, "guarded", pod_spec(e, "guarded"))
    pod = alive(e, "guarded")["metadata"]["name"]
    assert e.sv("loose") is None  # not selected: no verdict, and (below) not guarded

    def ip_of(name: str) -> str:
        ip: str | None = e.core.read_namespaced_pod(name, e.ns, _request_timeout=10).status.pod_ip
        return ip or ""

    ip, loose = wait_for(lambda: (ip_of(pod), ip_of("loose")) if ip_of("loose") else None,
                         timeout=60, what="both pods addressed")  # fmt: skip
    with outside() as ns:
        wait_for(lambda: connect_from(ns, loose, AGENT_PORT) == "connected", timeout=60,
                 what="the loose pod's agent listening")  # fmt: skip
        assert connect_from(ns, ip, AGENT_PORT) == "connected"  # the hole, before the firewall
        agent = FirewallAgent(tmp_path, POD_SUBNET, AGENT_PORT, (control_plane, exits_token))
        agent.up()
        try:
            wait_for(lambda: connect_from(ns, ip, AGENT_PORT) != "connected", timeout=20,
                     what="the Sandbox's pod in the inbound rule's set")  # fmt: skip
            shielded(e, pod, ("True", "RuleInForce"))
            assert connect(ip, AGENT_PORT) == "refused"  # the host: the output rule
            refused = [connect_from(ns, ip, AGENT_PORT) for _ in range(10)]
            assert "connected" not in refused, refused
            # the same program in a pod no DeathWatch selects: not a sandbox, not guarded
            assert connect_from(ns, loose, AGENT_PORT) == "connected"
            lease = client.CoordinationV1Api(e.core.api_client).read_namespaced_lease(
                f"deathwatch-firewall.{NODE_NAME}", "deathwatch-system", _request_timeout=10
            )
            notes = lease.metadata.annotations
            assert notes["deathwatch.dev/sandboxes-from"] == "deathwatches"
            assert ip in notes["deathwatch.dev/guarded"].split(",")
            assert loose not in notes["deathwatch.dev/guarded"].split(",")
        finally:
            agent.down()
            print(f"--- firewall agent:\n{agent.log.read_text()[-3000:]}")
        shielded(e, pod, ("False", None))  # the agent and its table gone: never True
    # its coverage Lease goes too: the node lane's control plane is shared, and the next
    # module's first claim is that its node has no agent at all (NoAgent, not AgentStale)
    client.CoordinationV1Api(e.core.api_client).delete_namespaced_lease(
        f"deathwatch-firewall.{NODE_NAME}", "deathwatch-system", _request_timeout=10
    )
