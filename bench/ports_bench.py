#!/usr/bin/env python3
"""The controller's own delay under a hostile neighbour, against quiet, in one run (ADR 0020).

    python3 -m bench.ports_bench [--pods N] [--deaths N] [--json]

The real local control plane; the controller as a process under its ServiceAccount (shipped
RBAC), with containerd 2.x's open-files limit (soft 1,024), tracking N sandboxes. Phases:
quiet, then each attack of hack/localcluster/attacks.py against its metrics port (a niced
process, as a neighbour pod's would be): `flood` (64 keep-alive clients on /metrics,
/readyz, /healthz), `slowloris` (1,100 unfinished requests held open, opened again when cut),
`tokens` (8 clients, a made-up bearer token each request). In each phase `--deaths`
sandboxes die, 5 a second (the kubelet player writes their exit). The bench's own watches
time each pod's death and its verdict turning Dead: the difference is the controller's own
delay (what any watcher pays for the pod event is not in it). Also per phase: the kubelet's
probe on the health port (/healthz every 1 s, 2 s timeout), the controller's CPU seconds and
open descriptors, and what the attack got.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config

from bench.controller_bench import NS, TIMEOUT, Watcher, create_ready, statuses, wait_alive
from bench.stats import summary
from hack.localcluster import controlplane
from hack.localcluster.attacks import Attack, Poller
from hack.localcluster.controller_process import (
    ControllerProcess,
    metrics_reader_token,
    service_account_kubeconfig,
)

ROOT = Path(__file__).resolve().parent.parent
PHASES = (("quiet", 0), ("flood", 64), ("slowloris", 1100), ("tokens", 8))
OPEN_FILES = (1024, 8192)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pods", type=int, default=600, help="sandboxes tracked (default 600)")
    ap.add_argument("--deaths", type=int, default=60, help="deaths per phase (default 60)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.pods < args.deaths * len(PHASES):
        ap.error(f"--pods: at least --deaths x {len(PHASES)} ({args.deaths * len(PHASES)})")

    work = Path(tempfile.mkdtemp(prefix="deathwatch-ports-bench-"))
    cp = controlplane.ControlPlane(work / "cp")
    ctrl: ControllerProcess | None = None
    watchers: list[Watcher] = []
    try:
        cp.start()
        cp.kubectl_run("apply", "--server-side", "-f", str(ROOT / "manifests" / "base" / "crds"))
        cp.kubectl_run("wait", "--for=condition=Established", "crd/deathwatches.deathwatch.dev",
                       "crd/sandboxverdicts.deathwatch.dev")  # fmt: skip
        cp.kubectl_run("create", "namespace", "deathwatch-system")
        for role in ("controller.yaml", "metrics-reader.yaml"):
            cp.kubectl_run("apply", "-f", str(ROOT / "manifests" / "base" / "rbac" / role))
        cp.kubectl_run("create", "namespace", NS)
        cp.kubectl_run("create", "rolebinding", "deathwatch-controller", "-n", NS,
                       "--clusterrole=deathwatch-controller",
                       "--serviceaccount=deathwatch-system:deathwatch-controller")  # fmt: skip
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=configuration)
        configuration.connection_pool_maxsize = 16
        api = client.ApiClient(configuration)
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        while True:
            try:
                core.read_namespaced_service_account("default", NS, _request_timeout=TIMEOUT)
                break
            except client.ApiException:
                time.sleep(0.1)
        kubeconfig = service_account_kubeconfig(
            cp, api, "deathwatch-system", "deathwatch-controller", work / "controller.kubeconfig"
        )
        ctrl = ControllerProcess(kubeconfig, [NS], work / "controller.log",
                                 reader_token=metrics_reader_token(api),
                                 open_files=OPEN_FILES).start()  # fmt: skip
        assert ctrl.proc is not None
        pid = ctrl.proc.pid
        cp.kubectl_run("apply", "-f", "-", input=(
            f"apiVersion: deathwatch.dev/v1alpha1\nkind: DeathWatch\nmetadata: {{name: bench, "
            f"namespace: {NS}}}\nspec: {{podSelector: {{matchLabels: {{app: sandbox}}}}}}\n"))  # fmt: skip
        names = [f"p-{i:05d}" for i in range(args.pods)]
        scripts = create_ready(core, names)
        wait_alive(custom, args.pods, 300)
        # the reader scrapes once before any attack, as Prometheus would have: a known reader
        ctrl.metric("deathwatch_http_authorizations_total")

        def pod_dead(obj: Any) -> str | None:
            statuses_ = obj.status.container_statuses or []
            return obj.metadata.name if any(s.state.terminated for s in statuses_) else None

        def verdict_dead(obj: Any) -> str | None:
            return (
                obj["metadata"]["name"]
                if (obj.get("status") or {}).get("state") == "Dead"
                else None
            )

        pods = Watcher(core.list_namespaced_pod, NS, key=pod_dead)
        verdicts = Watcher(custom.list_namespaced_custom_object, "deathwatch.dev", "v1alpha1", NS,
                           "sandboxverdicts", key=verdict_dead)  # fmt: skip
        watchers = [pods, verdicts]
        for w in watchers:
            w.start()
        time.sleep(2)  # both watches established before the first death
        results: dict[str, Any] = {}
        for phase, (kind, connections) in enumerate(PHASES):
            dying = names[phase * args.deaths : (phase + 1) * args.deaths]
            attack = Attack(kind, ctrl.url, connections) if connections else None
            with Poller(ctrl.health_url + "/healthz") as probe:
                if attack is not None:
                    attack.start()
                    # under way: its connections held (the controller's own count)
                    deadline = time.monotonic() + 60
                    while ctrl.metric("deathwatch_http_open_connections",
                                      listener="metrics") < min(connections, 64):  # fmt: skip
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"{kind}: not under way in 60 s")
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
                fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
                said = attack.stop() if attack is not None else {}
            delays = [(verdicts.seen[n] - pods.seen[n]) * 1000 for n in dying
                      if n in verdicts.seen and n in pods.seen]  # fmt: skip
            results[kind] = {
                "judged": f"{len(delays)}/{len(dying)}",
                "own_delay_ms": summary(delays),
                "controller_cpu_share": round(used / elapsed, 3),
                "open_fds": fds,
                "probe": {
                    "polls": len(probe.results),
                    "failures": probe.failures,
                    "longest_failing_run": probe.longest_failing_run,
                    "slowest_s": round(probe.slowest, 3),
                },
                "attack": said,
            }
        quiet = results["quiet"]["own_delay_ms"]
        for kind, _ in PHASES[1:]:
            p99 = results[kind]["own_delay_ms"]["p99"]
            results[kind]["p99_vs_quiet"] = {
                "ratio": round(p99 / quiet["p99"], 2) if quiet["p99"] else None,
                "added_ms": round(p99 - quiet["p99"], 1),
                "within_max_3x_or_100ms": p99 <= max(3 * quiet["p99"], quiet["p99"] + 100),
            }
        # the attack has stopped; the reader (known since the quiet phase) reads at once
        results["reviews_made"] = ctrl.metric("deathwatch_http_authorizations_total",
                                              decision="reviewed")  # fmt: skip
        if args.json:
            print(json.dumps(results, indent=1))
        else:
            for kind, r in results.items():
                print(kind, json.dumps(r))
        return 0
    finally:
        for w in watchers:
            w.stop = True
        if ctrl is not None:
            ctrl.stop()
        cp.stop()


if __name__ == "__main__":
    raise SystemExit(main())
