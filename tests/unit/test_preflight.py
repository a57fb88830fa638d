"""`deathwatch preflight`'s judgements, pure: objects in, one finding per check out. On a
real API server (its reads, RBAC, exit codes): tests/apiserver/test_preflight.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from deathwatch._preflight.checks import (
    DEATHWATCH_CRD,
    SANDBOX_CRD,
    Cluster,
    Finding,
    Level,
    findings,
)


def node(name: str, *cidrs: str) -> Mapping[str, Any]:
    return {"metadata": {"name": name}, "spec": {"podCIDRs": list(cidrs)} if cidrs else {}}


def pod(name: str, ip: str | None = None, ns: str = "team-a", labels: dict[str, str] | None = None,
        **probes: dict[str, Any]) -> Mapping[str, Any]:  # fmt: skip
    container = {"name": "c", "ports": [{"name": "agent", "containerPort": 49983}], **probes}
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}",
                         "labels": labels or {}},
            "spec": {"containers": [container]},
            "status": {"podIP": ip} if ip else {}}  # fmt: skip


def by_check(cluster: Cluster, ports: tuple[int, ...] = (49983,)) -> dict[str, Finding]:
    return {f.check: f for f in findings(cluster, ports)}


def ds(name: str, ns: str = "kube-system") -> Mapping[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}}


def test_a_kubeadm_like_cluster_reads_clean() -> None:
    cluster = Cluster(
        version={"major": "1", "minor": "35", "gitVersion": "v1.35.4"},
        nodes=[node("a", "10.244.0.0/24"), node("b", "10.244.1.0/24")],
        pods=[pod("p1", "10.244.0.5"), pod("p2", "10.244.1.9")],
        daemonsets=[ds("kube-proxy"), ds("kube-flannel-ds", "kube-flannel")],
        kube_proxy={"data": {"config.conf": "mode: nftables\n"}},
        runtime_classes=[],
        crds=set(),
    )
    found = by_check(cluster)
    assert {c: f.level for c, f in found.items()} == {
        "kubernetes": Level.OK, "pod-ranges": Level.OK, "probes": Level.OK,
        "selectors": Level.SKIP, "agent-sandbox": Level.OK, "kube-proxy": Level.OK,
        "cni": Level.OK, "runtimes": Level.OK,
    }  # fmt: skip
    assert found["runtimes"].said == (
        "no RuntimeClass: pods without a runtimeClassName run the nodes' default (runc: tested)"
    )
    assert "10.244.0.0/24, 10.244.1.0/24" in found["pod-ranges"].said
    assert "nftables" in found["kube-proxy"].said and "flannel" in found["cni"].said


def test_what_would_break_is_named_with_its_fix() -> None:
    cluster = Cluster(
        version={"major": "1", "minor": "30", "gitVersion": "v1.30.2"},
        nodes=[node("a", "10.244.0.0/24"), node("b")],
        pods=[
            pod("p1", "192.168.7.3"),  # Calico's pool: outside the nodes' ranges
            pod("ready", "10.244.0.5", readinessProbe={"tcpSocket": {"port": 49983}}),
            pod("named", "10.244.0.6", startupProbe={"httpGet": {"port": "agent"}}),
            pod("live", "10.244.0.7", livenessProbe={"grpc": {"port": 49983}}),
            pod("other", "10.244.0.8", readinessProbe={"tcpSocket": {"port": 8080}}),
            pod("exec", "10.244.0.9", readinessProbe={"exec": {"command": ["true"]}}),
        ],
        daemonsets=[ds("calico-node")],
        crds={DEATHWATCH_CRD, SANDBOX_CRD},
        deathwatches=[
            {"metadata": {"name": "all", "namespace": "team-a", "uid": "u1"}, "spec": {}},
            {
                "metadata": {"name": "bad", "namespace": "team-b", "uid": "u2"},
                "spec": {"policy": "no-such-policy"},
            },
        ],
    )
    found = by_check(cluster)
    assert found["kubernetes"].level is Level.FAIL and "1.33" in found["kubernetes"].said
    ranges = found["pod-ranges"]
    assert ranges.level is Level.WARN and "1 node(s) without spec.podCIDRs (b)" in ranges.said
    assert "team-a/p1 (192.168.7.3)" in ranges.said and "firewall.podCIDRs" in ranges.fix
    probes = found["probes"]
    assert probes.level is Level.FAIL  # a liveness probe: restarted for ever
    assert "team-a/live (livenessProbe on 49983)" in probes.said
    assert "2 more never Ready" in probes.said and "exec probes" in probes.fix
    assert found["selectors"].level is Level.FAIL
    assert "team-b/bad: spec.policy" in found["selectors"].said
    assert found["kube-proxy"].level is Level.WARN  # neither its DaemonSet nor its ConfigMap
    assert found["cni"].level is Level.WARN and "Calico: IP pools" in found["cni"].said
    only_readiness = by_check(Cluster(pods=[cluster.pods[1]] if cluster.pods else []))
    assert only_readiness["probes"].level is Level.WARN


def test_selectors_count_what_each_deathwatch_picks_and_warn_of_an_empty_one() -> None:
    pods = [pod("s1", labels={"app": "sandbox"}), pod("s2", labels={"app": "sandbox"}),
            pod("web", labels={"app": "web"})]  # fmt: skip
    picked = {"metadata": {"name": "sandboxes", "namespace": "team-a", "uid": "u"},
              "spec": {"podSelector": {"matchLabels": {"app": "sandbox"}}}}  # fmt: skip
    found = by_check(Cluster(pods=pods, crds={DEATHWATCH_CRD}, deathwatches=[picked]))
    assert found["selectors"].level is Level.OK
    assert found["selectors"].said == "pods selected: team-a/sandboxes 2 of 3"
    everything = {"metadata": {"name": "all", "namespace": "team-a", "uid": "v"}, "spec": {}}
    found = by_check(Cluster(pods=pods, crds={DEATHWATCH_CRD}, deathwatches=[everything]))
    assert found["selectors"].level is Level.WARN
    assert "team-a/all 3 of 3" in found["selectors"].said
    assert "empty podSelector selects every pod" in found["selectors"].said


def test_cilium_with_ebpf_host_routing_is_said_to_skip_the_inbound_rule() -> None:
    cilium = [ds("cilium")]
    ebpf = {"data": {"kube-proxy-replacement": "true", "enable-bpf-masquerade": "true"}}
    bypass = by_check(Cluster(daemonsets=cilium, cilium=ebpf))["cni"]
    assert bypass.level is Level.WARN and "eBPF host routing" in bypass.said
    assert "enable-host-legacy-routing" in bypass.fix
    unknown = by_check(Cluster(daemonsets=cilium))["cni"]  # its ConfigMap not there: may
    assert unknown.level is Level.WARN
    legacy = {"data": {**ebpf["data"], "enable-host-legacy-routing": "true"}}
    assert by_check(Cluster(daemonsets=cilium, cilium=legacy))["cni"].level is Level.OK
    kube_proxy = {"data": {"kube-proxy-replacement": "false"}}
    assert by_check(Cluster(daemonsets=cilium, cilium=kube_proxy))["cni"].level is Level.OK


def test_what_could_not_be_read_is_skipped_with_why() -> None:
    found = by_check(Cluster(unreadable={"nodes": "403: forbidden", "pods": "403: forbidden"}))
    assert found["pod-ranges"].level is Level.SKIP
    assert found["pod-ranges"].said == "cannot read nodes: 403: forbidden"
    assert found["probes"].level is Level.SKIP and found["kubernetes"].level is Level.SKIP
    # a DeathWatch's agentPorts count as agent ports too
    dw = {"metadata": {"name": "d", "namespace": "team-a", "uid": "u"},
          "spec": {"agentPorts": [7000]}}  # fmt: skip
    probed = pod("p", readinessProbe={"tcpSocket": {"port": 7000}})
    found = by_check(Cluster(pods=[probed], crds={DEATHWATCH_CRD}, deathwatches=[dw]))
    assert found["probes"].level is Level.WARN and "on 7000" in found["probes"].said


@pytest.mark.parametrize(
    ("minor", "level"),
    [("32", Level.FAIL), ("33", Level.OK), ("35", Level.OK), ("37", Level.OK), ("38+", Level.WARN)],
)
def test_the_releases_the_lanes_test_are_ok_older_fail_newer_warn(minor: str, level: Level) -> None:
    cluster = Cluster(version={"major": "1", "minor": minor, "gitVersion": f"v1.{minor}.0"})
    assert by_check(cluster)["kubernetes"].level is level


def runtime_class(name: str, handler: str) -> Mapping[str, Any]:
    return {"metadata": {"name": name}, "handler": handler}


def under(name: str, runtime_class: str) -> Mapping[str, Any]:
    return {**pod(name), "spec": {"containers": [], "runtimeClassName": runtime_class}}


def test_runtime_classes_are_listed_and_only_untested_ones_in_use_warn() -> None:
    proven = Cluster(
        runtime_classes=[runtime_class("gvisor", "runsc"), runtime_class("kata", "kata-qemu"),
                         runtime_class("gke-sandbox", "gvisor")],
        pods=[under("s1", "gvisor"), under("s2", "gvisor"), pod("plain")],
    )  # fmt: skip
    found = by_check(proven)["runtimes"]
    assert found.level is Level.OK, found
    assert found.said == (
        "RuntimeClasses: gke-sandbox (gvisor: gVisor, tested), gvisor (runsc: gVisor, tested, "
        "2 pod(s)), kata (kata-qemu: Kata Containers, reasoned); pods without a "
        "runtimeClassName run the nodes' default (runc: tested)"
    )
    kata = Cluster(runtime_classes=[runtime_class("kata-fc", "kata-fc"),
                                    runtime_class("wasm", "spin")],
                   pods=[under("k", "kata-fc"), under("w", "wasm"), under("x", "nowhere")])  # fmt: skip
    found = by_check(kata)["runtimes"]
    assert found.level is Level.WARN, found
    assert "kata-fc (kata-fc: Kata Containers, reasoned, 1 pod(s))" in found.said
    assert "wasm (spin: unknown, not known here, 1 pod(s))" in found.said
    assert "pods run under kata-fc, wasm, which no lane tests" in found.said
    assert "pods name RuntimeClasses that do not exist (nowhere)" in found.said
    assert "docs/compatibility.md" in found.fix


def test_runtime_classes_unreadable_are_skipped_with_why() -> None:
    found = by_check(Cluster(unreadable={"runtimeclasses": "403: forbidden"}))["runtimes"]
    assert (found.level, found.said) == (Level.SKIP, "cannot read runtimeclasses: 403: forbidden")
