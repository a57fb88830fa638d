"""Hosts in the pod range are hosts: every node's own addresses inside the pod ranges, learned
from the Node objects as overlay CNIs publish them (Calico's tunnel annotations, Cilium's
cilium_host, flannel's .0 and a bridge gateway's .1 of each podCIDR), kept current by a list
and a watch; a node whose addresses cannot be learned is named. The watch on the real API
server: tests/apiserver/test_firewall_hosts.py."""

from __future__ import annotations

import threading
from typing import Any

from deathwatch.firewall.config import parse_config
from deathwatch.firewall.hosts import Hosts, NodeAddresses, host_addresses
from tests.fakeapi import FakeApi
from tests.kube import wait_for

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


def test_the_watch_keeps_the_nodes_and_wakes_the_agent_on_changes_only() -> None:
    stop, wakes = threading.Event(), []
    api = FakeApi()
    api.add("nodes", "", node("a", ["10.244.1.0/24"]))
    api.streams["/api/v1/nodes"] = [[
        {"type": "MODIFIED", "object": {**node("a", ["10.244.1.0/24"]), "status": {"heartbeat": 1}}},
        {"type": "ADDED", "object": {**node("b", ["10.244.2.0/24"]), "metadata": {"name": "b", "resourceVersion": "12"}}},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "13"}}},
        {"type": "DELETED", "object": node("a")},
    ]]  # fmt: skip
    watch = NodeAddresses(api.agent(), lambda: wakes.append(1), lambda: None, stop)
    assert watch.snapshot() is None
    watch.start()
    wait_for(
        lambda: any("resourceVersion=13" in path for _, path in api.requests), what="resumed at 13"
    )
    stop.set()
    snapshot = watch.snapshot()
    assert snapshot is not None and [n["metadata"]["name"] for n in snapshot] == ["b"]
    assert len(wakes) == 3  # listed, b added, a deleted: a's heartbeat changed nothing kept


def test_a_label_change_seen_by_the_watch_is_kept_and_wakes_the_agent() -> None:
    """enforceNodeSelector reads the node's labels from this watch: a watch that kept only
    addresses never let a labelled node enforce (the Helm lane found it)."""
    stop, wakes = threading.Event(), []
    api = FakeApi()
    api.add("nodes", "", node("a", ["10.244.1.0/24"]))
    labelled = node("a", ["10.244.1.0/24"])
    labelled["metadata"] = {**labelled["metadata"], "labels": {"tier": "enforce"},
                            "resourceVersion": "12"}  # fmt: skip
    api.streams["/api/v1/nodes"] = [[
        {"type": "MODIFIED", "object": labelled},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "13"}}},
    ]]  # fmt: skip
    watch = NodeAddresses(api.agent(), lambda: wakes.append(1), lambda: None, stop)
    watch.start()
    wait_for(
        lambda: any("resourceVersion=13" in path for _, path in api.requests), what="resumed at 13"
    )
    stop.set()
    snapshot = watch.snapshot()
    assert snapshot is not None and snapshot[0]["metadata"]["labels"] == {"tier": "enforce"}
    assert len(wakes) == 2  # listed, then labelled
