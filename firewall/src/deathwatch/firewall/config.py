"""The firewall agent's configuration: the file the DaemonSet mounts from a ConfigMap.

    podCIDRs: ["10.244.0.0/16", "fd00:10:244::/56"]   # IPv4 and/or IPv6 pod ranges
    agentPorts: [49983]                                # TCP ports of the sandbox agent
    resyncSeconds: 10                                  # how often the live table is checked

YAML or JSON. Validated strictly: an unknown key, a wrong type or a bad value is an error that
names the field and the value, because a firewall quietly running on half a config is worse
than one that refuses to start.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
KEYS = ("podCIDRs", "agentPorts", "resyncSeconds")
DEFAULT_RESYNC = 10.0
MAX_RESYNC = 3600.0


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class FirewallConfig:
    pod_cidrs: tuple[Network, ...]
    agent_ports: tuple[int, ...]
    resync_seconds: float = DEFAULT_RESYNC

    @property
    def v4(self) -> tuple[ipaddress.IPv4Network, ...]:
        nets = [n for n in self.pod_cidrs if isinstance(n, ipaddress.IPv4Network)]
        return tuple(ipaddress.collapse_addresses(nets))

    @property
    def v6(self) -> tuple[ipaddress.IPv6Network, ...]:
        nets = [n for n in self.pod_cidrs if isinstance(n, ipaddress.IPv6Network)]
        return tuple(ipaddress.collapse_addresses(nets))


def parse_config(data: object, source: str = "config") -> FirewallConfig:
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: expected a mapping with {', '.join(KEYS)}, got {type(data).__name__}"
        )
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise ConfigError(f"{source}: unknown field {unknown[0]!r} (known: {', '.join(KEYS)})")
    cidrs = data.get("podCIDRs")
    if not isinstance(cidrs, list) or not cidrs:
        raise ConfigError(f"{source}: podCIDRs: expected a non-empty list of CIDRs, got {cidrs!r}")
    networks: list[Network] = []
    for i, cidr in enumerate(cidrs):
        if not isinstance(cidr, str):
            raise ConfigError(f"{source}: podCIDRs[{i}]: expected a CIDR string, got {cidr!r}")
        try:
            networks.append(ipaddress.ip_network(cidr, strict=True))
        except ValueError as exc:
            raise ConfigError(f"{source}: podCIDRs[{i}]: invalid CIDR {cidr!r}: {exc}") from None
    ports = data.get("agentPorts")
    if not isinstance(ports, list) or not ports:
        raise ConfigError(
            f"{source}: agentPorts: expected a non-empty list of TCP ports, got {ports!r}"
        )
    for i, port in enumerate(ports):
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ConfigError(
                f"{source}: agentPorts[{i}]: expected a TCP port 1-65535, got {port!r}"
            )
    if len(set(ports)) != len(ports):
        raise ConfigError(f"{source}: agentPorts: duplicate port in {ports!r}")
    resync: Any = data.get("resyncSeconds", DEFAULT_RESYNC)
    if (
        isinstance(resync, bool)
        or not isinstance(resync, int | float)
        or not 0 < resync <= MAX_RESYNC
    ):
        raise ConfigError(
            f"{source}: resyncSeconds: expected seconds in (0, {MAX_RESYNC:.0f}], got {resync!r}"
        )
    return FirewallConfig(tuple(networks), tuple(sorted(ports)), float(resync))


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
