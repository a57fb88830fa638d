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

Audit mode (`mode: audit`, ADR 0027): the same tests, one rule per agent port and kind of
source, each matching only a connection's first packet (`ct state new`), with no verdict: the
packet goes on, counted on the rule, its (source, port, sandbox) recorded in a set the kernel
fills and empties (`audit_*`: at most AUDIT_SIZE, each for AUDIT_SECONDS). Three kinds:
`host` (output: this node's host, a process or a hostNetwork pod: they share its addresses, so
the packet cannot tell them apart), `outside` (inbound: a source outside the pod ranges:
another node's host, a NodePort client) and `host-in-pod-range` (inbound: a host's own
address inside the ranges, an overlay's tunnel). The agent reads the counters (a metric by
port and kind) and logs the new sources at each resync.

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

from deathwatch.firewall.config import AUDIT, FirewallConfig
from deathwatch.firewall.table import NAME, Chain, Match, Rule, Set, Table, interval, ports

CHAIN = "output"
INBOUND_CHAIN = "inbound"
PRIORITY = -90  # NAT dstnat is -100 on the output hook; this must come after it
COMMENT = "deathwatch: refuse host and hostNetwork connections to sandbox agent ports"
INBOUND_COMMENT = "deathwatch: refuse connections from outside the pod network to sandbox agents"
# the sets the agent fills from the API at run time; `check` compares them without elements
SANDBOX_SETS = ("sandbox_v4", "sandbox_v6", "podsrc_v4", "podsrc_v6")
# the pod ranges: the config's and the nodes' (hosts.py), which the config alone does not say
POD_SETS = ("pod_v4", "pod_v6")
# audit mode: what would have been refused, recorded by the kernel (source . port . sandbox)
AUDIT_OUTPUT, AUDIT_INBOUND = "audit_out", "audit_in"
AUDIT_SIZE = 4096  # per set: the newest sources beyond it are still counted, not recorded
AUDIT_SECONDS = 3600
AUDIT_COMMENT = "deathwatch audit:"  # then the kind and the port: what `audited` reads back
# the agent's own connection of its self-check (selfcheck.py) carries this mark: in audit mode
# counted on a rule of its own, never as a host's connection that would be refused
SELF_MARK = 0x64770001
SELF_COMMENT = "deathwatch self-check"
HOST, OUTSIDE, HOST_IN_POD_RANGE = "host", "outside", "host-in-pod-range"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_FAMILIES = (("ip", 4, "ipv4_addr", "v4"), ("ip6", 6, "ipv6_addr", "v6"))


def desired(
    config: FirewallConfig,
    sandboxes: Iterable[Address] = (),
    hosts: Iterable[Address] = (),
    table: str = NAME,
) -> Table:
    """Table inet `table` for `config`, this node's `sandboxes` and every node's `hosts`
    (their addresses inside the pod ranges)."""
    local, host = set(sandboxes), set(hosts)
    sets: list[Set] = []
    output: list[Rule] = []
    inbound: list[Rule] = []
    audit = config.mode == AUDIT
    agent = Match("tcp dport", ports(config.agent_ports))
    for proto, version, kind, suffix in _FAMILIES:
        pods = config.v4 if version == 4 else config.v6
        if not pods:
            continue
        sets.append(Set(f"pod_{suffix}", kind, ("interval",), _sorted(pods)))
        from_host = (Match(f"{proto} daddr", f"@pod_{suffix}"), Match("fib saddr type", "local"))
        if audit:
            sets.append(_audit_set(f"{AUDIT_OUTPUT}_{suffix}", kind))
            ours = Match("meta mark", ports([SELF_MARK]))
            output.append(Rule((agent, *from_host, ours), "", comment=SELF_COMMENT))
            others = (*from_host, Match("meta mark", ports([SELF_MARK]), "!="))
            output.extend(_audited(config, others, HOST, f"{AUDIT_OUTPUT}_{suffix}", proto))
        else:  # the port first: the host's other traffic leaves at one compare
            output.append(Rule((agent, *from_host), "reject with tcp reset", comment=COMMENT))
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
        to_sandbox = Match(f"{proto} daddr", f"@sandbox_{suffix}")
        not_pods = Match(f"{proto} saddr", f"@podsrc_{suffix}", "!=")
        allowed = config.allowed(version)
        if allowed:
            sets.append(Set(f"allowed_{suffix}", kind, ("interval",), _sorted(allowed)))
        but = (Match(f"{proto} saddr", f"@allowed_{suffix}", "!="),) if allowed else ()
        if audit:
            name = f"{AUDIT_INBOUND}_{suffix}"
            sets.append(_audit_set(name, kind))
            outside = Match(f"{proto} saddr", f"@pod_{suffix}", "!=")
            in_range = Match(f"{proto} saddr", f"@pod_{suffix}")
            inbound.extend(_audited(config, (to_sandbox, outside, *but), OUTSIDE, name, proto))
            inbound.extend(_audited(config, (to_sandbox, in_range, not_pods, *but),
                                    HOST_IN_POD_RANGE, name, proto))  # fmt: skip
        else:
            inbound.append(Rule((agent, to_sandbox, not_pods, *but), "reject with tcp reset",
                                comment=INBOUND_COMMENT))  # fmt: skip
    chains = [Chain(CHAIN, "filter", "output", PRIORITY, "accept", tuple(output))]
    if config.inbound:
        chains.append(Chain(INBOUND_CHAIN, "filter", "forward", PRIORITY, "accept", tuple(inbound)))
    return Table(tuple(sets), tuple(chains), table)


def _audit_set(name: str, kind: str) -> Set:
    """What the kernel records of each connection an audit rule counts."""
    return Set(name, f"{kind} . inet_service . {kind}", ("timeout",), size=AUDIT_SIZE,
               timeout=AUDIT_SECONDS, dynamic=True)  # fmt: skip


def _audited(config: FirewallConfig, matches: tuple[Match, ...], source: str, record: str,
             proto: str) -> list[Rule]:  # fmt: skip
    """One rule per agent port: counted, recorded, let through (no verdict)."""
    update = f"update @{record} {{ {proto} saddr . tcp dport . {proto} daddr }}"
    first = Match("ct state", "new")
    rules = []
    for port in config.agent_ports:
        comment = f"{AUDIT_COMMENT} {source} {port}"
        tests = (Match("tcp dport", ports([port])), *matches, first)
        rules.append(Rule(tests, "", comment=comment, statements=(update,)))
    return rules


def audited(table: Table | None) -> dict[tuple[str, int], int]:
    """What each audit rule of a live table counted: (kind, port) -> connections."""
    counted: dict[tuple[str, int], int] = {}
    for chain in table.chains if table else ():
        for rule in chain.rules:
            if rule.comment and rule.comment.startswith(AUDIT_COMMENT):
                kind, port = rule.comment[len(AUDIT_COMMENT) :].split()
                counted[(kind, int(port))] = counted.get((kind, int(port)), 0) + rule.packets
    return counted


def recorded(table: Table | None) -> list[tuple[str, str, int, str]]:
    """The connections the audit sets of a live table recorded: (chain, source, port,
    sandbox), chain `out` (this host) or `in` (inbound)."""
    found = []
    for s in table.sets if table else ():
        if s.name.startswith(("audit_out_", "audit_in_")):
            chain = "out" if s.name.startswith("audit_out_") else "in"
            for element in s.elements:
                source, port, sandbox = (part.strip() for part in element.split(" . "))
                found.append((chain, source, int(port), sandbox))
    return found


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
