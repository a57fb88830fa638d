#!/usr/bin/env python3
"""Where an idle controller's memory goes (issue #43: 83 MiB a replica with no sandboxes).

    python3 -m bench.idle_memory [--running [--code REV]] [--json]

The import ladder: in a fresh interpreter, what `deathwatch controller` loads, one group at a
time (the standard library it uses, each dependency, then deathwatch's own modules), and the
resident memory each adds. Dependencies import one another, so a group is charged only for
what the groups before it had not loaded. Three runs, the median of each step. (The
cryptography package, 7.5 MiB and 51 modules, is no longer among them: the self-signed
serving certificate is made by a child interpreter, deathwatch._kube.selfsigned.)

`--running` also starts the real local control plane and one controller (no leader election,
an empty namespace and its DeathWatch), and reads its resident memory 30 s after /readyz says
ready: what the process holds beyond its code (the heap of its watches, threads, ports).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# in the order the controller's own imports reach them
STEPS: list[tuple[str, list[str]]] = [
    ("standard library (asyncio, ssl, json, logging)", ["asyncio", "ssl", "json", "logging"]),
    ("structlog", ["structlog"]),
    ("msgspec", ["msgspec"]),
    ("prometheus_client", ["prometheus_client"]),
    ("pyyaml", ["yaml"]),
    ("aiohttp", ["aiohttp"]),
    ("kubernetes (the client, for its kubeconfig loader)", ["kubernetes"]),
    ("kopf", ["kopf"]),
    (
        "deathwatch's own",
        [
            "deathwatch._cli",
            "deathwatch._operator.process.command",
            "deathwatch._operator.process.app",
        ],
    ),
]
_LADDER = """
import importlib, json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
out = [["interpreter", rss(), len(sys.modules)]]
for name, modules in json.loads(sys.argv[1]):
    for m in modules:
        importlib.import_module(m)
    out.append([name, rss(), len(sys.modules)])
print(json.dumps(out))
"""


def ladder(runs: int = 3) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / p / "src") for p in ("kube", "controller", "firewall")])}  # fmt: skip
    samples = [
        json.loads(subprocess.run([sys.executable, "-c", _LADDER, json.dumps(STEPS)], env=env,
                                  capture_output=True, text=True, check=True, timeout=120).stdout)
        for _ in range(runs)
    ]  # fmt: skip
    rows, before_rss, before_modules = [], 0.0, 0
    for i, (name, _, modules) in enumerate(samples[0]):
        rss = statistics.median(s[i][1] for s in samples)
        rows.append({"step": name, "adds_mib": round(rss - before_rss, 1),
                     "rss_mib": round(rss, 1), "modules_added": modules - before_modules})  # fmt: skip
        before_rss, before_modules = rss, modules
    return rows


def running(code: str | None) -> dict[str, Any]:
    from kubernetes import client, config

    from bench.controller_bench import NS
    from bench.controller_cluster import code_at
    from bench.delivery_bench import namespace_ready, wait_until
    from hack.localcluster import controlplane
    from hack.localcluster.controller_process import ControllerProcess, metrics_reader_token
    from hack.localcluster.procstat import rss_mib

    work = Path(tempfile.mkdtemp(prefix="deathwatch-idle-memory-"))
    env = {"PYTHONPATH": os.pathsep.join(code_at(code, work / "code"))} if code else {}
    cp = controlplane.ControlPlane(work / "cp")
    try:
        cp.start()
        cp.kubectl_run("apply", "--server-side", "-f", str(ROOT / "manifests" / "base" / "crds"))
        cp.kubectl_run("wait", "--for=condition=Established", "crd/deathwatches.deathwatch.dev",
                       "crd/sandboxverdicts.deathwatch.dev")  # fmt: skip
        for ns in (NS, "deathwatch-system"):
            cp.kubectl_run("create", "namespace", ns)
        cp.kubectl_run("apply", "-f", str(ROOT / "manifests/base/rbac/metrics-reader.yaml"))
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=configuration)
        api = client.ApiClient(configuration)
        wait_until(lambda: namespace_ready(client.CoreV1Api(api)), 60)
        cp.kubectl_run("apply", "-f", "-", input=(
            f"apiVersion: deathwatch.dev/v1alpha1\nkind: DeathWatch\nmetadata: {{name: idle, "
            f"namespace: {NS}}}\nspec: {{podSelector: {{matchLabels: {{app: sandbox}}}}}}\n"))  # fmt: skip
        p = ControllerProcess(cp.kubeconfig, [NS], work / "controller.log", env=env,
                              reader_token=metrics_reader_token(api)).start()  # fmt: skip
        try:
            assert p.proc is not None
            if not wait_until(lambda: p.get("/readyz", status_only=True) == 200, 60):
                raise TimeoutError(f"controller not ready:\n{p.tail()}")
            ready = rss_mib(p.proc.pid)
            time.sleep(30)
            maps = Path(f"/proc/{p.proc.pid}/maps").read_text()
            return {"rss_at_ready_mib": round(ready, 1),
                    "rss_after_30s_mib": round(rss_mib(p.proc.pid), 1),
                    "peak_mib": round(rss_mib(p.proc.pid, "VmHWM"), 1),
                    "threads": len(list(Path(f"/proc/{p.proc.pid}/task").iterdir())),
                    # its serving certificate made by a child (tls.py): never loaded here
                    "cryptography_loaded": "/cryptography/" in maps}  # fmt: skip
        finally:
            p.stop()
    finally:
        cp.destroy()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--running", action="store_true", help="also an idle controller's RSS")
    ap.add_argument("--code", metavar="REV", help="--running: REV's controller instead")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result: dict[str, Any] = {"ladder": ladder()}
    if args.running:
        result["running"] = running(args.code)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for row in result["ladder"]:
        print(f"{row['step']:<55} {row['adds_mib']:>+6.1f} MiB  {row['rss_mib']:>6.1f}  "
              f"+{row['modules_added']} modules")  # fmt: skip
    if args.running:
        print(json.dumps(result["running"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
