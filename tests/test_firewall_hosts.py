"""Hosts in the pod range are hosts: every node's own addresses inside the pod ranges, learned
from the Node objects as overlay CNIs publish them (Calico's tunnel annotations, Cilium's
cilium_host, flannel's .0 and a bridge gateway's .1 of each podCIDR), kept current by a list
and a watch; a node whose addresses cannot be learned is named. The last test runs the watch
on the real API server under the agent's own ServiceAccount and shipped RBAC."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from deathwatch.firewall.config import parse_config
from deathwatch.firewall.hosts import Hosts, NodeAddresses, host_addresses
from deathwatch.firewall.kubeapi import ApiError, KubeApi
from hack.localcluster import controlplane
from hack.localcluster.controller_process import service_account_token
from tests.kube import wait_for

ROOT = Path(__file__).resolve().parent.parent
CONFIG = parse_config({"podCIDRs": ["10.244.0.0/16", "fd00:10:244::/56"], "agentPorts": [49983]})


def node(name: str, cidrs: list[str] | None = None, **notes: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": notes},
        "spec": {"podCIDRs": cidrs} if cidrs else {},
    }


def test_each_cnis_host_addresses_are_learned() -> None:
    nodes = [
        # flannel VXLAN: flannel.1 takes the .0 of the podCIDR, cni0 the .1
        node("flannel", ["10.244.1.0/24", "fd00:10:244:1::/64"]),
        # Calico (own IPAM, no podCIDR): the tunnel addresses, WireGuard written with a prefix
        node("calico", None, **{"projectcalico.org/IPv4IPIPTunnelAddr": "10.244.7.64",
                                "projectcalico.org/IPv4VXLANTunnelAddr": "10.244.7.65",
                                "projectcalico.org/IPv4WireguardInterfaceAddr": "10.244.7.66/32"}),
        # Cilium: cilium_host, under both the current and the older key
        node("cilium", None, **{"network.cilium.io/ipv4-cilium-host": "10.244.9.1",
                                "io.cilium.network.ipv6-cilium-host": "fd00:10:244:9::1"}),
    ]  # fmt: skip
    hosts = host_addresses(nodes, CONFIG)
    assert hosts.unknown == () and hosts.complete
    assert [str(a) for a in hosts.addresses] == [
        "10.244.1.0", "10.244.1.1", "10.244.7.64", "10.244.7.65", "10.244.7.66", "10.244.9.1",
        "fd00:10:244:1::", "fd00:10:244:1::1", "fd00:10:244:9::1",
    ]  # fmt: skip


def test_offsets_extra_addresses_and_keys_are_configurable() -> None:
    config = parse_config({
        "podCIDRs": ["10.244.0.0/16"], "agentPorts": [49983], "hostPodCIDROffsets": [3],
        "hostAddressAnnotations": ["example.com/tunnel"], "extraHostAddresses": ["10.244.200.1", "192.0.2.1"],
    })  # fmt: skip
    nodes = [node("a", ["10.244.1.0/24"], **{"projectcalico.org/IPv4IPIPTunnelAddr": "10.244.7.64"}),
             node("b", None, **{"example.com/tunnel": "10.244.8.8"})]  # fmt: skip
    hosts = host_addresses(nodes, config)
    # only the configured key counts; addresses outside the pod ranges are refused already
    assert [str(a) for a in hosts.addresses] == ["10.244.1.3", "10.244.8.8", "10.244.200.1"]


def test_a_node_nothing_tells_of_is_named_not_assumed_covered() -> None:
    hosts = host_addresses(
        [node("ipam-elsewhere", None, unrelated="x"), node("ok", ["10.244.1.0/24"])], CONFIG
    )
    assert hosts.unknown == ("ipam-elsewhere",)
    assert not hosts.complete and not Hosts().complete  # never listed: unknown is None


class FakeApi:
    """A list and then a watch of nodes, as the API serves them."""

    def __init__(self, nodes: list[dict[str, Any]], events: list[dict[str, Any]]) -> None:
        self.nodes, self.events = nodes, events
        self.paths: list[str] = []

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        self.paths.append(path)
        return {"items": self.nodes, "metadata": {"resourceVersion": "10"}}

    def watch(self, path: str, seconds: int) -> Iterator[Mapping[str, Any]]:
        self.paths.append(path)
        if not self.events:
            raise ApiError("watch ended", 500)
        yield from self.events
        self.events = []


def test_the_watch_keeps_the_nodes_and_wakes_the_agent_on_changes_only() -> None:
    stop, wakes = threading.Event(), []
    api = FakeApi([node("a", ["10.244.1.0/24"])], [
        {"type": "MODIFIED", "object": {**node("a", ["10.244.1.0/24"]), "status": {"heartbeat": 1}}},
        {"type": "ADDED", "object": {**node("b", ["10.244.2.0/24"]), "metadata": {"name": "b", "resourceVersion": "12"}}},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "13"}}},
        {"type": "DELETED", "object": node("a")},
    ])  # fmt: skip
    watch = NodeAddresses(api, lambda: wakes.append(1), lambda: None, stop)
    assert watch.snapshot() is None
    watch.start()
    wait_for(lambda: api.paths[-1:] and "resourceVersion=13" in api.paths[-1], what="resumed at 13")
    stop.set()
    snapshot = watch.snapshot()
    assert snapshot is not None and [n["metadata"]["name"] for n in snapshot] == ["b"]
    assert len(wakes) == 3  # listed, b added, a deleted: a's heartbeat changed nothing kept


@pytest.fixture
def firewall_token(
    control_plane: controlplane.ControlPlane, api: client.ApiClient, tmp_path: Path
) -> Path:
    """The firewall agent's ServiceAccount and ClusterRole, as the chart ships them."""
    control_plane.kubectl_run("create", "namespace", "deathwatch-system", check=False)
    control_plane.kubectl_run(
        "apply", "-f", str(ROOT / "manifests" / "base" / "rbac" / "firewall.yaml")
    )
    path = tmp_path / "token"
    path.write_text(service_account_token(api, "deathwatch-system", "deathwatch-firewall"))
    return path


