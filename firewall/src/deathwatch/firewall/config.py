"""The firewall agent's configuration: the file the DaemonSet mounts from a ConfigMap.

    podCIDRs: []   # optional: pod ranges (IPv4, IPv6) added to those learned from every
                   # Node's spec.podCIDRs; give them when the CNI's IPAM is not the nodes'
                   # (Calico IP pools, a VPC CNI): see `pod ranges` below
    agentPorts: [49983]                                # TCP ports of the sandbox agent
    resyncSeconds: 10                                  # how often the live table is checked
    inbound: true                  # also refuse, on the sandbox's own node, connections from
                                   # outside the pod ranges (other nodes' hosts, NodePorts)
    allowedSources: ["10.0.5.7/32"]                    # ... except from these (a gateway)
    sandboxSelector: ""            # which pods on this node are sandboxes: empty, the pods
                                   # the DeathWatches select (ADR 0037); else a label selector
    controllerId: ""               # ... the DeathWatches of this controller id (the chart's
                                   # controller.controllerId)
    mode: enforce                  # or audit: the same rules count and record what they
                                   # would refuse, and let it through (ruleset.py)
    enforceNodeSelector: ""        # in audit mode, the nodes whose labels match enforce: the
                                   # platform moves a node pool at a time (k=v, k!=v, k, !k)
    # hosts in the pod range are hosts (overlay CNIs give each node a tunnel address there):
    hostAddressAnnotations: [...]  # Node annotations holding one (default: Calico's, Cilium's)
    hostPodCIDROffsets: [0, 1]     # addresses of each node's spec.podCIDRs the host takes
                                   # (flannel's VXLAN device .0, a bridge CNI's gateway .1)
    extraHostAddresses: []         # any other host addresses inside the pod ranges

Pod ranges: the agent learns them from the Node objects (`spec.podCIDRs`, what the node IPAM
of kube-controller-manager assigns and bridge, flannel, kindnet, Cilium's kubernetes IPAM
and k3s use) and adds `podCIDRs`. The inbound rule refuses every source outside them, so it
is enforced only while they are complete: `podCIDRs` given, or every node listed with a
podCIDR. Otherwise only the output rule is enforced, and the coverage Lease says why (a
wrong range would refuse real pods, the platform's gateway among them). A sandbox whose
address is in no known range is left out of the inbound rule for the same reason.

YAML or JSON, decoded through a typed model (`ConfigFile`: types and bounds declared once).
Validated strictly: an unknown key, a wrong type or a bad value is an error that names the
field and the value, because a firewall quietly running on half a config is worse than one
that refuses to start.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import msgspec
import yaml

from deathwatch._kube.configfile import ConfigError, explain
from deathwatch._kube.selector import SelectorError, parse_selector

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
N = TypeVar("N", ipaddress.IPv4Network, ipaddress.IPv6Network)
DEFAULT_RESYNC = 10.0
MAX_RESYNC = 3600.0
# Node annotations that hold a host's own address inside the pod range (its tunnel device):
# Calico (IPIP, VXLAN, WireGuard) and Cilium (cilium_host, old and new keys)
HOST_ADDRESS_ANNOTATIONS = (
    "projectcalico.org/IPv4IPIPTunnelAddr",
    "projectcalico.org/IPv4VXLANTunnelAddr",
    "projectcalico.org/IPv6VXLANTunnelAddr",
    "projectcalico.org/IPv4WireguardInterfaceAddr",
    "projectcalico.org/IPv6WireguardInterfaceAddr",
    "network.cilium.io/ipv4-cilium-host",
    "network.cilium.io/ipv6-cilium-host",
    "io.cilium.network.ipv4-cilium-host",
    "io.cilium.network.ipv6-cilium-host",
)
# flannel's VXLAN device takes the network address of the node's podCIDR, a bridge CNI's
# gateway (cni0, cbr0) its first address
HOST_POD_CIDR_OFFSETS = (0, 1)


class ConfigFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    pod_cidrs: list[str] = msgspec.field(name="podCIDRs", default_factory=list)
    agent_ports: Annotated[
        list[Annotated[int, msgspec.Meta(ge=1, le=65535)]], msgspec.Meta(min_length=1)
    ] = msgspec.field(name="agentPorts")
    resync_seconds: Annotated[float, msgspec.Meta(gt=0, le=MAX_RESYNC)] = msgspec.field(
        name="resyncSeconds", default=DEFAULT_RESYNC
    )
    inbound: bool = True
    allowed_sources: list[str] = msgspec.field(name="allowedSources", default_factory=list)
    sandbox_selector: Annotated[str, msgspec.Meta(max_length=1024)] = msgspec.field(
        name="sandboxSelector", default=""
    )
    host_address_annotations: list[Annotated[str, msgspec.Meta(min_length=1, max_length=317)]] = (
        msgspec.field(
            name="hostAddressAnnotations", default_factory=lambda: list(HOST_ADDRESS_ANNOTATIONS)
        )
    )
    host_pod_cidr_offsets: list[Annotated[int, msgspec.Meta(ge=0, le=65535)]] = msgspec.field(
        name="hostPodCIDROffsets", default_factory=lambda: list(HOST_POD_CIDR_OFFSETS)
    )
    extra_host_addresses: list[str] = msgspec.field(name="extraHostAddresses", default_factory=list)
    mode: Literal["enforce", "audit"] = "enforce"
    enforce_node_selector: Annotated[str, msgspec.Meta(max_length=1024)] = msgspec.field(
        name="enforceNodeSelector", default=""
    )
    controller_id: Annotated[str, msgspec.Meta(max_length=253)] = msgspec.field(
        name="controllerId", default=""
    )


KEYS = ("podCIDRs", "agentPorts", "resyncSeconds", "inbound", "allowedSources", "sandboxSelector",
        "hostAddressAnnotations", "hostPodCIDROffsets", "extraHostAddresses", "mode",
        "enforceNodeSelector", "controllerId")  # fmt: skip
ENFORCE, AUDIT = "enforce", "audit"
# a label selector as kubectl takes it: key=value, key!=value, key, !key, key in (a,b)
_SELECTOR = re.compile(
    r"^\s*(!?[\w./-]+(\s*(==?|!=)\s*[\w.-]*|\s+(in|notin)\s*\([\w.,\s-]*\))?)"
    r"(\s*,\s*!?[\w./-]+(\s*(==?|!=)\s*[\w.-]*|\s+(in|notin)\s*\([\w.,\s-]*\))?)*\s*$"
)
# what each field must be, in words, for messages that name the field and the value
_EXPECTED = {
    "podCIDRs": "a list of CIDRs (optional: learned from the Node objects)",
    "podCIDRs[]": "a CIDR string",
    "agentPorts": "a non-empty list of TCP ports",
    "agentPorts[]": "a TCP port 1-65535",
    "resyncSeconds": f"seconds in (0, {MAX_RESYNC:.0f}]",
    "inbound": "true or false",
    "allowedSources": "a list of CIDRs",
    "allowedSources[]": "a CIDR string",
    "sandboxSelector": "a label selector string (e.g. app=sandbox)",
    "hostAddressAnnotations": "a list of Node annotation keys",
    "hostAddressAnnotations[]": "an annotation key",
    "hostPodCIDROffsets": "a list of offsets into a node's podCIDRs",
    "hostPodCIDROffsets[]": "an offset 0-65535",
    "extraHostAddresses": "a list of IP addresses",
    "extraHostAddresses[]": "an IP address string",
    "mode": "enforce or audit",
    "enforceNodeSelector": "a label selector of the nodes that enforce in audit mode",
    "controllerId": 'the controller id whose DeathWatches choose the sandboxes ("": none)',
}


@dataclass(frozen=True)
class FirewallConfig:
    pod_cidrs: tuple[Network, ...]
    agent_ports: tuple[int, ...]
    resync_seconds: float = DEFAULT_RESYNC
    inbound: bool = True
    allowed_sources: tuple[Network, ...] = ()
    sandbox_selector: str = ""
    host_address_annotations: tuple[str, ...] = HOST_ADDRESS_ANNOTATIONS
    host_pod_cidr_offsets: tuple[int, ...] = HOST_POD_CIDR_OFFSETS
    extra_host_addresses: tuple[Address, ...] = ()
    mode: str = ENFORCE  # as configured; the agent resolves its node's (`for_node`)
    enforce_node_selector: str = ""
    # with no sandboxSelector, the sandboxes are the pods selected by the DeathWatches this
    # release's controller serves: those annotated with this controller id ("": none)
    controller_id: str = ""

    def for_node(self, labels: Mapping[str, str] | None) -> FirewallConfig:
        """This config as one node runs it: in audit mode, a node whose labels match
        `enforceNodeSelector` enforces (None: its labels are not known yet: as configured)."""
        if self.mode != AUDIT or not self.enforce_node_selector or labels is None:
            return self
        if parse_selector(self.enforce_node_selector).matches(labels):
            return replace(self, mode=ENFORCE)
        return self

    @property
    def v4(self) -> tuple[ipaddress.IPv4Network, ...]:
        return _collapsed(self.pod_cidrs, ipaddress.IPv4Network)

    @property
    def v6(self) -> tuple[ipaddress.IPv6Network, ...]:
        return _collapsed(self.pod_cidrs, ipaddress.IPv6Network)

    def with_pod_ranges(self, learned: tuple[Network, ...]) -> FirewallConfig:
        """This config with the ranges learned from the Node objects added to its own."""
        if not learned:
            return self
        pods = (*self.pod_cidrs, *learned)
        v4: tuple[Network, ...] = _collapsed(pods, ipaddress.IPv4Network)
        both = v4 + _collapsed(pods, ipaddress.IPv6Network)
        return replace(self, pod_cidrs=both)

    def allowed(self, version: int) -> tuple[Network, ...]:
        if version == 4:
            return _collapsed(self.allowed_sources, ipaddress.IPv4Network)
        return _collapsed(self.allowed_sources, ipaddress.IPv6Network)

    def digest(self) -> str:
        """A short name for this config, published with the node's coverage: which rule a
        node enforces, comparable across nodes and with what the controller expects."""
        text = json.dumps(
            {
                "podCIDRs": sorted(str(n) for n in self.pod_cidrs),
                "agentPorts": list(self.agent_ports),
                "inbound": self.inbound,
                "allowedSources": sorted(str(n) for n in self.allowed_sources),
                "sandboxSelector": self.sandbox_selector,
                "hostAddressAnnotations": sorted(self.host_address_annotations),
                "hostPodCIDROffsets": sorted(self.host_pod_cidr_offsets),
                "extraHostAddresses": sorted(str(a) for a in self.extra_host_addresses),
                "mode": self.mode,
                "enforceNodeSelector": self.enforce_node_selector,
                "controllerId": self.controller_id,
            },
            sort_keys=True,
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _collapsed(nets: tuple[Network, ...], kind: type[N]) -> tuple[N, ...]:
    return tuple(ipaddress.collapse_addresses(n for n in nets if isinstance(n, kind)))


def parse_config(data: object, source: str = "config") -> FirewallConfig:
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: expected a mapping with {', '.join(KEYS)}, got {type(data).__name__}"
        )
    try:
        raw = msgspec.convert(data, ConfigFile)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {explain(exc, data, _EXPECTED, KEYS)}") from None
    if len(set(raw.agent_ports)) != len(raw.agent_ports):
        raise ConfigError(f"{source}: agentPorts: duplicate port in {raw.agent_ports!r}")
    if raw.sandbox_selector and not _SELECTOR.match(raw.sandbox_selector):
        raise ConfigError(
            f"{source}: sandboxSelector: expected {_EXPECTED['sandboxSelector']}, "
            f"got {raw.sandbox_selector!r}"
        )
    if raw.enforce_node_selector.strip():
        try:
            parse_selector(raw.enforce_node_selector)
        except SelectorError as exc:
            raise ConfigError(f"{source}: enforceNodeSelector: {exc}") from None
    extra: list[Address] = []
    for i, text in enumerate(raw.extra_host_addresses):
        try:
            extra.append(ipaddress.ip_address(text))
        except ValueError:
            raise ConfigError(
                f"{source}: extraHostAddresses[{i}]: expected an IP address, got {text!r}"
            ) from None
    return FirewallConfig(
        _networks(raw.pod_cidrs, "podCIDRs", source),
        tuple(sorted(raw.agent_ports)),
        raw.resync_seconds,
        raw.inbound,
        _networks(raw.allowed_sources, "allowedSources", source),
        raw.sandbox_selector.strip(),
        tuple(dict.fromkeys(raw.host_address_annotations)),
        tuple(sorted(set(raw.host_pod_cidr_offsets))),
        tuple(sorted(set(extra), key=lambda a: (a.version, int(a)))),
        raw.mode,
        raw.enforce_node_selector.strip(),
        raw.controller_id,
    )


def _networks(cidrs: list[str], name: str, source: str) -> tuple[Network, ...]:
    networks: list[Network] = []
    for i, cidr in enumerate(cidrs):
        try:
            networks.append(ipaddress.ip_network(cidr, strict=True))
        except ValueError as exc:
            raise ConfigError(f"{source}: {name}[{i}]: invalid CIDR {cidr!r}: {exc}") from None
    return tuple(networks)


def load_config(path: str | Path) -> FirewallConfig:
    """Read and validate a YAML or JSON file. Raises ConfigError (never anything else)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(
            f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {exc}"
        ) from None
    return parse_config(data, str(p))
