#!/usr/bin/env python3
"""The controller's own delay and memory under a hostile neighbour, against quiet, in one run;
then the firewall agent's memory with every connection slot held (ADR 0020).

    python3 -m bench.ports_bench [--pods N] [--deaths N] [--code REV] [--no-agent] [--json]

The real local control plane; the controller as a process under its ServiceAccount (shipped
RBAC), with containerd 2.x's open-files limit (soft 1,024), tracking N sandboxes. Phases:
quiet, then each attack of hack/localcluster/attacks.py, its connections spread over the
metrics port (HTTPS) and the health port (a niced process, as a neighbour pod's would be):
`flood` (64 keep-alive clients on /metrics, /readyz, /healthz), `slowloris` (1,100
unfinished requests held open, opened again when cut) from one pod's address, then from 256
pods' (every slot of the port held), `tokens` (8 clients, a made-up bearer token each
request). The kubelet's probe comes from an address of its own, as on a node. In each phase `--deaths` sandboxes die, 5 a second (the kubelet player
writes their exit). The bench's own watches time each pod's death and its verdict turning
Dead: the difference is the controller's own delay (what any watcher pays for the pod event
is not in it). Also per phase: the kubelet's probe on the health port (/healthz every 1 s,
2 s timeout), the controller's CPU seconds, open descriptors, its resident memory at its
peak and once the attack has gone (its connections closed), and what the attack got.

The agent (root, a network namespace of its own; `--no-agent` skips it): its port under the
same attacks (the last past its connection cap, every slot held); its resident memory at the
peak and after, against its chart limit (128 MiB).

`--code REV` runs the controller and the agent from another revision's source (git archive
of kube/, controller/ and firewall/src): the before of a change, on the same machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.controller_bench import NS, TIMEOUT, create_ready, statuses, wait_alive
from bench.controller_cluster import code_at, controller_cluster
from bench.stats import summary
from hack.localcluster import controlplane
from hack.localcluster.attacks import Attack, Poller
from hack.localcluster.controller_process import (
    service_account_token,
)
from hack.localcluster.controlplane import free_port
from hack.localcluster.netnode import netns_available
from hack.localcluster.procstat import PeakRss, cpu_seconds, open_fds, rss_mib
from tests.firewall_node import FirewallNode

ROOT = Path(__file__).resolve().parent.parent
# (phase, attack, connections, the addresses they come from: one pod's, or many pods')
PHASES = (("quiet", "", 0, 1), ("flood", "flood", 64, 1), ("slowloris", "slowloris", 1100, 1),
          ("slowloris from 256 pods", "slowloris", 1100, 256), ("tokens", "tokens", 8, 1))  # fmt: skip
AGENT_PHASES = PHASES[:4]
AGENT_LIMIT_MIB = 128  # the chart's firewall.resources.limits.memory


def spread(kind: str, urls: list[str], connections: int, sources: int) -> list[Attack]:
    """The attack's connections spread over every port a neighbour reaches."""
    share, rest = divmod(connections, len(urls))
    return [Attack(kind, url, share + (i < rest), sources) for i, url in enumerate(urls)]


def held_enough(connections: int, sources: int) -> int:
    """Connections a port holds once an attack is under way: its share, as many as its
    addresses may hold (a few each), at most 32."""
    return min(connections // 2, 4 * sources, 32)


def settled_rss(pid: int, quiet_fds: int, within: float = 30) -> float:
    """Resident memory once the attack's connections are gone (descriptors back near quiet's,
    then a second for the last ones to end): what the process kept."""
    deadline = time.monotonic() + within
    while open_fds(pid) > quiet_fds + 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)
    return round(rss_mib(pid), 1)


