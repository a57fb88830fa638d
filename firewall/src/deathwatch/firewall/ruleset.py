"""What the table must hold for a config: a pure function from `FirewallConfig` to `Table`.

One base chain on hook output, priority -90: after NAT's dstnat (-100), so a connection to a
Service address is judged after DNAT has rewritten it to the pod. It sees only locally
generated packets: processes on the host and pods with hostNetwork. Ordinary pods have their
own network namespace; their packets to another pod take the forward path and never meet
this chain. Each matching packet is counted and refused at once with a TCP reset.
"""

from __future__ import annotations

from deathwatch.firewall.config import FirewallConfig
from deathwatch.firewall.table import Chain, Match, Rule, Set, Table, ports

CHAIN = "output"
PRIORITY = -90  # NAT dstnat is -100 on the output hook; this must come after it
COMMENT = "deathwatch: refuse host and hostNetwork connections to sandbox agent ports"


def desired(config: FirewallConfig) -> Table:
    sets: list[Set] = []
    rules: list[Rule] = []
    for proto, name, kind, nets in (
        ("ip", "pod_v4", "ipv4_addr", config.v4),
        ("ip6", "pod_v6", "ipv6_addr", config.v6),
    ):
        if nets:
            sets.append(Set(name, kind, ("interval",), tuple(sorted(str(n) for n in nets))))
            rules.append(
                Rule(
                    (
                        Match(f"{proto} daddr", f"@{name}"),
                        Match("tcp dport", ports(config.agent_ports)),
                    ),
                    "reject with tcp reset",
                    comment=COMMENT,
                )
            )
    chain = Chain(CHAIN, "filter", "output", PRIORITY, "accept", tuple(rules))
    return Table(tuple(sets), (chain,))
