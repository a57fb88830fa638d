#!/usr/bin/env python3
"""Firewall benchmark on real nftables in network namespaces (needs root).

    python3 -m bench.firewall_bench [--connects N] [--rounds R] [--json]

Measures, on two nodes built like tests/netns/test_firewall.py (routed wiring; A runs the
table with its sandbox in the inbound set, B runs nothing):
- refusal latency of each rule, N connects, p50/p95/p99 (each a connect() that gets a TCP
  reset; goal p95 <= 40 us): output (A's host -> A's sandbox agent port) and inbound (B's
  host -> A's sandbox agent port, refused on A);
- pod -> sandbox agent port connect latency without and with the table, alternating R rounds
  of N connects each, for a pod on the same node and one on the other node (whose packets
  pass the inbound chain's set lookups), and the ratios (goal: overhead <= 2%). In the same
  rounds, the shipped table (the inbound rule tests the port, then this node's sandboxes,
  then the source against the pod ranges minus 100 nodes' host addresses) and, for
  comparison, the keys considered instead: the source first, only new connections
  (`ct state new` first), only connection attempts (SYN first), and the chains with no rule
  at all (what any table in these hooks costs);
- with --node-conntrack, every arm ("without" included) also runs a table that tracks
  connections, as kube-proxy and CNIs make every real node do;
- the time of one atomic table replacement (`nft -f` of the rendered script), best and median.
Connects are timed inside the namespaces by hack/localcluster/netns_tool.py (Python sockets:
the numbers include Python's own per-call cost, the same in both arms of every ratio).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from ipaddress import ip_address
from pathlib import Path
from typing import Any

from bench.stats import percentile
from deathwatch.firewall.config import parse_config
from deathwatch.firewall.ruleset import INBOUND_CHAIN, desired
from deathwatch.firewall.table import Chain, Match, Table
from deathwatch.firewall.table import script as nft_script
from hack.localcluster.netnode import AGENT_PORT, TOOL, Node, netns_available, two_nodes

ROOT = Path(__file__).resolve().parent.parent


def connects(n: Node, ns: str, host: str, port: int, count: int) -> dict[str, object]:
    out = n.ns_exec(
        ns, sys.executable, str(TOOL), "connects", host, str(port), str(count), timeout=600
    ).stdout
    result: dict[str, object] = json.loads(out)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--connects", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--refusals", type=int, default=4000, help="connects refused, per rule")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--node-conntrack", action="store_true",
        help="run a connection-tracking table in every arm, as kube-proxy and CNIs do on every "
        "real node (without it, the node of the bench tracks no connections)",
    )  # fmt: skip
    args = ap.parse_args()
    reason = netns_available()
    if reason:
        print(f"firewall bench: {reason}", file=sys.stderr)
        return 2
    with two_nodes("routed") as (n, b), tempfile.TemporaryDirectory() as tmp:
        assert n.sandbox is not None
        assert n.ordinary is not None
        assert b.ordinary is not None
        sandbox = n.sandbox
        n.listen(sandbox)
        pods = {"same_node": n.ordinary.ns, "other_node": b.ordinary.ns}
        for ns in (*pods.values(), b.host):
            n.wait_reachable(ns, sandbox.v4, AGENT_PORT)
        if args.node_conntrack:
            # what every Kubernetes node already runs (kube-proxy's and the CNI's NAT): the
            # connection tracker, in every arm, "without" included
            baseline = Path(tmp) / "node.nft"
            baseline.write_text(NODE_CONNTRACK)
            n.nft("-f", str(baseline))
        config = parse_config({"podCIDRs": n.pod_cidrs, "agentPorts": [AGENT_PORT]})
        # a 100-node cluster's hosts in the pod range (flannel .0, bridge gateway .1 of each
        # node's /24): what the shipped rule takes out of the pod sources
        hosts = [ip_address(f"10.244.{i}.{o}") for i in range(10, 110) for o in (0, 1)]
        shipped = desired(config, [ip_address(sandbox.v4)], hosts)
        tables = {
            "shipped": shipped,
            "source_first": _source_first(shipped),
            "ct_new_first": _judged_first(shipped, Match("ct state", "new")),
            "syn_first": _judged_first(shipped, SYN),
            "hooks_only": _hooks_only(shipped),
        }
        scripts = {}
        for name, table in tables.items():
            scripts[name] = Path(tmp) / f"{name}.nft"
            scripts[name].write_text(nft_script(table))

        def apply(which: str = "shipped") -> float:
            started = time.perf_counter()
            n.nft("-f", str(scripts[which]))
            return time.perf_counter() - started

        def unrule() -> None:
            n.nft("delete", "table", "inet", "deathwatch", check=False)

        def latencies(ns: str, count: int, port: int = AGENT_PORT) -> list[float]:
            return connects(n, ns, sandbox.v4, port, count)["latencies_us"]  # type: ignore[return-value]

        # pod -> pod, without the table and with each, taking turns to share the machine's
        # drift (which arm goes first rotates too); each round pairs every table with the
        # "without" of the same round, and the ratio reported is the median of those rounds'
        # p50 ratios
        names = ("without", *tables)
        samples: dict[str, dict[str, list[float]]] = {a: {k: [] for k in pods} for a in names}
        paired: dict[str, dict[str, list[float]]] = {a: {k: [] for k in pods} for a in tables}
        for i in range(args.rounds):
            arms: dict[str, dict[str, list[float]]] = {}
            for arm in names[i % len(names) :] + names[: i % len(names)]:
                if arm == "without":
                    unrule()
                else:
                    apply(arm)
                arms[arm] = {k: latencies(ns, args.connects) for k, ns in pods.items()}
            for arm in names:
                for k in pods:
                    samples[arm][k] += arms[arm][k]
            for arm in tables:
                for k in pods:
                    paired[arm][k].append(
                        percentile(arms[arm][k], 50) / percentile(arms["without"][k], 50)
                    )
        without, _with_rule = samples["without"], samples["shipped"]
        apply()  # the last round may have ended without the table
        refusals = {
            "output": connects(n, n.host, sandbox.v4, AGENT_PORT, args.refusals),
            "inbound": connects(n, b.host, sandbox.v4, AGENT_PORT, args.refusals),
        }
        applies = [apply() for _ in range(max(args.rounds, 5))]
        # connects that are not refused, to another port, for scale
        host_other = latencies(n.host, args.connects, 8080)

    def refusal(r: dict[str, object]) -> dict[str, object]:
        us: list[float] = r["latencies_us"]  # type: ignore[assignment]
        return {
            "connects": len(us),
            "outcomes": r["outcomes"],
            "p50_us": round(percentile(us, 50), 1),
            "p95_us": round(percentile(us, 95), 1),
            "p99_us": round(percentile(us, 99), 1),
        }

    def overhead(k: str, arm: str = "shipped") -> dict[str, object]:
        w, o = samples[arm][k], without[k]
        return {
            "connects_each": len(o),
            "without_rule_p50_us": round(percentile(o, 50), 1),
            "with_rule_p50_us": round(percentile(w, 50), 1),
            "without_rule_mean_us": round(statistics.fmean(o), 2),
            "with_rule_mean_us": round(statistics.fmean(w), 2),
            "with_over_without_p50": round(percentile(w, 50) / percentile(o, 50), 4),
            "paired_rounds": len(paired[arm][k]),
            "with_over_without_p50_paired_median": round(statistics.median(paired[arm][k]), 4),
            "with_over_without_mean": round(statistics.fmean(w) / statistics.fmean(o), 4),
        }

    result: dict[str, Any] = {
        "refusal": {k: refusal(v) for k, v in refusals.items()},
        "host_to_other_port_connect_p50_us": round(percentile(host_other, 50), 1),
        "pod_to_pod": {k: overhead(k) for k in pods},
        "pod_to_pod_source_first": {k: overhead(k, "source_first") for k in pods},
        "pod_to_pod_judging_only_ct_state_new": {k: overhead(k, "ct_new_first") for k in pods},
        "pod_to_pod_hooks_without_rules": {k: overhead(k, "hooks_only") for k in pods},
        "pod_to_pod_judging_only_syn": {k: overhead(k, "syn_first") for k in pods},
        "node_conntrack": args.node_conntrack,
        "host_addresses_taken_out": len(hosts),
        "atomic_apply_ms": {
            "best": round(min(applies) * 1e3, 2),
            "median": round(statistics.median(applies) * 1e3, 2),
            "note": "includes starting the nft process",
        },
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for name, r in result["refusal"].items():
        print(f"refusal by the {name} rule (TCP reset), {r['connects']} connects {r['outcomes']}:")
        print(f"  p50 {r['p50_us']} us  p95 {r['p95_us']} us  p99 {r['p99_us']} us")
    print(
        f"  (for scale: a host connect that succeeds, p50 {result['host_to_other_port_connect_p50_us']} us)"
    )
    for key, what in (("pod_to_pod", "the shipped rule (port first)"),
                      ("pod_to_pod_source_first", "the source first"),
                      ("pod_to_pod_judging_only_ct_state_new", "ct state new first"),
                      ("pod_to_pod_hooks_without_rules", "the chains with no rule"),
                      ("pod_to_pod_judging_only_syn", "SYN first")):  # fmt: skip
        for name, p in result[key].items():
            print(
                f"pod ({name}) -> sandbox agent port, {what}, {p['connects_each']} connects each:"
            )
            print(
                f"  without p50 {p['without_rule_p50_us']} us, with p50 {p['with_rule_p50_us']} us: "
                f"paired median ratio {p['with_over_without_p50_paired_median']} "
                f"(pooled p50 {p['with_over_without_p50']}, mean {p['with_over_without_mean']})"
            )
    a = result["atomic_apply_ms"]
    print(f"atomic apply (nft -f, whole table): best {a['best']} ms, median {a['median']} ms")
    return 0


NODE_CONNTRACK = """table inet bench_node {
  chain forward {
    type filter hook forward priority 10; policy accept;
    ct state invalid counter
  }
}
"""


def _hooks_only(table: Table) -> Table:
    """The shipped table's sets and chains with no rule: what any table in these hooks costs."""
    return Table(table.sets, tuple(replace(c, rules=()) for c in table.chains))


SYN = Match("tcp flags & (syn | ack)", "syn")  # a connection's first packet, no conntrack


def _judged_first(table: Table, first: Match) -> Table:
    """The inbound rule judging only the packets `first` matches, for cost."""

    def judged(chain: Chain) -> Chain:
        if chain.name != INBOUND_CHAIN:
            return chain
        return replace(
            chain, rules=tuple(replace(r, matches=(first, *r.matches)) for r in chain.rules)
        )

    return Table(table.sets, tuple(judged(c) for c in table.chains))


def _source_first(table: Table) -> Table:
    """The inbound rule testing the source first (a pod's packets would leave at one interval
    lookup), for comparison in the same rounds."""

    def reordered(chain: Chain) -> Chain:
        if chain.name != INBOUND_CHAIN:
            return chain
        rules = []
        for rule in chain.rules:
            port, sandbox, source, *rest = rule.matches
            rules.append(replace(rule, matches=(source, port, sandbox, *rest)))
        return replace(chain, rules=tuple(rules))

    return Table(table.sets, tuple(reordered(c) for c in table.chains))


if __name__ == "__main__":
    sys.exit(main())
