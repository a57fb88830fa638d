#!/usr/bin/env python3
"""The controller on the real local control plane: verdict latency, API writes, memory.

    python3 -m bench.controller_bench [--pods N] [--rate R] [--seconds S] [--scale M] [--json]

1. Latency at load: N sandbox pods are made Ready, then the bench plays kubelet at R pod
   status writes per second for S seconds; one write in 10 kills a pod (terminated, exit 1),
   the others are status writes that change nothing a verdict depends on. For every death:
   the time from the bench's status write returning to the bench seeing the SandboxVerdict
   turn Dead on its own watch. Baseline, same run: the time from a status write returning to
   the bench seeing that pod change on its own pod watch (what any watcher pays).
2. API writes per sandbox lifecycle: the controller's own counters over the run / lifecycles.
3. Memory: the controller's RSS with no pods, and after M sandboxes are tracked (Alive).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from bench.stats import percentile
from deathwatch._engine.timeutil import format_time
from hack.localcluster import controlplane
from hack.localcluster.controller_process import ControllerProcess, metrics_reader_token
from hack.localcluster.procstat import rss_mib
from hack.localcluster.sandbox_script import Fate, SandboxScript, pod_manifest, timeline

ROOT = Path(__file__).resolve().parent.parent

NS = "bench"
TIMEOUT = (5, 30)


def statuses(script: SandboxScript) -> tuple[dict[str, Any], dict[str, Any]]:
    moments = [m.status for m in timeline(script) if m.status is not None]
    return moments[0], moments[-1]  # Ready, its fate


class Watcher(threading.Thread):
    """Timestamps events of one resource on the bench's own watch."""

    def __init__(self, fn: Any, *args: Any, key: Any) -> None:
        super().__init__(daemon=True)
        self.fn, self.args, self.key = fn, args, key
        self.seen: dict[str, float] = {}
        self.stop = False

    def run(self) -> None:
        while not self.stop:
            w = watch.Watch()
            try:
                for event in w.stream(
                    self.fn, *self.args, timeout_seconds=60, _request_timeout=(5, 90)
                ):
                    k = self.key(event["object"])
                    if k is not None and k not in self.seen:
                        self.seen[k] = time.monotonic()
                    if self.stop:
                        break
            except Exception:
                time.sleep(0.2)


def create_ready(
    core: client.CoreV1Api, names: list[str], fate: Fate = Fate.EXITS, namespace: str = NS
) -> dict[str, SandboxScript]:
    scripts = {}
    start = datetime.now(UTC).replace(microsecond=0)
    for name in names:
        s = SandboxScript(name=name, namespace=namespace, fate=fate, start=start)
        core.create_namespaced_pod(namespace, pod_manifest(s), _request_timeout=TIMEOUT)
        core.patch_namespaced_pod_status(
            name, namespace, {"status": statuses(s)[0]}, _request_timeout=TIMEOUT
        )
        scripts[name] = s
    return scripts


