#!/usr/bin/env python3
"""Shards on the real local control plane (kube-apiserver v1.36 with ShardedListAndWatch):
what each process costs with 1 shard and with 3, on the same N sandbox pods.

    python3 -m bench.shard_bench [--pods N] [--shards 3]      (prints JSON)
    python3 -m bench.shard_bench --pairs [--pods 300] [--deaths 150] [--code REV]

`--pairs` (issue #43's measure): the CPU each shard's replica pair spends on the same deaths,
against one unsharded pair's. Each arm, in a namespace of its own: N sandboxes Ready and
judged Alive, then the arm's processes (one pair, or a pair per shard, all `--leader-elect`)
measured over IDLE_S of quiet (each one's floor) and over the deaths (D of the N written
dead at RATE a second, until every verdict is Dead and the shards' status parts are written:
TAIL_S more). Each process's CPU above its floor over that window, summed per pair, and each
shard pair's share of the unsharded pair's. `--code REV` runs both arms again with REV's
controller in the same run: the before.

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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client, config

from bench.controller_bench import NS, TIMEOUT, Watcher, create_ready, statuses, wait_alive
from bench.controller_cluster import code_at, verdict_dead
from bench.delivery_bench import cpu_seconds, namespace_ready, wait_until
from deathwatch._operator.shards.slots import assign, selector, slot_of
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


IDLE_S = 30.0  # each process's floor, measured over this much quiet
TAIL_S = 8.0  # after the last verdict: the shards' status parts (every 5 s) and totals
RATE = 10.0  # deaths a second


def writes_by_operation(p: ControllerProcess) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in (p.get("/metrics") or "").splitlines():
        if line.startswith("deathwatch_api_writes_total{"):
            labels, value = line.rsplit(" ", 1)
            operation = labels.split('operation="', 1)[1].split('"', 1)[0]
            out[operation] = out.get(operation, 0.0) + float(value)
    return out


def victims(core: client.CoreV1Api, ns: str, names: list[str], deaths: int,
            shards: int) -> tuple[list[str], list[int]]:  # fmt: skip
    """The pods to kill: `deaths` of them, as many in each shard's slots (taken in turn), so
    that a third is each of three shards' fair share of the work. 300 pods' random uids fall
    unevenly into 3 shards (62 of 150 deaths in one, in a run before this choice), and a pair
    judging 41 % of the deaths costs 41 % whatever it does. Also how many fell to each."""
    if shards == 1:
        return names[:deaths], [deaths]
    listed = core.list_namespaced_pod(ns, _request_timeout=TIMEOUT).items
    uid = {p.metadata.name: p.metadata.uid for p in listed}
    owner = [assign(i, shards) for i in range(shards)]
    by_shard: list[list[str]] = [[] for _ in range(shards)]
    for name in names:
        slot = slot_of(uid[name])
        by_shard[next(i for i in range(shards) if slot in owner[i])].append(name)
    each = deaths // shards
    if min(len(b) for b in by_shard) < each:
        raise ValueError(f"{deaths} deaths over {shards} shards: a shard has only "
                         f"{min(len(b) for b in by_shard)} pods; more --pods")  # fmt: skip
    chosen = [b[k] for k in range(each) for b in by_shard]  # in turn: every shard all along
    return chosen, [each] * shards


def pair_arm(work: Path, cp: controlplane.ControlPlane, api: client.ApiClient, label: str,
             shards: int, pods: int, deaths: int, env: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """One arm of --pairs: a pair per shard (one pair when `shards` is 1) in namespace
    `pairs-LABEL`, its floor and its deaths."""
    ns = f"pairs-{label}"
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    cp.kubectl_run("create", "namespace", ns)
    wait_until(lambda: namespace_ready(core, ns), 60)
    cp.kubectl_run("apply", "-f", "-", input=(
        f"apiVersion: deathwatch.dev/v1alpha1\nkind: DeathWatch\nmetadata: {{name: bench, "
        f"namespace: {ns}}}\nspec: {{podSelector: {{matchLabels: {{app: sandbox}}}}}}\n"))  # fmt: skip
    names = [f"p-{i:04d}" for i in range(pods)]
    scripts = create_ready(core, names, namespace=ns)
    epoch, reader = int(time.time()), metrics_reader_token(api)
    procs: list[tuple[int, ControllerProcess]] = []
    try:
        for i in range(shards):
            for r in "ab":
                extra = ["--leader-elect", f"--identity={label}-s{i}-{r}"]
                if shards > 1:
                    extra += ["--shards", str(shards), "--shard", str(i),
                              "--shard-epoch", str(epoch)]  # fmt: skip
                p = ControllerProcess(cp.kubeconfig, [ns], work / f"{label}-s{i}{r}.log",
                                      extra=extra, env=env, reader_token=reader).start()  # fmt: skip
                procs.append((i, p))
        wait_alive(custom, pods, 600, namespace=ns)
        dying, per_shard = victims(core, ns, names, deaths, shards)
        deaths = len(dying)
        pids = [p.proc.pid for _, p in procs if p.proc is not None]
        time.sleep(5)  # the start's own work (restores, first status writes) done
        c0, t0 = [cpu_seconds(pid) for pid in pids], time.monotonic()
        time.sleep(IDLE_S)
        c1, t1 = [cpu_seconds(pid) for pid in pids], time.monotonic()
        floors = [(b - a) / (t1 - t0) for a, b in zip(c0, c1, strict=True)]
        dead = Watcher(custom.list_namespaced_custom_object, "deathwatch.dev", "v1alpha1", ns,
                       "sandboxverdicts", key=verdict_dead)  # fmt: skip
        dead.start()
        time.sleep(2)  # its watch established
        w0 = [sum(writes_by_operation(p).values()) for _, p in procs]
        c2, t2 = [cpu_seconds(pid) for pid in pids], time.monotonic()
        for k, name in enumerate(dying):
            due = t2 + k / RATE
            if due > time.monotonic():
                time.sleep(due - time.monotonic())
            core.patch_namespaced_pod_status(name, ns, {"status": statuses(scripts[name])[1]},
                                             _request_timeout=TIMEOUT)  # fmt: skip
        if not wait_until(lambda: len(dead.seen) >= deaths, 300):
            raise TimeoutError(f"{label}: {len(dead.seen)} of {deaths} verdicts Dead")
        judged = max(dead.seen.values()) - t2
        time.sleep(TAIL_S)
        c3, t3 = [cpu_seconds(pid) for pid in pids], time.monotonic()
        dead.stop = True
        rows: list[dict[str, Any]] = []
        for (shard, p), a, b, floor, w in zip(procs, c2, c3, floors, w0, strict=True):
            ops = writes_by_operation(p)
            leader = ((p.get("/readyz") or {}).get("details") or {}).get("leader") or {}
            rows.append({"shard": shard, "leading": leader.get("is_leader"), "floor_cpu_pct":
                         round(100 * floor, 2), "cpu_s": round(b - a, 3),
                         "above_floor_s": round(b - a - floor * (t3 - t2), 3),
                         "writes": round(sum(ops.values()) - w)})  # fmt: skip
        per_pair = [round(sum(float(r["above_floor_s"]) for r in rows if r["shard"] == i), 3)
                    for i in range(shards)]  # fmt: skip
        return {"shards": shards, "deaths": per_shard, "window_s": round(t3 - t2, 1),
                "last_verdict_s": round(judged, 2), "processes": rows,
                "pair_above_floor_s": per_pair}  # fmt: skip
    finally:
        for _, p in procs:
            p.stop()


@contextmanager
def sharded_cluster(work: Path, shards: int) -> Iterator[tuple[controlplane.ControlPlane,
                                                            client.ApiClient]]:  # fmt: skip
    """The KEP-5866 API server with the CRDs and the RBAC for `shards`, and a client of it;
    destroyed on leaving."""
    cp = controlplane.ControlPlane(
        work / "cp", apiserver_binary=controlplane.shards_apiserver(),
        apiserver_flags=["--feature-gates=ShardedListAndWatch=true"],
    )  # fmt: skip
    try:
        cp.start()
        setup(cp, shards)
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=configuration)
        yield cp, client.ApiClient(configuration)
    finally:
        cp.destroy()


def pairs(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="deathwatch-shard-pairs-"))
    codes: list[tuple[str, dict[str, str]]] = [("now", {})]
    if args.code:
        before = code_at(args.code, work / "code")
        codes.append(("before", {"PYTHONPATH": os.pathsep.join(before)}))
    result: dict[str, Any] = {"pods": args.pods, "deaths": args.deaths, "code": args.code}
    with sharded_cluster(work, args.shards) as (cp, api):
        for name, env in codes:
            one = pair_arm(work, cp, api, f"{name}-1", 1, args.pods, args.deaths, env)
            many = pair_arm(work, cp, api, f"{name}-{args.shards}", args.shards, args.pods,
                            args.deaths, env)  # fmt: skip
            unsharded = one["pair_above_floor_s"][0]
            result[name] = {"one_pair": one, f"{args.shards}_pairs": many,
                            "share_of_one_pair": [round(x / unsharded, 2)
                                                  for x in many["pair_above_floor_s"]]}  # fmt: skip
    return result


def setup(cp: controlplane.ControlPlane, shards: int) -> None:
    """The CRDs, the controller's RBAC as the chart renders it for `shards`, a metrics reader."""
    cp.kubectl_run("apply", "--server-side", "-f", str(ROOT / "manifests" / "base" / "crds"))
    cp.kubectl_run("wait", "--for=condition=Established", "crd/deathwatches.deathwatch.dev",
                   "crd/sandboxverdicts.deathwatch.dev")  # fmt: skip
    for ns in (NS, "deathwatch-system"):
        cp.kubectl_run("create", "namespace", ns, check=False)
    cp.kubectl_run("apply", "-f", str(ROOT / "manifests/base/rbac/metrics-reader.yaml"))
    rbac = helm("template", "deathwatch", str(CHART), "-n", NAMESPACE, "--set",
                f"controller.shards={shards}", "--show-only", "templates/rbac/controller.yaml")  # fmt: skip
    cp.kubectl_run("apply", "-f", "-", input=without_helm_labels(rbac))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--pods", type=int, default=None, help="30,000; with --pairs 300")
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--pairs", action="store_true", help="each shard pair's CPU on deaths")
    ap.add_argument("--deaths", type=int, default=150, help="--pairs: deaths per arm")
    ap.add_argument("--code", metavar="REV", help="--pairs: the before, from REV's controller")
    args = ap.parse_args()
    if args.pairs:
        args.pods = args.pods or 300
        if not 0 < args.deaths <= args.pods:
            ap.error(f"--deaths: between 1 and --pods ({args.pods}), got {args.deaths}")
        print(json.dumps(pairs(args), indent=2))
        return 0
    args.pods = args.pods or 30000
    work = Path(tempfile.mkdtemp(prefix="deathwatch-shard-bench-"))
    result: dict[str, Any] = {"pods": args.pods}
    with sharded_cluster(work, args.shards) as (cp, api):
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
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
