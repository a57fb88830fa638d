#!/usr/bin/env python3
"""Shards on the real local control plane (kube-apiserver v1.36 with ShardedListAndWatch):
what each process costs with 1 shard and with 3, on the same N sandbox pods.

    python3 -m bench.shard_bench [--pods N] [--shards 3]      (prints JSON)

N pods are made Ready; a warm-up controller writes their verdicts (so that both arms start
the same way: a restart, verdicts restored, pods listed). Then, one process per shard (the
shard's leader; its standby would cost the same again):

- *start to tracking*: from the process's start to its /readyz tracking its share of the
  pods (its verdicts restored, its pods listed and judged);
- *CPU and RSS* of each process after it settles, and over 60 s of quiet;
- *the relist*: one LIST of the pods as each process's relist makes it (the shard's selector
  or none), timed, its bytes counted;
- *projected*: RSS per tracked pod (the slope between this and the idle process), times
  150,000 pods / shards.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import client, config

from bench.controller_bench import NS, create_ready, wait_alive
from bench.delivery_bench import cpu_seconds, namespace_ready, wait_until
from deathwatch._operator.slots import assign, selector
from hack.localcluster import controlplane
from hack.localcluster.controller_process import ControllerProcess, metrics_reader_token
from hack.localcluster.procstat import rss_mib
from hack.render_manifests import CHART, NAMESPACE, helm, without_helm_labels

ROOT = Path(__file__).resolve().parent.parent


def list_cost(cp: controlplane.ControlPlane, shard_selector: str) -> tuple[float, int]:
    context = ssl.create_default_context(cafile=str(cp.certs / "ca.crt"))
    context.load_cert_chain(cp.certs / "admin.crt", cp.certs / "admin.key")
    query = urllib.parse.urlencode({"shardSelector": shard_selector} if shard_selector else {})
    started = time.perf_counter()
    with urllib.request.urlopen(f"{cp.server}/api/v1/namespaces/{NS}/pods?{query}",  # noqa: S310
                                context=context, timeout=120) as r:  # fmt: skip
        size = len(r.read())
    return time.perf_counter() - started, size


def tracked(p: ControllerProcess) -> int:
    return int(((p.get("/readyz") or {}).get("details") or {}).get("tracked", 0))


def arm(work: Path, cp: controlplane.ControlPlane, api: client.ApiClient, shards: int,
        pods: int) -> list[dict[str, Any]]:  # fmt: skip
    procs = []
    for i in range(shards):
        extra = ["--leader-elect", f"--identity=bench-{shards}-{i}", "--shards", str(shards),
                 "--shard", str(i), "--shard-epoch", str(int(time.time()))]  # fmt: skip
        started = time.monotonic()
        p = ControllerProcess(cp.kubeconfig, [NS], work / f"s{shards}-{i}.log", extra=extra,
                              reader_token=metrics_reader_token(api)).start()  # fmt: skip
        procs.append((i, p, started))
    out: list[dict[str, Any]] = []
    running: list[ControllerProcess] = []
    for i, p, started in procs:
        share = round(pods * len(assign(i, shards)) / 64)
        wait_until(lambda p=p, share=share: tracked(p) >= share * 0.95, 1800)
        took = time.monotonic() - started
        assert p.proc is not None
        cpu0 = cpu_seconds(p.proc.pid)
        out.append({"shard": i, "tracked": tracked(p), "start_to_tracking_s": round(took, 1),
                    "cpu_s_to_tracking": round(cpu0, 2)})  # fmt: skip
        running.append(p)
    time.sleep(60)
    for row, p in zip(out, running, strict=True):
        assert p.proc is not None
        row["cpu_s_quiet_60s"] = round(cpu_seconds(p.proc.pid) - row["cpu_s_to_tracking"], 2)
        row["rss_mib"] = round(rss_mib(p.proc.pid), 1)
        shard = int(row["shard"])
        seconds, size = list_cost(cp, selector(assign(shard, shards)) if shards > 1 else "")
        row["relist_s"], row["relist_mib"] = round(seconds, 2), round(size / 2**20, 1)
        p.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--pods", type=int, default=30000)
    ap.add_argument("--shards", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="deathwatch-shard-bench-"))
    cp = controlplane.ControlPlane(
        work / "cp", apiserver_binary=controlplane.shards_apiserver(),
        apiserver_flags=["--feature-gates=ShardedListAndWatch=true"],
    )  # fmt: skip
    result: dict[str, Any] = {"pods": args.pods}
    try:
        cp.start()
        cp.kubectl_run("apply", "--server-side", "-f", str(ROOT / "manifests" / "base" / "crds"))
        cp.kubectl_run("wait", "--for=condition=Established", "crd/deathwatches.deathwatch.dev",
                       "crd/sandboxverdicts.deathwatch.dev")  # fmt: skip
        for ns in (NS, "deathwatch-system"):
            cp.kubectl_run("create", "namespace", ns, check=False)
        cp.kubectl_run("apply", "-f", str(ROOT / "manifests/base/rbac/metrics-reader.yaml"))
        rbac = helm("template", "deathwatch", str(CHART), "-n", NAMESPACE, "--set",
                    f"controller.shards={args.shards}", "--show-only", "templates/rbac/controller.yaml")  # fmt: skip
        cp.kubectl_run("apply", "-f", "-", input=without_helm_labels(rbac))
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=configuration)
        api = client.ApiClient(configuration)
        core = client.CoreV1Api(api)
        wait_until(lambda: namespace_ready(core), 60)
        cp.kubectl_run("apply", "-f", "-", input=(
            f"apiVersion: deathwatch.dev/v1alpha1\nkind: DeathWatch\nmetadata: {{name: bench, "
            f"namespace: {NS}}}\nspec: {{podSelector: {{matchLabels: {{app: sandbox}}}}}}\n"))  # fmt: skip
        created = time.monotonic()
        create_ready(core, [f"sbx-{i:05d}" for i in range(args.pods)])
        result["create_s"] = round(time.monotonic() - created, 1)
        warm = ControllerProcess(cp.kubeconfig, [NS], work / "warm.log").start()
        idle = rss_mib(warm.proc.pid) if warm.proc else 0.0  # before it has listed much
        wait_alive(client.CustomObjectsApi(api), args.pods, 3600)
        warm.stop()
        result["idle_rss_mib"] = round(idle, 1)
        result["one_shard"] = arm(work, cp, api, 1, args.pods)
        result[f"{args.shards}_shards"] = arm(work, cp, api, args.shards, args.pods)
        one = result["one_shard"][0]
        per_pod = (one["rss_mib"] - idle) / max(1, one["tracked"])  # the slope above idle
        result["projected_150k"] = {
            "rss_mib_per_1000_pods": round(per_pod * 1000, 2),
            "one_shard_rss_mib": round(idle + per_pod * 150_000),
            f"per_shard_of_{args.shards}_rss_mib": round(idle + per_pod * 150_000 / args.shards),
        }
    finally:
        cp.destroy()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
