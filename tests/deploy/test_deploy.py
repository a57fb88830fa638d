"""Deploy lane: deathwatch installed the way a cluster operator does, on this machine.

Both images are built from the project's Dockerfiles (buildah, no engine, no registry) and
imported into the node's containerd; `kubectl apply -k manifests/overlays/local-node` (the
base with only image names and the pod range changed) on a cluster of kube-apiserver,
kube-controller-manager, kube-scheduler, a kubelet + containerd node and kube-proxy in
nftables mode (hack/localcluster/cluster.py). Sandboxes are real busybox pods listening on
the agent port. Measurements are printed at the end ("deploy lane measurements").
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from prometheus_client.parser import text_string_to_metric_families

from deathwatch.firewall.config import parse_config
from deathwatch.firewall.nft import SystemNft
from deathwatch.firewall.ruleset import desired
from hack.localcluster import cluster
from hack.localcluster.agentpods import AGENT_PORT, EXEC_PROBE, OTHER_PORT, agent_pod
from hack.localcluster.controller_process import metrics_reader_token
from hack.localcluster.netns_tool import connect_once
from hack.localcluster.node import POD_SUBNET
from hack.localcluster.registry import Registry
from hack.localcluster.registry import missing as registry_missing
from tests.conftest import _binaries_or_skip
from tests.kube import wait_for

pytestmark = pytest.mark.deploy
ROOT = Path(__file__).resolve().parents[2]
RESULTS: dict[str, Any] = {}
NS, SYSTEM = "sandboxes", "deathwatch-system"


@dataclass
class Deployed:
    c: cluster.Cluster
    api: client.ApiClient
    reader: str  # a token of a ServiceAccount bound to deathwatch-metrics-reader

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def pod(self, name: str, *, host_network: bool = False, target: str | None = None,
            probe: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> str:  # fmt: skip
        """A busybox agent pod placed by the scheduler: a sandbox listening on the agent
        port, or with `target` a client of it (hack/localcluster/agentpods.py)."""
        body = agent_pod(name, self.ctl(name), probe=probe, target=target,
                         host_network=host_network, labels=labels)  # fmt: skip
        self.core.create_namespaced_pod(NS, body, _request_timeout=30)
        return name

    def ctl(self, name: str) -> Path:
        return self.c.node.ctl(f"{NS}-{name}")

    def ip(self, name: str) -> str:
        def running() -> str | None:
            pod = self.core.read_namespaced_pod(name, NS, _request_timeout=10)
            return (
                str(pod.status.pod_ip)
                if pod.status.phase == "Running" and pod.status.pod_ip
                else None
            )

        return wait_for(running, timeout=60, what=f"pod {name} running")

    def result(self, name: str) -> str:
        """What a client pod's last connection attempt gave: connected, refused, failed."""
        path = self.ctl(name) / "result"

        def written() -> str | None:
            return path.read_text().strip() or None if path.exists() else None

        return wait_for(written, timeout=30, what=f"{name}'s result")

    def sv(self, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
                "deathwatch.dev", "v1alpha1", NS, "sandboxverdicts", name, _request_timeout=10)  # fmt: skip
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def wait_state(self, name: str, state: str, timeout: float = 60) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            sv = self.sv(name)
            return sv["status"] if sv and sv.get("status", {}).get("state") == state else None

        try:
            return wait_for(probe, timeout=timeout, what=f"{name} {state}")
        except AssertionError:
            print(self.c.diagnose())
            raise

    def events(self, pod: str, reason: str) -> int:
        selector = f"involvedObject.name={pod},reason={reason}"
        return len(
            self.core.list_namespaced_event(NS, field_selector=selector, _request_timeout=10).items
        )

    def lease_holder(self) -> str | None:
        lease = client.CoordinationV1Api(self.api).read_namespaced_lease(
            "deathwatch-controller", SYSTEM, _request_timeout=10
        )
        return lease.spec.holder_identity  # type: ignore[no-any-return]

    def controller_pods(self) -> dict[str, Any]:
        pods = self.core.list_namespaced_pod(
            SYSTEM, label_selector="app.kubernetes.io/component=controller", _request_timeout=10
        ).items
        return {p.metadata.name: p for p in pods if p.metadata.deletion_timestamp is None}

    def controller_metric(self, name: str, **labels: str) -> float:
        """From /metrics through the controller's Service ClusterIP (kube-proxy's DNAT)."""
        svc = self.core.read_namespaced_service(
            "deathwatch-controller-metrics", SYSTEM, _request_timeout=10
        )
        return _metric(f"https://{svc.spec.cluster_ip}:8443/metrics", self.reader, name, **labels)


