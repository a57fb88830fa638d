#!/usr/bin/env python3
"""A mass death: D of N sandboxes die at once; how long until the last is judged Dead.

    python3 -m bench.mass_death [--pods N] [--die D] [--writers W] [--code REV] [--json]

The real local control plane; the controller as a process under its ServiceAccount (shipped
RBAC), one DeathWatch over N sandboxes, all Alive first. Then the bench plays the kubelet of a
failing node pool: D pods' statuses written with their exit, by W writers as fast as the API
server takes them (the burst). Its own watches time each pod's death and its verdict turning
Dead. Reported: the burst's own length, the last verdict after the burst began (issue #43's
measure: within 5 s for 500 of 1,500 on this machine), each verdict after its pod's death
(the controller's own delay), the controller's writes and CPU over it, and every death
judged once with its Event once.

`--code REV` runs the controller from another revision's source: the before of a change.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.controller_bench import NS, TIMEOUT, create_ready, statuses, wait_alive
from bench.controller_cluster import code_at, controller_cluster
from bench.stats import summary
from hack.localcluster.controller_process import ControllerProcess
from hack.localcluster.procstat import cpu_seconds


def writes(ctrl: ControllerProcess) -> float:
    return ctrl.metric("deathwatch_api_writes_total")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pods", type=int, default=1500, help="sandboxes tracked (default 1500)")
    ap.add_argument("--die", type=int, default=500, help="of them dying at once (default 500)")
    ap.add_argument("--writers", type=int, default=16, help="the burst's writers (default 16)")
    ap.add_argument("--code", metavar="REV", help="run the controller from REV")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not 0 < args.die <= args.pods:
        ap.error(f"--die: between 1 and --pods ({args.pods}), got {args.die}")

    work = Path(tempfile.mkdtemp(prefix="deathwatch-mass-death-"))
    pythonpath = code_at(args.code, work / "code") if args.code else ()
    with controller_cluster(work, pythonpath, pool=args.writers + 4) as cluster:
        ctrl, core, pid = cluster.ctrl, cluster.core, cluster.pid
        names = [f"p-{i:05d}" for i in range(args.pods)]
        scripts = create_ready(core, names)
        wait_alive(cluster.custom, args.pods, 600)
        pods, verdicts = cluster.watch_deaths()
        time.sleep(1)  # the controller at rest
        dying = names[: args.die]
        written0, cpu0 = writes(ctrl), cpu_seconds(pid)

        def kill(name: str) -> float:
            core.patch_namespaced_pod_status(
                name, NS, {"status": statuses(scripts[name])[1]}, _request_timeout=TIMEOUT
            )
            return time.monotonic()

        began = time.monotonic()
        with ThreadPoolExecutor(args.writers) as pool:
            written = list(pool.map(kill, dying))
        burst = max(written) - began
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(n in verdicts.seen for n in dying):
            time.sleep(0.05)
        judged = [n for n in dying if n in verdicts.seen]
        last = max((verdicts.seen[n] for n in judged), default=float("nan")) - began
        time.sleep(3)  # the Events and the DeathWatch status after the last verdict
        events = core.list_namespaced_event(
            NS, field_selector="reason=SandboxDead", _request_timeout=(5, 120)
        ).items
        per_pod: dict[str, int] = {}
        for e in events:
            per_pod[e.involved_object.name] = per_pod.get(e.involved_object.name, 0) + (
                e.count or 1
            )
        own = [(verdicts.seen[n] - pods.seen[n]) * 1000 for n in judged if n in pods.seen]
        results = {
            "code": args.code or "this tree",
            "pods": args.pods,
            "died": args.die,
            "judged": f"{len(judged)}/{len(dying)}",
            "burst_s": round(burst, 2),
            "last_verdict_after_burst_began_s": round(last, 2),
            "verdict_after_burst_began_s": summary([(verdicts.seen[n] - began) for n in judged]),
            "own_delay_ms": summary(own),
            "deaths_with_one_event": sum(1 for n in dying if per_pod.get(n) == 1),
            "deaths_with_more_events": sum(1 for n in dying if per_pod.get(n, 0) > 1),
            "controller_writes": writes(ctrl) - written0,
            "controller_cpu_s": round(cpu_seconds(pid) - cpu0, 2),
        }
        print(json.dumps(results, indent=1 if args.json else None))
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
