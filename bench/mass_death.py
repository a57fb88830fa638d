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
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config

from bench.controller_bench import NS, TIMEOUT, Watcher, create_ready, statuses, wait_alive
from bench.ports_bench import OPEN_FILES, code_at, cpu_seconds
from bench.stats import summary
from hack.localcluster import controlplane
from hack.localcluster.controller_process import (
    ControllerProcess,
    metrics_reader_token,
    service_account_kubeconfig,
)

ROOT = Path(__file__).resolve().parent.parent


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
    code_env = {"PYTHONPATH": os.pathsep.join(pythonpath)} if pythonpath else {}
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
        configuration.connection_pool_maxsize = args.writers + 4
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
        ctrl = ControllerProcess(kubeconfig, [NS], work / "controller.log", env=code_env,
                                 reader_token=metrics_reader_token(api),
                                 open_files=OPEN_FILES).start()  # fmt: skip
        assert ctrl.proc is not None
        pid = ctrl.proc.pid
        cp.kubectl_run("apply", "-f", "-", input=(
            f"apiVersion: deathwatch.dev/v1alpha1\nkind: DeathWatch\nmetadata: {{name: bench, "
            f"namespace: {NS}}}\nspec: {{podSelector: {{matchLabels: {{app: sandbox}}}}}}\n"))  # fmt: skip
        names = [f"p-{i:05d}" for i in range(args.pods)]
        scripts = create_ready(core, names)
        wait_alive(custom, args.pods, 600)

        def pod_dead(obj: Any) -> str | None:
            statuses_ = obj.status.container_statuses or []
            return obj.metadata.name if any(s.state.terminated for s in statuses_) else None

        def verdict_dead(obj: Any) -> str | None:
            dead = (obj.get("status") or {}).get("state") == "Dead"
            return obj["metadata"]["name"] if dead else None

        pods = Watcher(core.list_namespaced_pod, NS, key=pod_dead)
        verdicts = Watcher(custom.list_namespaced_custom_object, "deathwatch.dev", "v1alpha1", NS,
                           "sandboxverdicts", key=verdict_dead)  # fmt: skip
        watchers = [pods, verdicts]
        for w in watchers:
            w.start()
        time.sleep(3)  # both watches established, the controller at rest
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
    finally:
        for w in watchers:
            w.stop = True
        if ctrl is not None:
            ctrl.stop()
        cp.stop()


if __name__ == "__main__":
    raise SystemExit(main())
