"""Hosts in the pod range are hosts: every node's own addresses inside the pod ranges.

On overlay CNIs a host talks to other nodes' pods from an address of the pod pool: Calico's
IPIP/VXLAN tunnel address (on the Node as `projectcalico.org/IPv4IPIPTunnelAddr`, ...),
flannel's VXLAN device (the network address of the node's podCIDR) and a bridge CNI's gateway
(its first address), Cilium's `cilium_host` (`network.cilium.io/ipv4-cilium-host`). The
inbound rule refuses sources outside the pod ranges; without this, a host on a node with no
current agent would pass it with such a source (ADR 0012).

`host_addresses` is pure: Node objects and the config in, the addresses and the nodes whose
addresses could not be learned out (a node with no podCIDR and none of the annotations: its
host may use a pod-range address nobody told us of). `NodeAddresses` keeps them current
(mirror.py: list, then watch, waking the agent on every change; failures counted, retried).
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from deathwatch.firewall.config import Address, FirewallConfig, Network
from deathwatch.firewall.kubeapi import Api
from deathwatch.firewall.mirror import Mirror

log = structlog.get_logger("deathwatch.firewall")


@dataclass(frozen=True)
class Hosts:
    """What is known of every node: its host's addresses inside the pod ranges and the nodes
    whose addresses could not be learned; the pod ranges the nodes were given
    (`spec.podCIDRs`) and the nodes that have none. None: the nodes were never listed."""

    addresses: tuple[Address, ...] = ()
    unknown: tuple[str, ...] | None = None
    ranges: tuple[Network, ...] = ()
    unranged: tuple[str, ...] | None = None

    @property
    def complete(self) -> bool:
        return self.unknown == ()


def ranges_unknown(config: FirewallConfig, hosts: Hosts) -> tuple[str, ...] | None:
    """Why the pod ranges are not known to be complete, or () when they are: `podCIDRs`
    given (the operator's word), or every node listed with a podCIDR. None: the nodes were
    not listed (or none has a range); else the nodes with no podCIDR. The inbound rule
    refuses every source outside the ranges, so it waits for this to be ()."""
    if config.pod_cidrs:
        return ()
    if hosts.unranged is None or not hosts.ranges:
        return None
    return hosts.unranged


def pod_ranges(nodes: Iterable[Mapping[str, Any]]) -> tuple[tuple[Network, ...], tuple[str, ...]]:
    """The pod ranges the nodes were given (`spec.podCIDRs`, else the older `podCIDR`), and
    the nodes that have none (their pods' addresses are in no range we know)."""
    ranges: set[Network] = set()
    unranged: list[str] = []
    for node in nodes:
        spec = node.get("spec") or {}
        found = False
        for cidr in spec.get("podCIDRs") or [spec.get("podCIDR")]:
            if not isinstance(cidr, str):
                continue
            try:
                ranges.add(ipaddress.ip_network(cidr, strict=False))
                found = True
            except ValueError:
                continue
        if not found:
            unranged.append(str((node.get("metadata") or {}).get("name")))
    ordered = tuple(sorted(ranges, key=lambda n: (n.version, int(n.network_address), n.prefixlen)))
    return ordered, tuple(sorted(unranged))


def node_addresses(node: Mapping[str, Any], config: FirewallConfig) -> tuple[set[Address], bool]:
    """One node's host addresses in the pod ranges, and whether anything told us of them."""
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    notes = meta.get("annotations") or {}
    found: set[Address] = set()
    learned = False
    for key in config.host_address_annotations:
        value = notes.get(key)
        if not isinstance(value, str) or not value:
            continue
        learned = True
        try:  # an address, or one written with its prefix (Calico's WireGuard address)
            found.add(ipaddress.ip_interface(value.strip()).ip)
        except ValueError:
            log.warning("node annotation is not an address", node=meta.get("name"),
                        annotation=key, value=value[:60])  # fmt: skip
    cidrs = [c for c in (spec.get("podCIDRs") or [spec.get("podCIDR")]) if isinstance(c, str)]
    for cidr in cidrs:
        try:
            network = ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            continue
        learned = True
        for offset in config.host_pod_cidr_offsets:
            if offset < network.num_addresses:
                found.add(network.network_address + offset)
    return found, learned


def host_addresses(nodes: Iterable[Mapping[str, Any]], config: FirewallConfig) -> Hosts:
    """Every node's host addresses inside the pod ranges (configured and learned), plus
    `extraHostAddresses`; the ranges learned, and the nodes without one."""
    nodes = list(nodes)
    ranges, unranged = pod_ranges(nodes)
    pods = config.with_pod_ranges(ranges).pod_cidrs
    found: set[Address] = set(config.extra_host_addresses)
    unknown: list[str] = []
    for node in nodes:
        addresses, learned = node_addresses(node, config)
        found |= addresses
        if not learned:
            unknown.append(str((node.get("metadata") or {}).get("name")))
    inside = {a for a in found if any(a in n for n in pods if n.version == a.version)}
    return Hosts(tuple(sorted(inside, key=lambda a: (a.version, int(a)))), tuple(sorted(unknown)),
                 ranges, unranged)  # fmt: skip


class NodeAddresses(Mirror[Mapping[str, Any]]):
    """The Node objects this agent needs (annotations, labels and podCIDRs), kept current
    (mirror.py), waking the agent on every change that matters. Read-only: nodes
    get/list/watch."""

    def __init__(self, api: Api, wake: Callable[[], None], failed: Callable[[], None],
                 stop: threading.Event) -> None:  # fmt: skip
        super().__init__(api, "/api/v1/nodes", "node", _kept, wake, failed, stop)


def _kept(node: Mapping[str, Any]) -> Mapping[str, Any]:
    """Of a Node, only what the agent reads: host addresses (annotations, pod ranges) and
    its mode (labels: enforceNodeSelector); not its status, whose heartbeats change often."""
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    return {
        "metadata": {
            "name": meta.get("name"),
            "labels": dict(meta.get("labels") or {}),
            "annotations": dict(meta.get("annotations") or {}),
        },
        "spec": {"podCIDRs": spec.get("podCIDRs"), "podCIDR": spec.get("podCIDR")},
    }
