"""What the table must hold for a config: a pure function from `FirewallConfig` (and the
sandboxes running on this node) to `Table`.

Two base chains, each with one rule per IP family; every matching packet is counted and
refused at once with a TCP reset.

output (hook output, priority -90): the sending side, for connections that start on this
node. Priority -90 is after NAT's dstnat (-100), so a connection to a Service address is
judged after DNAT has rewritten it to the pod. The rule refuses only packets whose source is
an address of this host (`fib saddr type local`): processes on the host and hostNetwork pods.
IPVS sends a pod's Service connection out through this same hook with the *pod's* address as
its source (calico#2165, kubernetes#68055); keyed on the destination alone, the rule would cut
every sandbox behind a Service off from the pods that use it. Ordinary pods have their own
network namespace: their packets take the forward path and never meet this chain.

inbound (hook forward, priority -90): the receiving side, on the sandbox's own node, so that
a node without the agent is not an open door. It refuses connections to the agent ports of
this node's sandboxes whose source is outside the pod ranges (another node's host, a NodePort
client before SNAT), except `allowedSources`. Keyed on the sandboxes' addresses, not the pod
range: another pod that happens to listen on an agent port is not ours to guard.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from deathwatch.firewall.config import FirewallConfig
from deathwatch.firewall.table import Chain, Match, Rule, Set, Table, ports

CHAIN = "output"
INBOUND_CHAIN = "inbound"
PRIORITY = -90  # NAT dstnat is -100 on the output hook; this must come after it
COMMENT = "deathwatch: refuse host and hostNetwork connections to sandbox agent ports"
INBOUND_COMMENT = "deathwatch: refuse connections from outside the pod network to sandbox agents"
# the sets the agent fills from the API at run time; `check` compares them without elements
SANDBOX_SETS = ("sandbox_v4", "sandbox_v6")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_FAMILIES = (("ip", 4, "ipv4_addr", "v4"), ("ip6", 6, "ipv6_addr", "v6"))


def desired(config: FirewallConfig, sandboxes: Iterable[Address] = ()) -> Table:
    local = set(sandboxes)
    sets: list[Set] = []
    output: list[Rule] = []
    inbound: list[Rule] = []
    agent = Match("tcp dport", ports(config.agent_ports))
    for proto, version, kind, suffix in _FAMILIES:
        pods = config.v4 if version == 4 else config.v6
        if not pods:
            continue
        sets.append(Set(f"pod_{suffix}", kind, ("interval",), _sorted(pods)))
        output.append(
            Rule(
                (  # the port first: the host's other traffic leaves at one compare
                    agent,
                    Match(f"{proto} daddr", f"@pod_{suffix}"),
                    Match("fib saddr type", "local"),
                ),
                "reject with tcp reset",
                comment=COMMENT,
            )
        )
        if not config.inbound:
            continue
        # cheapest test first: most forwarded packets (replies included) leave at the port;
        # the sandboxes are a hash set of addresses, the ranges interval sets
        mine = sorted(str(a) for a in local if a.version == version)
        sets.append(Set(f"sandbox_{suffix}", kind, (), tuple(mine)))
        matches = [
            agent,
            Match(f"{proto} daddr", f"@sandbox_{suffix}"),
            Match(f"{proto} saddr", f"@pod_{suffix}", "!="),
        ]
        allowed = config.allowed(version)
        if allowed:
            sets.append(Set(f"allowed_{suffix}", kind, ("interval",), _sorted(allowed)))
            matches.append(Match(f"{proto} saddr", f"@allowed_{suffix}", "!="))
        inbound.append(Rule(tuple(matches), "reject with tcp reset", comment=INBOUND_COMMENT))
    chains = [Chain(CHAIN, "filter", "output", PRIORITY, "accept", tuple(output))]
    if config.inbound:
        chains.append(Chain(INBOUND_CHAIN, "filter", "forward", PRIORITY, "accept", tuple(inbound)))
    return Table(tuple(sets), tuple(chains))


def _sorted(nets: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> tuple[str, ...]:
    return tuple(sorted(str(n) for n in nets))
