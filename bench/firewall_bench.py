#!/usr/bin/env python3
"""Firewall benchmark on real nftables in network namespaces (needs root).

    python3 -m bench.firewall_bench [--connects N] [--rounds R] [--json]

Measures, on a node built like tests/test_firewall_netns.py (routed wiring):
- refusal latency: host -> sandbox agent port with the rule in force, N connects, p50/p95/p99
  (each a connect() that gets a TCP reset; the field notes measured p95 <= 40 us);
- ordinary pod -> sandbox agent port connect latency without and with the rule, alternating
  R rounds of N connects each, and the ratio (the rule must not touch forwarded traffic);
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
from pathlib import Path
from typing import Any

from bench.stats import percentile
from deathwatch.firewall.config import parse_config
from deathwatch.firewall.ruleset import desired
from deathwatch.firewall.table import script as nft_script
from hack.localcluster.netnode import AGENT_PORT, TOOL, Node, netns_available, node

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
    ap.add_argument("--connects", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    reason = netns_available()
    if reason:
        print(f"firewall bench: {reason}", file=sys.stderr)
        return 2
    with node("routed") as n, tempfile.TemporaryDirectory() as tmp:
        assert n.sandbox is not None
        assert n.ordinary is not None
        n.listen(n.sandbox)
        n.wait_reachable(n.ordinary.ns, n.sandbox.v4, AGENT_PORT)
        config = parse_config({"podCIDRs": n.pod_cidrs, "agentPorts": [AGENT_PORT]})
        script = Path(tmp) / "table.nft"
        script.write_text(nft_script(desired(config)))

        def apply() -> float:
            started = time.perf_counter()
            n.nft("-f", str(script))
            return time.perf_counter() - started

        def unrule() -> None:
            n.nft("delete", "table", "inet", "deathwatch", check=False)

        # pod -> pod, without and with the rule, alternating to share the machine's drift
        without: list[float] = []
        with_rule: list[float] = []
        for _ in range(args.rounds):
            unrule()
            without += connects(n, n.ordinary.ns, n.sandbox.v4, AGENT_PORT, args.connects)[
                "latencies_us"
            ]  # type: ignore[arg-type]
            apply()
            with_rule += connects(n, n.ordinary.ns, n.sandbox.v4, AGENT_PORT, args.connects)[
                "latencies_us"
            ]  # type: ignore[arg-type]
        refusals = connects(n, n.host, n.sandbox.v4, AGENT_PORT, args.connects * 2)
        refused_us: list[float] = refusals["latencies_us"]  # type: ignore[assignment]
        applies = [apply() for _ in range(50)]
        # one connect that is not refused, from the host to the other port, for scale
        host_other = connects(n, n.host, n.sandbox.v4, 8080, args.connects)

    result: dict[str, Any] = {
        "refusal": {
            "connects": len(refused_us),
            "outcomes": refusals["outcomes"],
            "p50_us": round(percentile(refused_us, 50), 1),
            "p95_us": round(percentile(refused_us, 95), 1),
            "p99_us": round(percentile(refused_us, 99), 1),
        },
        "host_to_other_port_connect_p50_us": round(percentile(host_other["latencies_us"], 50), 1),  # type: ignore[arg-type]
        "pod_to_pod": {
            "connects_each": len(without),
            "without_rule_p50_us": round(percentile(without, 50), 1),
            "with_rule_p50_us": round(percentile(with_rule, 50), 1),
            "without_rule_mean_us": round(statistics.fmean(without), 2),
            "with_rule_mean_us": round(statistics.fmean(with_rule), 2),
            "with_over_without_p50": round(percentile(with_rule, 50) / percentile(without, 50), 4),
            "with_over_without_mean": round(
                statistics.fmean(with_rule) / statistics.fmean(without), 4
            ),
        },
        "atomic_apply_ms": {
            "best": round(min(applies) * 1e3, 2),
            "median": round(statistics.median(applies) * 1e3, 2),
            "note": "includes starting the nft process",
        },
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    r, p, a = result["refusal"], result["pod_to_pod"], result["atomic_apply_ms"]
    print(f"refusal (host -> agent port, TCP reset), {r['connects']} connects {r['outcomes']}:")
    print(f"  p50 {r['p50_us']} us  p95 {r['p95_us']} us  p99 {r['p99_us']} us")
    print(
        f"  (for scale: a host connect that succeeds, p50 {result['host_to_other_port_connect_p50_us']} us)"
    )
    print(f"pod -> pod connect to the agent port, {p['connects_each']} each:")
    print(
        f"  without rule p50 {p['without_rule_p50_us']} us, with rule p50 {p['with_rule_p50_us']} us: ratio {p['with_over_without_p50']} (mean ratio {p['with_over_without_mean']})"
    )
    print(f"atomic apply (nft -f, whole table): best {a['best']} ms, median {a['median']} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
