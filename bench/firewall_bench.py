#!/usr/bin/env python3
"""Firewall benchmark on real nftables in network namespaces (needs root).

    python3 -m bench.firewall_bench [--connects N] [--rounds R] [--json]

Measures, on two nodes built like tests/test_firewall_netns.py (routed wiring; A runs the
table with its sandbox in the inbound set, B runs nothing):
- refusal latency of each rule, N connects, p50/p95/p99 (each a connect() that gets a TCP
  reset; goal p95 <= 40 us): output (A's host -> A's sandbox agent port) and inbound (B's
  host -> A's sandbox agent port, refused on A);
- pod -> sandbox agent port connect latency without and with the table, alternating R rounds
  of N connects each, for a pod on the same node and one on the other node (whose packets
  pass the inbound chain's set lookups), and the ratios (goal: overhead <= 2%);
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
from ipaddress import ip_address
from pathlib import Path
from typing import Any

from bench.stats import percentile
from deathwatch.firewall.config import parse_config
from deathwatch.firewall.ruleset import desired
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
    ap.add_argument("--json", action="store_true")
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
        config = parse_config({"podCIDRs": n.pod_cidrs, "agentPorts": [AGENT_PORT]})
        script = Path(tmp) / "table.nft"
        script.write_text(nft_script(desired(config, [ip_address(sandbox.v4)])))

        def apply() -> float:
            started = time.perf_counter()
            n.nft("-f", str(script))
            return time.perf_counter() - started

        def unrule() -> None:
            n.nft("delete", "table", "inet", "deathwatch", check=False)

        def latencies(ns: str, count: int, port: int = AGENT_PORT) -> list[float]:
            return connects(n, ns, sandbox.v4, port, count)["latencies_us"]  # type: ignore[return-value]

        # pod -> pod, without and with the table, alternating to share the machine's drift
        # (and which arm goes first alternates too); each round pairs one arm with the other,
        # and the ratio reported is the median of the paired rounds' p50 ratios
        without: dict[str, list[float]] = {k: [] for k in pods}
        with_rule: dict[str, list[float]] = {k: [] for k in pods}
        paired: dict[str, list[float]] = {k: [] for k in pods}
        for i in range(args.rounds):
            arms: dict[str, dict[str, list[float]]] = {}
            for arm in ("without", "with") if i % 2 == 0 else ("with", "without"):
                if arm == "without":
                    unrule()
                else:
                    apply()
                arms[arm] = {k: latencies(ns, args.connects) for k, ns in pods.items()}
            for k in pods:
                without[k] += arms["without"][k]
                with_rule[k] += arms["with"][k]
                paired[k].append(
                    percentile(arms["with"][k], 50) / percentile(arms["without"][k], 50)
                )
        apply()  # the last round may have ended without the table
        refusals = {
            "output": connects(n, n.host, sandbox.v4, AGENT_PORT, 4000),
            "inbound": connects(n, b.host, sandbox.v4, AGENT_PORT, 4000),
        }
        applies = [apply() for _ in range(50)]
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

    def overhead(k: str) -> dict[str, object]:
        w, o = with_rule[k], without[k]
        return {
            "connects_each": len(o),
            "without_rule_p50_us": round(percentile(o, 50), 1),
            "with_rule_p50_us": round(percentile(w, 50), 1),
            "without_rule_mean_us": round(statistics.fmean(o), 2),
            "with_rule_mean_us": round(statistics.fmean(w), 2),
            "with_over_without_p50": round(percentile(w, 50) / percentile(o, 50), 4),
            "paired_rounds": len(paired[k]),
            "with_over_without_p50_paired_median": round(statistics.median(paired[k]), 4),
            "with_over_without_mean": round(statistics.fmean(w) / statistics.fmean(o), 4),
        }

    result: dict[str, Any] = {
        "refusal": {k: refusal(v) for k, v in refusals.items()},
        "host_to_other_port_connect_p50_us": round(percentile(host_other, 50), 1),
        "pod_to_pod": {k: overhead(k) for k in pods},
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
    for name, p in result["pod_to_pod"].items():
        print(f"pod ({name}) -> sandbox agent port, {p['connects_each']} connects each:")
        print(
            f"  without p50 {p['without_rule_p50_us']} us, with p50 {p['with_rule_p50_us']} us: "
            f"ratio {p['with_over_without_p50']} (mean ratio {p['with_over_without_mean']})"
        )
    a = result["atomic_apply_ms"]
    print(f"atomic apply (nft -f, whole table): best {a['best']} ms, median {a['median']} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