@pytest.mark.apiserver
def test_a_node_joining_reaches_the_agents_set_within_seconds(
    control_plane: controlplane.ControlPlane, api: client.ApiClient, firewall_token: Path
) -> None:
    core = client.CoreV1Api(api)
    kube = KubeApi(control_plane.server, firewall_token, control_plane.certs / "ca.crt")
    stop, wakes = threading.Event(), threading.Event()
    watch = NodeAddresses(kube, wakes.set, lambda: None, stop)
    watch.start()
    try:
        wait_for(lambda: watch.snapshot() is not None, timeout=20, what="nodes listed")
        name = f"joins-{id(watch) % 10**6}"
        core.create_node({"metadata": {"name": name, "annotations": {
            "projectcalico.org/IPv4VXLANTunnelAddr": "10.244.77.1"}}}, _request_timeout=10)  # fmt: skip

        def learned() -> Hosts | None:
            nodes = watch.snapshot() or []
            hosts = host_addresses(nodes, CONFIG)
            return hosts if ip_address("10.244.77.1") in hosts.addresses else None

        wait_for(learned, timeout=5, what="the new node's tunnel address")
        core.delete_node(name, _request_timeout=10)
        wait_for(lambda: ip_address("10.244.77.1") not in host_addresses(watch.snapshot() or [], CONFIG).addresses,
                 timeout=5, what="the node gone, its address with it")  # fmt: skip
        # read only: the agent may not touch a node
        with pytest.raises(ApiError) as refused:
            kube.call("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": {"x": "y"}}})
        assert refused.value.status == 403
    finally:
        stop.set()