def _metric(url: str, token: str, name: str, **labels: str) -> float:
    """A sample's sum, scraped as Prometheus does: HTTPS (the self-signed certificate
    unverified), a reader's bearer token."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=10, context=context) as r:  # noqa: S310
        text = r.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and labels.items() <= s.labels.items())  # fmt: skip


@pytest.fixture(scope="module")
def deployed() -> Iterator[Deployed]:
    reason = cluster.available()
    if reason:
        pytest.skip(reason)
    _binaries_or_skip("kubelet", "kube-scheduler", "kube-proxy")
    started = time.monotonic()
    with cluster.running() as c:
        RESULTS["cluster_up_seconds"] = round(time.monotonic() - started, 1)
        RESULTS["images"] = {
            d: {"mb_unpacked": round(i.bytes_uncompressed / 1e6), "mb_archive": round(i.bytes_archive / 1e6)}
            for d, i in c.images.items()
        }  # fmt: skip
        RESULTS["firewall_image_python_packages"] = c.images["firewall"].python_packages
        c.kubectl("apply", "--server-side", "-k", str(cluster.OVERLAY))
        RESULTS["rollout_seconds"] = round(cluster.wait_rollouts(c), 1)
        configuration = client.Configuration()
        config.load_kube_config(
            config_file=str(c.cp.kubeconfig), client_configuration=configuration
        )
        api = client.ApiClient(configuration)
        c.kubectl("create", "namespace", NS)
        # the sandboxes mount their control directory from the host: not baseline's
        c.kubectl("label", "namespace", NS, "pod-security.kubernetes.io/enforce=privileged")
        core = client.CoreV1Api(api)
        wait_for(lambda: core.read_namespaced_service_account("default", NS, _request_timeout=10),
                 what="default ServiceAccount", ignore=(client.ApiException,))  # fmt: skip
        c.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "deathwatch.dev/v1alpha1", "kind": "DeathWatch",
            "metadata": {"name": "sandboxes", "namespace": NS},
            "spec": {"podSelector": {"matchLabels": {"app": "sandbox"}}, "agentPorts": [AGENT_PORT],
                     "execProbe": {"windowMultiplier": 1}},
        }))  # fmt: skip
        try:
            yield Deployed(c, api, metrics_reader_token(api))
        finally:
            api.close()
            print("\ndeploy lane measurements:", json.dumps(RESULTS, indent=1))


def test_the_firewall_is_ready_once_its_rule_is_in_force_and_shuts_the_host_out(
    deployed: Deployed,
) -> None:
    d = deployed
    configmap = d.core.read_namespaced_config_map(
        "deathwatch-firewall", SYSTEM, _request_timeout=10
    )
    import yaml

    # the node's pod range (10.88.0.0/24), learned from its Node object (podCIDRs is left at
    # its default, empty), and its host addresses there (.0, and .1 the bridge's gateway),
    # which are not pod sources (ADR 0012)
    config = parse_config(yaml.safe_load(configmap.data["config.yaml"]))
    assert config.pod_cidrs == ()
    hosts = [ipaddress.ip_address("10.88.0.0"), ipaddress.ip_address("10.88.0.1")]
    want = desired(config.with_pod_ranges((ipaddress.ip_network(POD_SUBNET),)), hosts=hosts)
    # the DaemonSet rolled out: its pod is Ready, which its probe (`deathwatch-firewall
    # check`) allows only while the live table is exactly the configured one
    assert SystemNft().list_table() == want
    sandbox = d.ip(d.pod("sbx-fw"))
    assert connect_once(sandbox, AGENT_PORT, 2)[0] == "refused"  # the host: refused at once
    assert connect_once(sandbox, OTHER_PORT, 2)[0] in ("connected", "refused")  # not ours to judge
    d.pod("hostnet-client", host_network=True, target=f"{sandbox}:{AGENT_PORT}", labels={})
    d.pod("pod-client", target=f"{sandbox}:{AGENT_PORT}", labels={})
    # through a Service ClusterIP: kube-proxy's nftables DNAT, then our output hook
    d.core.create_namespaced_service(NS, {
        "metadata": {"name": "agent"},
        "spec": {"selector": {"app": "sandbox", "fw": "yes"}, "ports": [{"port": AGENT_PORT, "targetPort": AGENT_PORT}]},
    }, _request_timeout=10)  # fmt: skip
    d.core.patch_namespaced_pod(
        "sbx-fw", NS, {"metadata": {"labels": {"fw": "yes"}}}, _request_timeout=10
    )
    cluster_ip = d.core.read_namespaced_service("agent", NS, _request_timeout=10).spec.cluster_ip
    d.pod("svc-client", target=f"{cluster_ip}:{AGENT_PORT}", labels={})
    wait_for(lambda: connect_once(cluster_ip, AGENT_PORT, 2)[0] == "refused", timeout=30,
             what="the Service programmed, and the host refused through it")  # fmt: skip
    outcomes = {
        "hostNetwork pod -> sandbox agent port": d.result("hostnet-client"),
        "ordinary pod -> sandbox agent port": d.result("pod-client"),
        "ordinary pod -> Service ClusterIP -> agent port": wait_for(
            lambda: d.result("svc-client") == "connected" and "connected", timeout=30, what="svc"),
        "host -> Service ClusterIP -> agent port": connect_once(cluster_ip, AGENT_PORT, 2)[0],
    }  # fmt: skip
    RESULTS["firewall_outcomes"] = outcomes
    assert outcomes == {
        "hostNetwork pod -> sandbox agent port": "refused",
        "ordinary pod -> sandbox agent port": "connected",
        "ordinary pod -> Service ClusterIP -> agent port": "connected",
        "host -> Service ClusterIP -> agent port": "refused",
    }


def test_the_controller_pod_judges_real_deaths_under_its_own_account(deployed: Deployed) -> None:
    d = deployed
    killed, oom, hung, deleted, lives = (
        d.pod("killed"), d.pod("oom"), d.pod("hung", probe=EXEC_PROBE), d.pod("deleted"), d.pod("lives"),
    )  # fmt: skip
    for name in (killed, oom, hung, deleted, lives):
        d.wait_state(name, "Alive")
    (d.ctl(killed) / "exit").write_text("3")
    (d.ctl(oom) / "oom").write_text("")
    (d.ctl(hung) / "unready").write_text("")
    d.core.delete_namespaced_pod(deleted, NS, _request_timeout=10)
    dead = d.wait_state(killed, "Dead")
    assert (dead["cause"], dead["exitCode"]) == ("ContainerExited", 3)
    assert d.wait_state(oom, "Dead")["cause"] == "OOMKilled"
    assert d.wait_state(hung, "Dead", timeout=30)["cause"] == "Unresponsive"
    assert d.wait_state(deleted, "Gone")["cause"] == "Deleted"
    assert d.wait_state(lives, "Alive")
    for name in (killed, oom, hung):
        wait_for(functools.partial(lambda n: d.events(n, "SandboxDead") == 1, name),
                 what=f"{name}'s SandboxDead")  # fmt: skip

    # FIREWALL column: coverage, read from the DaemonSet every probe interval (15 s); the
    # agent may have turned Ready after the controller's first read
    def coverage() -> str:
        return str(d.c.kubectl("get", "dw", "-n", NS).stdout.splitlines()[1].split()[6])

    wait_for(lambda: coverage() == "1/1", timeout=25, what="FIREWALL 1/1 in kubectl get dw")

    # and per sandbox: the agent's coverage Lease for this node, joined with the verdict
    def shielded(name: str) -> str | None:
        sv = d.custom.get_namespaced_custom_object("deathwatch.dev", "v1alpha1", NS, "sandboxverdicts", name,
                                                   _request_timeout=10)  # fmt: skip
        found = [c for c in sv.get("status", {}).get("conditions", []) if c["type"] == "Shielded"]
        return f"{found[0]['status']}/{found[0]['reason']}" if found else None

    wait_for(lambda: shielded(lives) == "True/RuleInForce", timeout=25, what="lives Shielded")
    RESULTS["shielded"] = shielded(lives)
    RESULTS["kubectl_get_dw"] = d.c.kubectl("get", "dw", "-n", NS).stdout.splitlines()
    # under its ServiceAccount and the shipped RBAC: never refused (read via its Service)
    assert d.controller_metric("deathwatch_api_errors_total", code="403") == 0
    wait_for(lambda: d.controller_metric("deathwatch_verdicts_total", state="Dead") >= 3,
             what="three deaths counted")  # fmt: skip


def test_a_firewall_rollout_never_opens_the_hole(deployed: Deployed) -> None:
    d = deployed
    sandbox = d.ip(d.pod("sbx-rollout"))
    stop, outcomes = threading.Event(), {"connected": 0, "refused": 0, "other": 0}

    def probe() -> None:
        while not stop.is_set():
            outcome, _ = connect_once(sandbox, AGENT_PORT, 0.5)
            outcomes[outcome if outcome in outcomes else "other"] += 1
            time.sleep(0.002)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    old = d.c.kubectl("get", "pods", "-n", SYSTEM, "-l", "app.kubernetes.io/component=firewall",
                      "-o", "jsonpath={.items[*].metadata.uid}").stdout  # fmt: skip
    started = time.monotonic()
    d.c.kubectl("rollout", "restart", "-n", SYSTEM, "daemonset/deathwatch-firewall")
    d.c.kubectl("rollout", "status", "-n", SYSTEM, "daemonset/deathwatch-firewall", "--timeout=120s",
                timeout=150)  # fmt: skip
    took = time.monotonic() - started
    time.sleep(1)  # and a moment past the new pod's readiness
    stop.set()
    prober.join(5)
    new = d.c.kubectl("get", "pods", "-n", SYSTEM, "-l", "app.kubernetes.io/component=firewall",
                      "-o", "jsonpath={.items[*].metadata.uid}").stdout  # fmt: skip
    RESULTS["firewall_rollout"] = {"seconds": round(took, 1), "attempts": sum(outcomes.values()),
                                   "connected": outcomes["connected"], **outcomes}  # fmt: skip
    assert new != old  # the pod really was replaced
    assert outcomes["connected"] == 0, outcomes
    assert outcomes["refused"] > 100, outcomes


def test_two_replicas_one_leader_and_a_warm_standby(deployed: Deployed) -> None:
    d = deployed

    def two() -> dict[str, Any] | None:
        pods = d.controller_pods()
        return pods if len(pods) == 2 else None

    pods = wait_for(two, what="two controller pods")
    holder = wait_for(d.lease_holder, what="a Lease holder")
    assert holder in pods
    dw = d.custom.get_namespaced_custom_object(
        "deathwatch.dev", "v1alpha1", NS, "deathwatches", "sandboxes", _request_timeout=10)  # fmt: skip
    wait_for(lambda: d.custom.get_namespaced_custom_object(
        "deathwatch.dev", "v1alpha1", NS, "deathwatches", "sandboxes", _request_timeout=10,
    ).get("status", {}).get("leader") == holder, what="DeathWatch status names the leader")  # fmt: skip
    leading = {name: _metric(f"https://{p.status.pod_ip}:8443/metrics", d.reader, "deathwatch_leader")
               for name, p in pods.items()}  # fmt: skip
    assert leading == {n: float(n == holder) for n in pods}, leading
    RESULTS["controller_replicas"] = {"pods": sorted(pods), "leader": holder,
                                      "dw_generation": dw["metadata"]["generation"]}  # fmt: skip


def test_a_death_during_a_controller_rollout_gets_one_verdict_and_one_event(
    deployed: Deployed,
) -> None:
    d = deployed
    victim = d.pod("dies-in-the-gap")
    d.wait_state(victim, "Alive")
    before = set(d.controller_pods())
    leader_before = d.lease_holder()
    d.c.kubectl("rollout", "restart", "-n", SYSTEM, "deployment/deathwatch-controller")
    # dies as the first old pod goes (maxSurge 1: a new one is Ready first)
    wait_for(lambda: len(set(d.controller_pods()) - before) >= 1, timeout=90,
             what="a new controller pod")  # fmt: skip
    (d.ctl(victim) / "exit").write_text("7")
    died = time.monotonic()
    dead = d.wait_state(victim, "Dead", timeout=90)
    latency = time.monotonic() - died
    d.c.kubectl("rollout", "status", "-n", SYSTEM, "deployment/deathwatch-controller",
                "--timeout=120s", timeout=150)  # fmt: skip
    assert (dead["cause"], dead["exitCode"]) == ("ContainerExited", 7)
    wait_for(lambda: d.events(victim, "SandboxDead") == 1, what="one SandboxDead")
    after = set(d.controller_pods())
    leader_after = wait_for(lambda: (h := d.lease_holder()) in after and h, timeout=60,
                            what="a new pod holds the Lease")  # fmt: skip
    assert not before & after
    assert d.events(victim, "SandboxDead") == 1
    RESULTS["death_during_controller_rollout"] = {
        "verdict": dead["state"], "cause": dead["cause"], "exit_code": dead["exitCode"],
        "sandbox_dead_events": d.events(victim, "SandboxDead"),
        "seconds_from_death_to_verdict": round(latency, 2),
        "leader_before": leader_before, "leader_after": leader_after,
    }  # fmt: skip


def test_the_leader_killed_outright_loses_no_death(deployed: Deployed) -> None:
    """SIGKILL to the leader's container (an OOM kill): no release. Whoever gets the Lease
    next (the standby once it expires, or the restarted container under the same identity)
    writes the verdict, once."""
    d = deployed
    victim = d.pod("dies-with-the-leader")
    d.wait_state(victim, "Alive")
    holder = wait_for(d.lease_holder, what="a Lease holder")
    container = d.controller_pods()[holder].status.container_statuses[0].container_id
    d.c.node.ctr("tasks", "kill", "-s", "SIGKILL", container.split("://", 1)[1])
    (d.ctl(victim) / "exit").write_text("9")
    died = time.monotonic()
    dead = d.wait_state(victim, "Dead", timeout=90)
    latency = time.monotonic() - died
    assert (dead["cause"], dead["exitCode"]) == ("ContainerExited", 9)
    wait_for(lambda: d.events(victim, "SandboxDead") == 1, what="one SandboxDead")
    RESULTS["leader_sigkill"] = {
        "killed": holder, "new_leader": d.lease_holder(),
        "seconds_from_death_to_verdict": round(latency, 2),
        "sandbox_dead_events": d.events(victim, "SandboxDead"),
    }  # fmt: skip
    d.c.kubectl("rollout", "status", "-n", SYSTEM, "deployment/deathwatch-controller",
                "--timeout=120s", timeout=150)  # fmt: skip


def test_the_runbooks_off_switch_opens_the_node_and_uninstall_leaves_nothing(
    deployed: Deployed,
    tmp_path: Path,
) -> None:
    """Last: it removes deathwatch, on a cluster whose namespaces enforce Pod Security baseline
    unless labelled. First the runbook's "Open the firewall now", command by command, behind a
    private registry that refuses a pull without credentials (#59 item 6): the cleanup is
    manifests/overlays/private-registry/uninstall, copied and edited as its comment says (the
    registry's name for the image, the registry's credentials), and its image is nowhere on
    the node, so the kubelet pulls it with the overlay's pull secret. The DaemonSet deleted
    leaves the table (a stopping agent cannot tell an uninstall from a rollout), the cleanup
    DaemonSet removes it, the verdicts go on saying AgentStale. Then `kubectl delete -k`
    takes the rest (README "Uninstall")."""
    d = deployed
    reason = registry_missing()
    if reason:
        pytest.skip(reason)
    registry = Registry(tmp_path).start()
    try:
        image = registry.push(
            d.c.node, "deathwatch.local/firewall:dev", "deathwatch-dev/firewall:dev"
        )
        uninstall = private_registry_copy(tmp_path / "my-uninstall", registry, image)
        _off_switch(d, uninstall, registry)
    finally:
        registry.stop()


def private_registry_copy(to: Path, registry: Registry, image: str) -> Path:
    """manifests/overlays/private-registry/uninstall as an operator makes it theirs: copied,
    its path to manifests/uninstall adjusted, its image and credentials their registry's."""
    source = ROOT / "manifests" / "overlays" / "private-registry" / "uninstall"
    to.mkdir(parents=True)
    text = (source / "kustomization.yaml").read_text()
    name, _, tag = image.rpartition(":")
    edits = {
        "  - ../../../uninstall": f"  - {os.path.relpath(ROOT / 'manifests' / 'uninstall', to)}",
        "newName: registry.corp.example/mirror/deathwatch-dev/firewall": f"newName: {name}",
        f"newTag: {(ROOT / 'VERSION').read_text().strip()}  # VERSION": f"newTag: {tag}",
    }
    for was, now in edits.items():
        assert was in text, was  # the overlay as its comment describes it
        text = text.replace(was, now)
    (to / "kustomization.yaml").write_text(text)
    (to / "registry-credentials.json").write_bytes(registry.credentials())
    return to


def _off_switch(d: Deployed, uninstall: Path, registry: Registry) -> None:
    name = d.pod("sbx-uninstall")
    d.wait_state(name, "Alive")
    sandbox = d.ip(name)
    d.c.kubectl("-n", SYSTEM, "delete", "daemonset", "deathwatch-firewall", "--wait=true",
                timeout=120)  # fmt: skip
    assert SystemNft().list_table() is not None  # still shut: on purpose, and documented
    assert connect_once(sandbox, AGENT_PORT, 2)[0] == "refused"
    pulled_before = registry.served("deathwatch-dev/firewall")
    d.c.kubectl("apply", "-k", str(uninstall))
    d.c.kubectl("rollout", "status", "-n", "deathwatch-uninstall",
                "daemonset/deathwatch-firewall-cleanup", "--timeout=5m", timeout=330)  # fmt: skip
    assert SystemNft().list_table() is None
    assert connect_once(sandbox, AGENT_PORT, 2)[0] == "connected"
    # pulled from the registry, with the overlay's secret (asked first without: refused)
    assert registry.served("deathwatch-dev/firewall") > pulled_before and registry.refused() > 0
    d.c.kubectl("delete", "-k", str(uninstall), "--wait=true", timeout=300)

    def shield() -> str | None:
        sv = d.custom.get_namespaced_custom_object("deathwatch.dev", "v1alpha1", NS,
                                                   "sandboxverdicts", name, _request_timeout=10)  # fmt: skip
        found = [c["reason"] for c in sv.get("status", {}).get("conditions", [])
                 if c["type"] == "Shielded"]  # fmt: skip
        return found[0] if found else None

    wait_for(lambda: shield() == "AgentStale", timeout=60, what="the verdict says AgentStale")
    # the DaemonSet is gone already (step 1 of the off switch): as the runbook says
    d.c.kubectl("delete", "-k", str(cluster.OVERLAY), "--ignore-not-found", "--wait=true",
                timeout=300)  # fmt: skip
    assert d.c.kubectl("get", "pods", "-n", SYSTEM, check=False).stdout.strip() == ""
    leftovers = d.c.kubectl("get", "crd,clusterrole,clusterrolebinding", "-o", "name").stdout
    assert "deathwatch" not in leftovers, leftovers
    # nothing of the controller's left in the API: its Lease too (its Deployment owns it, #59;
    # here its namespace, which the overlay deletes, takes it as well: the Helm lane, where the
    # namespace stays, proves the ownership)
    wait_for(lambda: "deathwatch-controller" not in d.c.kubectl(
        "get", "lease", "-A", "-o", "name", check=False).stdout, timeout=60,
        what="the controller's Lease deleted with its Deployment")  # fmt: skip
