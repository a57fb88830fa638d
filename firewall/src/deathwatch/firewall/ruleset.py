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
this node's sandboxes whose source is not a pod: outside the pod ranges (another node's host,
a NodePort client before SNAT) or a host's own address inside them (an overlay CNI's tunnel
address: hosts.py), except `allowedSources`. The pod sources are one interval set, the pod
ranges with every host address taken out, so one compare tells a pod from a host. Keyed on
the sandboxes' addresses, not the pod range: another pod that happens to listen on an agent
port is not ours to guard.

The port is the rule's first test, as in output: everything a node forwards that is not to
an agent port, replies included, leaves at that one compare. Only packets to an agent port of
one of this node's sandboxes reach the source test, and every one of them does, not only a
connection's first: a host connection established before the rule covered a sandbox (before
the agent started, before a node's host addresses were learned, or in the moment between a
sandbox starting and its address joining the set) is cut at its next packet. Measured
(bench/firewall_bench.py, ADR 0012): every key considered (this, the source first, only new
connections, only SYNs) costs 0-5% of a pod's connect, the differences between them inside the
harness's noise; this one is chosen for cutting connections that predate the rule.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from deathwatch.firewall.config import FirewallConfig
from deathwatch.firewall.table import Chain, Match, Rule, Set, Table, interval, ports

CHAIN = "output"
INBOUND_CHAIN = "inbound"
PRIORITY = -90  # NAT dstnat is -100 on the output hook; this must come after it
COMMENT = "deathwatch: refuse host and hostNetwork connections to sandbox agent ports"
INBOUND_COMMENT = "deathwatch: refuse connections from outside the pod network to sandbox agents"
# the sets the agent fills from the API at run time; `check` compares them without elements
SANDBOX_SETS = ("sandbox_v4", "sandbox_v6", "podsrc_v4", "podsrc_v6")
# the pod ranges: the config's and the nodes' (hosts.py), which the config alone does not say
POD_SETS = ("pod_v4", "pod_v6")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_FAMILIES = (("ip", 4, "ipv4_addr", "v4"), ("ip6", 6, "ipv6_addr", "v6"))


def desired(
    config: FirewallConfig, sandboxes: Iterable[Address] = (), hosts: Iterable[Address] = ()
) -> Table:
    """The table for `config`, this node's `sandboxes` and every node's `hosts` (their
    addresses inside the pod ranges)."""
    local, host = set(sandboxes), set(hosts)
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
        # the port first, as in output: everything forwarded that is not to an agent port
        # (every reply included) leaves at one compare; then this node's sandboxes (a hash
        # lookup); then the source, against the pod ranges without the hosts' own addresses
        sources = _without(pods, {a for a in host if a.version == version})
        sets.append(Set(f"podsrc_{suffix}", kind, ("interval",), sources))
        # a sandbox in no known pod range is not guarded: its clients' addresses are likely
        # outside the ranges too, and would be refused (the coverage Lease says why)
        mine = sorted(str(a) for a in local if a.version == version and any(a in n for n in pods))
        sets.append(Set(f"sandbox_{suffix}", kind, (), tuple(mine)))
        matches = [
            agent,
            Match(f"{proto} daddr", f"@sandbox_{suffix}"),
            Match(f"{proto} saddr", f"@podsrc_{suffix}", "!="),
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


def _without(
    ranges: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network], holes: set[Address]
) -> tuple[str, ...]:
    """The ranges with each address in `holes` taken out: merged intervals, each written as
    nft lists it (a prefix when it is exactly one, else `low-high`), so one address taken out
    of a /56 costs one more element, not seventy."""
    spans: list[tuple[int, int, int]] = []  # (first, last, version)
    for network in ranges:  # one family's ranges, collapsed (FirewallConfig.v4, .v6)
        first, last = int(network.network_address), int(network.broadcast_address)
        for hole in sorted(int(a) for a in holes if a in network):
            if hole > first:
                spans.append((first, hole - 1, network.version))
            first = hole + 1
        if first <= last:
            spans.append((first, last, network.version))
    return tuple(sorted(interval(lo, hi, v) for lo, hi, v in spans))
