"""Hosts in the pod range are hosts: every node's own addresses inside the pod ranges.

On overlay CNIs a host talks to other nodes' pods from an address of the pod pool: Calico's
IPIP/VXLAN tunnel address (on the Node as `projectcalico.org/IPv4IPIPTunnelAddr`, ...),
flannel's VXLAN device (the network address of the node's podCIDR) and a bridge CNI's gateway
(its first address), Cilium's `cilium_host` (`network.cilium.io/ipv4-cilium-host`). The
inbound rule refuses sources outside the pod ranges; without this, a host on a node with no
current agent would pass it with such a source (ADR 0012).

`host_addresses` is pure: Node objects and the config in, the addresses and the nodes whose
addresses could not be learned out (a node with no podCIDR and none of the annotations: its
host may use a pod-range address nobody told us of). `NodeAddresses` keeps them current: one
list, then a watch resumed from its resourceVersion (a 410 lists again), waking the agent on
every change; failures are counted and retried with backoff, never the end of the thread.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from deathwatch.firewall.config import Address, FirewallConfig
from deathwatch.firewall.kubeapi import Api, ApiError, query

log = structlog.get_logger("deathwatch.firewall")
WATCH_SECONDS = 300
BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class Hosts:
    """What is known of every node's hosts: their addresses inside the pod ranges, and the
    nodes whose addresses could not be learned (None: the nodes were never listed)."""

    addresses: tuple[Address, ...] = ()
    unknown: tuple[str, ...] | None = None

    @property
    def complete(self) -> bool:
        return self.unknown == ()


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
    """Every node's host addresses inside the pod ranges, plus `extraHostAddresses`."""
    pods = config.pod_cidrs
    found: set[Address] = set(config.extra_host_addresses)
    unknown: list[str] = []
    for node in nodes:
        addresses, learned = node_addresses(node, config)
        found |= addresses
        if not learned:
            unknown.append(str((node.get("metadata") or {}).get("name")))
    inside = {a for a in found if any(a in n for n in pods if n.version == a.version)}
    return Hosts(tuple(sorted(inside, key=lambda a: (a.version, int(a)))), tuple(sorted(unknown)))


class NodeAddresses:
    """The Node objects this agent needs (annotations and podCIDRs), kept current by a
    list and a watch; `wake()` on every change. Read-only: nodes get/list/watch."""

    def __init__(self, api: Api, wake: Callable[[], None], failed: Callable[[], None],
                 stop: threading.Event) -> None:  # fmt: skip
        self.api, self.wake, self.failed, self.stop = api, wake, failed, stop
        self.nodes: dict[str, Mapping[str, Any]] = {}
        self.listed = False
        self._lock = threading.Lock()

    def snapshot(self) -> list[Mapping[str, Any]] | None:
        """The nodes as last seen (None: never listed yet)."""
        with self._lock:
            return list(self.nodes.values()) if self.listed else None

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="node-watch", daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        failures, version = 0, ""
        while not self.stop.is_set():
            try:
                if not version:
                    version = self._list()
                version = self._watch(version)
                failures = 0
            except Exception as exc:  # any failure: counted, logged, retried
                self.failed()
                delay = BACKOFF[min(failures, len(BACKOFF) - 1)]
                failures += 1
                if isinstance(exc, ApiError) and exc.status == 410:
                    version = ""  # too old to resume: list again
                log.warning("node watch failed; retrying", error=f"{type(exc).__name__}: "
                            f"{str(exc)[:300]}", retry_in=delay)  # fmt: skip
                self.stop.wait(delay)

    def _list(self) -> str:
        nodes: dict[str, Mapping[str, Any]] = {}
        token, version = "", ""
        while True:
            page = self.api.call("GET", "/api/v1/nodes" + query(limit="500", **{"continue": token}))
            for node in page.get("items") or []:
                nodes[node["metadata"]["name"]] = _kept(node)
            token = (page.get("metadata") or {}).get("continue") or ""
            version = (page.get("metadata") or {}).get("resourceVersion") or ""
            if not token:
                break
        with self._lock:
            self.nodes, self.listed = nodes, True
        self.wake()
        return version

    def _watch(self, version: str) -> str:
        path = "/api/v1/nodes" + query(resourceVersion=version, allowWatchBookmarks="true")
        for event in self.api.watch(path, WATCH_SECONDS):
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                raise ApiError(f"node watch: {str(obj.get('message'))[:200]}", obj.get("code"))
            version = (obj.get("metadata") or {}).get("resourceVersion") or version
            if kind == "BOOKMARK":
                continue
            name = str((obj.get("metadata") or {}).get("name"))
            with self._lock:
                before = self.nodes.get(name)
                if kind == "DELETED":
                    self.nodes.pop(name, None)
                else:
                    self.nodes[name] = _kept(obj)
                changed = self.nodes.get(name) != before
            if changed:
                self.wake()
            if self.stop.is_set():
                break
        return version


def _kept(node: Mapping[str, Any]) -> Mapping[str, Any]:
    """Of a Node, only what host addresses are read from (not its status: heartbeats)."""
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    return {
        "metadata": {"name": meta.get("name"), "annotations": dict(meta.get("annotations") or {})},
        "spec": {"podCIDRs": spec.get("podCIDRs"), "podCIDR": spec.get("podCIDR")},
    }