def agent_phases(
    cp: controlplane.ControlPlane, api: client.ApiClient, work: Path,
    pythonpath: tuple[str, ...],
) -> dict[str, Any]:  # fmt: skip
    """The firewall agent's port: quiet, a flood, a slowloris past its cap; its memory."""
    cp.kubectl_run("apply", "-f", str(ROOT / "manifests" / "base" / "rbac" / "firewall.yaml"))
    token = work / "fw.token"
    token.write_text(service_account_token(api, "deathwatch-system", "deathwatch-firewall"))
    config = work / "fw.json"
    config.write_text(json.dumps({"podCIDRs": ["10.244.0.0/16"], "agentPorts": [49983],
                                  "resyncSeconds": 2, "sandboxSelector": f"run={NS}"}))  # fmt: skip
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    node = FirewallNode("ports-bench", work, config, cp.server, token, cp.certs / "ca.crt",
                        metrics_port=port, pythonpath=pythonpath)  # fmt: skip
    node.start()
    results: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with Poller(url + "/healthz", period=0.2) as up:
                    time.sleep(0.3)
                if up.results and up.results[0][1]:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the agent's port did not answer in 30 s")
        assert node.proc is not None
        pid = node.proc.pid
        time.sleep(3)  # its first table and Lease written: its working set
        quiet_fds, quiet_rss = open_fds(pid), round(rss_mib(pid), 1)
        for phase, kind, connections, sources in AGENT_PHASES:
            if not connections:
                results[phase] = {"rss_mib": quiet_rss, "open_fds": quiet_fds}
                continue
            with Poller(url + "/healthz") as probe, PeakRss(pid) as peak:
                attack = Attack(kind, url, connections, sources).start()
                time.sleep(15)
                held = open_fds(pid)
                said = attack.stop()
            results[phase] = {
                "peak_rss_mib": round(peak.peak, 1),
                "rss_after_mib": settled_rss(pid, quiet_fds),
                "open_fds_under_attack": held,
                "within_limit": peak.peak < AGENT_LIMIT_MIB,
                "probe": {
                    "polls": len(probe.results),
                    "failures": probe.failures,
                    "longest_failing_run": probe.longest_failing_run,
                },
                "attack": said,
            }
        results["alive"] = node.proc.poll() is None
        return results
    finally:
        node.destroy()
        with contextlib.suppress(client.ApiException):
            client.CoordinationV1Api(api).delete_namespaced_lease(
                "deathwatch-firewall.ports-bench", "deathwatch-system", _request_timeout=10
            )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pods", type=int, default=600, help="sandboxes tracked (default 600)")
    ap.add_argument("--deaths", type=int, default=60, help="deaths per phase (default 60)")
    ap.add_argument("--code", metavar="REV", help="run the controller and the agent from REV")
    ap.add_argument("--no-agent", action="store_true", help="skip the firewall agent's phases")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.pods < args.deaths * len(PHASES):
        ap.error(f"--pods: at least --deaths x {len(PHASES)} ({args.deaths * len(PHASES)})")

    work = Path(tempfile.mkdtemp(prefix="deathwatch-ports-bench-"))
    pythonpath = code_at(args.code, work / "code") if args.code else ()
    if not args.no_agent and netns_available():
        ap.error(f"the agent's phases: {netns_available()} (or --no-agent)")
    with controller_cluster(work, pythonpath) as cluster:
        cp, api, ctrl, pid = cluster.cp, cluster.api, cluster.ctrl, cluster.pid
        core, custom = cluster.core, cluster.custom
        names = [f"p-{i:05d}" for i in range(args.pods)]
        scripts = create_ready(core, names)
        wait_alive(custom, args.pods, 300)
        # the reader scrapes once before any attack, as Prometheus would have: a known reader
        ctrl.metric("deathwatch_http_authorizations_total")

        pods, verdicts = cluster.watch_deaths()
        results: dict[str, Any] = {"code": args.code or "this tree"}
        quiet_fds = open_fds(pid)
        for i, (phase, kind, connections, sources) in enumerate(PHASES):
            dying = names[i * args.deaths : (i + 1) * args.deaths]
            attacks = (spread(kind, [ctrl.url, ctrl.health_url], connections, sources)
                       if connections else [])  # fmt: skip
            with Poller(ctrl.health_url + "/healthz") as probe, PeakRss(pid) as peak:
                for attack in attacks:
                    attack.start()
                if attacks:
                    # under way: its connections held (the controller's own count)
                    deadline = time.monotonic() + 60
                    while ctrl.metric("deathwatch_http_open_connections",
                                      listener="metrics") < held_enough(connections, sources):  # fmt: skip
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"{phase}: not under way in 60 s")
                        time.sleep(0.2)
                cpu = cpu_seconds(pid)
                began = time.monotonic()
                for name in dying:
                    core.patch_namespaced_pod_status(
                        name, NS, {"status": statuses(scripts[name])[1]}, _request_timeout=TIMEOUT
                    )
                    time.sleep(0.2)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and not all(n in verdicts.seen for n in dying):
                    time.sleep(0.1)
                elapsed = time.monotonic() - began
                used = cpu_seconds(pid) - cpu
                fds = open_fds(pid)
                said = [attack.stop() for attack in attacks]
            delays = [(verdicts.seen[n] - pods.seen[n]) * 1000 for n in dying
                      if n in verdicts.seen and n in pods.seen]  # fmt: skip
            results[phase] = {
                "judged": f"{len(delays)}/{len(dying)}",
                "own_delay_ms": summary(delays),
                "controller_cpu_share": round(used / elapsed, 3),
                "open_fds": fds,
                "peak_rss_mib": round(peak.peak, 1),
                "rss_after_mib": settled_rss(pid, quiet_fds) if attacks else round(rss_mib(pid), 1),
                "probe": {
                    "polls": len(probe.results),
                    "failures": probe.failures,
                    "longest_failing_run": probe.longest_failing_run,
                    "slowest_s": round(probe.slowest, 3),
                },
                "attack": said,
            }
        quiet = results["quiet"]["own_delay_ms"]
        quiet_rss = results["quiet"]["rss_after_mib"]
        for kind, *_ in PHASES[1:]:  # by phase name
            p50, p99 = results[kind]["own_delay_ms"]["p50"], results[kind]["own_delay_ms"]["p99"]
            results[kind]["vs_quiet"] = {
                "p50_ratio": round(p50 / quiet["p50"], 2) if quiet["p50"] else None,
                "p99_ratio": round(p99 / quiet["p99"], 2) if quiet["p99"] else None,
                "p99_added_ms": round(p99 - quiet["p99"], 1),
                "p50_within_1.5x": p50 <= 1.5 * quiet["p50"],
                "p99_within_max_3x_or_100ms": p99 <= max(3 * quiet["p99"], quiet["p99"] + 100),
                "peak_rss_added_mib": round(results[kind]["peak_rss_mib"] - quiet_rss, 1),
                "rss_after_added_mib": round(results[kind]["rss_after_mib"] - quiet_rss, 1),
            }
        # the attack has stopped; the reader (known since the quiet phase) reads at once
        results["reviews_made"] = ctrl.metric("deathwatch_http_authorizations_total",
                                              decision="reviewed")  # fmt: skip
        if not args.no_agent:
            results["agent"] = agent_phases(cp, api, work, pythonpath)
        if args.json:
            print(json.dumps(results, indent=1))
        else:
            for kind, r in results.items():
                print(kind, json.dumps(r))
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
