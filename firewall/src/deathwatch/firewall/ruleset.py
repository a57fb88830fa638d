"""The table `inet deathwatch`, as text to apply and as a model to compare. Pure functions.

One base chain on hook output, priority -90: after NAT's dstnat (-100), so a connection to a
Service address is judged after DNAT has rewritten it to the pod. It sees only locally
generated packets: processes on the host and pods with hostNetwork. Ordinary pods have their
own network namespace; their packets to another pod take the forward path and never meet
this chain. Each matching packet is counted and refused at once with a TCP reset.

The script replaces the whole table in one `nft -f` transaction (declare, delete, define:
works on nft 1.0.6), so there is no moment with a partial rule or no rule.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deathwatch.firewall.config import FirewallConfig

FAMILY, TABLE, CHAIN = "inet", "deathwatch", "output"
PRIORITY = -90  # NAT dstnat is -100 on the output hook; this must come after it
COMMENT = "deathwatch: refuse host and hostNetwork connections to sandbox agent ports"


@dataclass(frozen=True)
class TableModel:
    """What the table holds, in a form both sides (desired, live) can be reduced to."""

    chains: Mapping[str, tuple[str, str, int, str]] = field(default_factory=dict)
    sets: Mapping[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)
    rules: tuple[str, ...] = ()


def _ports(ports: Sequence[int]) -> str:
    return "{ " + ", ".join(str(p) for p in sorted(ports)) + " }"


def render(config: FirewallConfig) -> str:
    """The nft script that makes the live table exactly what `config` asks for."""
    lines = [
        f"table {FAMILY} {TABLE}",
        f"delete table {FAMILY} {TABLE}",
        f"table {FAMILY} {TABLE} {{",
    ]
    for name, kind, nets in (
        ("pod_v4", "ipv4_addr", config.v4),
        ("pod_v6", "ipv6_addr", config.v6),
    ):
        if nets:
            elements = ", ".join(str(n) for n in nets)
            lines.append(
                f"\tset {name} {{ type {kind}; flags interval; elements = {{ {elements} }} }}"
            )
    lines.append(f"\tchain {CHAIN} {{")
    lines.append(f"\t\ttype filter hook output priority {PRIORITY}; policy accept;")
    for proto, name, nets in (("ip", "pod_v4", config.v4), ("ip6", "pod_v6", config.v6)):
        if nets:
            lines.append(
                f"\t\t{proto} daddr @{name} tcp dport {_ports(config.agent_ports)} counter "
                f'reject with tcp reset comment "{COMMENT}"'
            )
    lines.append("\t}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _rule(proto: str, set_name: str, ports: Sequence[int]) -> str:
    return (
        f"{proto} daddr == @{set_name} ; tcp dport == {{{','.join(str(p) for p in sorted(ports))}}}"
        f" ; counter ; reject tcp reset ; comment={COMMENT}"
    )


def desired(config: FirewallConfig) -> TableModel:
    sets: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {}
    rules: list[str] = []
    for proto, name, kind, nets in (
        ("ip", "pod_v4", "ipv4_addr", config.v4),
        ("ip6", "pod_v6", "ipv6_addr", config.v6),
    ):
        if nets:
            sets[name] = (kind, ("interval",), tuple(sorted(str(n) for n in nets)))
            rules.append(_rule(proto, name, config.agent_ports))
    return TableModel({CHAIN: ("filter", "output", PRIORITY, "accept")}, sets, tuple(rules))


# --- reading `nft -j list table inet deathwatch` back --------------------------------------


def _element(e: Any) -> str:
    if isinstance(e, str):
        return str(ipaddress.ip_network(e, strict=False))
    if isinstance(e, Mapping) and "prefix" in e:
        p = e["prefix"]
        return str(ipaddress.ip_network(f"{p['addr']}/{p['len']}", strict=False))
    return json.dumps(e, sort_keys=True)  # a range or anything else: kept, so it differs


def _operand(x: Any) -> str:
    if isinstance(x, Mapping):
        if "payload" in x:
            return f"{x['payload'].get('protocol')} {x['payload'].get('field')}"
        if "meta" in x:
            return f"meta {x['meta'].get('key')}"
        if "set" in x:
            values = sorted(
                x["set"],
                key=lambda v: (not isinstance(v, int), v if isinstance(v, int) else str(v)),
            )
            return "{" + ",".join(str(v) for v in values) + "}"
        return json.dumps(x, sort_keys=True)
    if isinstance(x, str) and x.startswith("@"):
        return x
    return "{" + str(x) + "}"  # a single value: the same as a set of one


def _expr(e: Mapping[str, Any]) -> str:
    if "match" in e:
        m = e["match"]
        return f"{_operand(m.get('left'))} {m.get('op')} {_operand(m.get('right'))}"
    if "counter" in e:
        return "counter"  # its numbers change by the packet; its presence is what matters
    if "reject" in e:
        return f"reject {(e['reject'] or {}).get('type', '')}".rstrip()
    return json.dumps(e, sort_keys=True)


def live(listing: Mapping[str, Any] | None) -> TableModel | None:
    """The model of a live table from `nft -j list table`, None if there is no table."""
    if listing is None:
        return None
    chains: dict[str, tuple[str, str, int, str]] = {}
    sets: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {}
    rules: list[str] = []
    for item in listing.get("nftables", []):
        if "chain" in item:
            c = item["chain"]
            chains[c["name"]] = (
                c.get("type", ""),
                c.get("hook", ""),
                int(c.get("prio", 0)),
                c.get("policy", ""),
            )
        elif "set" in item:
            s = item["set"]
            elems = s.get("elem", [])
            sets[s["name"]] = (
                s.get("type", ""),
                tuple(s.get("flags", [])),
                tuple(sorted(_element(e) for e in elems)),
            )
        elif "rule" in item:
            r = item["rule"]
            text = " ; ".join(_expr(e) for e in r.get("expr", []))
            if r.get("comment") is not None:
                text += f" ; comment={r['comment']}"
            rules.append(f"{r.get('chain')}: {text}" if r.get("chain") != CHAIN else text)
    return TableModel(chains, sets, tuple(rules))


def differences(want: TableModel, have: TableModel | None) -> list[str]:
    """What is wrong with the live table, one line each; empty when it is exactly right."""
    if have is None:
        return [f"table {FAMILY} {TABLE} is missing"]
    out: list[str] = []
    for name in sorted(set(want.chains) | set(have.chains)):
        if want.chains.get(name) != have.chains.get(name):
            out.append(f"chain {name}: want {want.chains.get(name)}, have {have.chains.get(name)}")
    for name in sorted(set(want.sets) | set(have.sets)):
        if want.sets.get(name) != have.sets.get(name):
            out.append(f"set {name}: want {want.sets.get(name)}, have {have.sets.get(name)}")
    if want.rules != have.rules:
        out.append(f"rules: want {list(want.rules)}, have {list(have.rules)}")
    return out


def rejected_packets(listing: Mapping[str, Any] | None) -> int:
    """Packets refused so far: the sum of our rules' counters."""
    total = 0
    for item in (listing or {}).get("nftables", []):
        for e in item.get("rule", {}).get("expr", []):
            if "counter" in e and isinstance(e["counter"], Mapping):
                total += int(e["counter"].get("packets", 0))
    return total