def wait_alive(
    custom: client.CustomObjectsApi, count: int, timeout: float, namespace: str = NS
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        items = custom.list_namespaced_custom_object(
            "deathwatch.dev", "v1alpha1", namespace, "sandboxverdicts", _request_timeout=(5, 120)
        )["items"]
        alive = sum(1 for i in items if i.get("status", {}).get("state") == "Alive")
        if alive >= count:
            return
        time.sleep(1)
    raise TimeoutError(f"only {alive} of {count} verdicts Alive after {timeout}s")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pods", type=int, default=600)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument(
        "--scale", type=int, default=10000, help="sandboxes tracked for the memory measurement"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="deathwatch-bench-"))
    cp = controlplane.ControlPlane(work / "cp")
    ctrl: ControllerProcess | None = None
    try:
        cp.start()
        cp.kubectl_run("apply", "--server-side", "-f", str(ROOT / "manifests" / "base" / "crds"))
        cp.kubectl_run(
            "wait",
            "--for=condition=Established",
            "crd/deathwatches.deathwatch.dev",
            "crd/sandboxverdicts.deathwatch.dev",
        )
        cp.kubectl_run("create", "namespace", NS)
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
        cp.kubectl_run("create", "namespace", "deathwatch-system", check=False)
        cp.kubectl_run("apply", "-f", str(ROOT / "manifests/base/rbac/metrics-reader.yaml"))
        ctrl = ControllerProcess(cp.kubeconfig, [NS], work / "controller.log",
                                 reader_token=metrics_reader_token(api)).start()  # fmt: skip
        time.sleep(2)  # settle before the idle measurement
        idle_rss = rss_mib(ctrl.proc.pid)  # type: ignore[union-attr]
        cp.kubectl_run(
            "apply", "-f", "-",
            input=f"apiVersion: deathwatch.dev/v1alpha1\nkind: DeathWatch\nmetadata: {{name: bench, namespace: {NS}}}\nspec: {{podSelector: {{matchLabels: {{app: sandbox}}}}}}\n",
        )  # fmt: skip

        # --- 1. latency at R status events per second -------------------------------------
        names = [f"lat-{i:05d}" for i in range(args.pods)]
        scripts = create_ready(core, names)
        wait_alive(custom, args.pods, 300)
        writes_before = {
            op: ctrl.metric("deathwatch_api_writes_total", operation=op)
            for op in ("create_verdict", "patch_verdict_status", "create_event")
        }
        pods_seen = Watcher(
            core.list_namespaced_pod,
            NS,
            key=lambda o: f"{o.metadata.name}/{o.metadata.resource_version}",
        )
        dead_seen = Watcher(
            custom.list_namespaced_custom_object, "deathwatch.dev", "v1alpha1", NS, "sandboxverdicts",
            key=lambda o: o["metadata"]["name"] if o.get("status", {}).get("state") == "Dead" else None,
        )  # fmt: skip
        pods_seen.start()
        dead_seen.start()
        time.sleep(1)
        death_writes: dict[str, float] = {}
        noop_writes: dict[str, float] = {}
        interval = 1.0 / args.rate
        total = int(args.rate * args.seconds)
        victims = iter(names)
        started = time.monotonic()
        for i in range(total):
            target = started + i * interval
            now = time.monotonic()
            if target > now:
                time.sleep(target - now)
            if i % 10 == 0:
                name = next(victims, None)
                if name is None:
                    break
                pod = core.patch_namespaced_pod_status(
                    name, NS, {"status": statuses(scripts[name])[1]}, _request_timeout=TIMEOUT
                )
                death_writes[name] = time.monotonic()
            else:
                name = names[(i * 7919) % len(names)]
                if name in death_writes:
                    continue
                status = copy.deepcopy(statuses(scripts[name])[0])
                status["conditions"][0]["lastTransitionTime"] = format_time(
                    datetime.now(UTC)
                )  # PodReadyToStartContainers
                pod = core.patch_namespaced_pod_status(
                    name, NS, {"status": status}, _request_timeout=TIMEOUT
                )
                noop_writes[f"{name}/{pod.metadata.resource_version}"] = time.monotonic()
        achieved_rate = total / (time.monotonic() - started)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(n in dead_seen.seen for n in death_writes):
            time.sleep(0.1)
        verdict_ms = [
            (dead_seen.seen[n] - t) * 1e3 for n, t in death_writes.items() if n in dead_seen.seen
        ]
        watch_ms = [
            (pods_seen.seen[k] - t) * 1e3 for k, t in noop_writes.items() if k in pods_seen.seen
        ]
        pods_seen.stop = dead_seen.stop = True
        time.sleep(2)
        writes = {
            op: ctrl.metric("deathwatch_api_writes_total", operation=op) - writes_before[op]
            for op in writes_before
        }
        deaths = len(verdict_ms)

        # --- 2. writes per lifecycle (create .. Alive .. Dead), from the controller's counters
        lifecycle_writes = {
            "create_verdict": ctrl.metric("deathwatch_api_writes_total", operation="create_verdict")
            / args.pods,
            "patch_verdict_status": ctrl.metric(
                "deathwatch_api_writes_total", operation="patch_verdict_status"
            )
            / args.pods,
        }
        dead_sv_writes = writes["patch_verdict_status"] / max(1, deaths)
        alive_writes = (
            lifecycle_writes["patch_verdict_status"] * args.pods - writes["patch_verdict_status"]
        )

        # --- 3. memory with M tracked sandboxes -------------------------------------------------
        extra = max(0, args.scale - args.pods)
        scale_started = time.monotonic()
        create_ready(core, [f"mem-{i:05d}" for i in range(extra)], fate=Fate.LIVES)
        wait_alive(custom, extra, 1800)
        scale_seconds = time.monotonic() - scale_started
        time.sleep(10)  # kopf's per-object workers exit after 5 s idle: measure the steady state
        tracked = ctrl.get("/readyz")["details"]["tracked"]
        scaled_rss = rss_mib(ctrl.proc.pid)  # type: ignore[union-attr]
        peak_rss = rss_mib(ctrl.proc.pid, "VmHWM")  # type: ignore[union-attr]
    finally:
        if ctrl is not None:
            ctrl.stop()
        cp.destroy()

    result = {
        "latency": {
            "status_writes": total,
            "achieved_rate_per_s": round(achieved_rate, 1),
            "deaths": deaths,
            "verdict_ms_p50": round(percentile(verdict_ms, 50), 1),
            "verdict_ms_p95": round(percentile(verdict_ms, 95), 1),
            "verdict_ms_p99": round(percentile(verdict_ms, 99), 1),
            "verdict_ms_max": round(max(verdict_ms), 1) if verdict_ms else None,
            "baseline_watch_ms_p50": round(percentile(watch_ms, 50), 1),
            "baseline_watch_ms_p99": round(percentile(watch_ms, 99), 1),
            "verdict_over_watch_p50": round(
                percentile(verdict_ms, 50) / percentile(watch_ms, 50), 2
            )
            if watch_ms
            else None,
        },
        "api_writes": {
            # a lifecycle that ends in death: create + status Alive + status Dead (+ its Event)
            "verdict_creates_per_sandbox": round(lifecycle_writes["create_verdict"], 3),
            "alive_status_writes_per_sandbox": round(alive_writes / args.pods, 3),
            "dead_status_writes_per_death": round(dead_sv_writes, 3),
            "verdict_writes_per_dead_lifecycle": round(
                lifecycle_writes["create_verdict"] + alive_writes / args.pods + dead_sv_writes, 3
            ),
            "events_per_death": round(writes["create_event"] / max(1, deaths), 3),
        },
        "memory": {
            "idle_rss_mib": round(idle_rss, 1),
            "tracked": tracked,
            "rss_mib": round(scaled_rss, 1),
            "peak_rss_mib": round(peak_rss, 1),
            "rss_over_idle": round(scaled_rss / idle_rss, 2),
            "seconds_to_track": round(scale_seconds, 1),
        },
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        lat, w, m = result["latency"], result["api_writes"], result["memory"]
        print(
            f"latency at {lat['achieved_rate_per_s']} status writes/s ({lat['status_writes']} writes, {lat['deaths']} deaths):"
        )
        print(
            f"  status write -> SandboxVerdict Dead seen: p50 {lat['verdict_ms_p50']} ms, p95 {lat['verdict_ms_p95']} ms, p99 {lat['verdict_ms_p99']} ms, max {lat['verdict_ms_max']} ms"
        )
        print(
            f"  baseline, status write -> the same pod change seen on a watch: p50 {lat['baseline_watch_ms_p50']} ms, p99 {lat['baseline_watch_ms_p99']} ms (ratio p50 {lat['verdict_over_watch_p50']})"
        )
        print(
            f"API writes per sandbox that lived and died: {w['verdict_writes_per_dead_lifecycle']} to its SandboxVerdict "
            f"(create {w['verdict_creates_per_sandbox']} + Alive {w['alive_status_writes_per_sandbox']} + Dead {w['dead_status_writes_per_death']}), "
            f"plus {w['events_per_death']} Event"
        )
        print(
            f"memory: idle {m['idle_rss_mib']} MiB; {m['tracked']} tracked sandboxes {m['rss_mib']} MiB (x{m['rss_over_idle']}), peak {m['peak_rss_mib']} MiB while they arrived; tracking them took {m['seconds_to_track']} s"
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
