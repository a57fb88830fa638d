#!/usr/bin/env python3
"""Delivery's cost and latency, next to the verdict's own, on the real local control plane.

    python3 -m bench.delivery_bench [--pods N] [--rate R] [--seconds S] [--outage SECONDS] [--json]

N sandbox pods are made Ready once. Then two arms, one controller process each (the only
writer, so its CPU is the leader's), on the same pods:

1. *verdicts only*, then 2. *with delivery* (a sink wanting Dead, a real HTTPS receiver behind
   a private CA that verifies every signature: hack/localcluster/receiver.py). In each, the
   bench plays kubelet at R pod status writes per second for S seconds, one in ten a death.
   For every death: the status write returning -> the SandboxVerdict Dead seen on the bench's
   own watch (the verdict's time) and, in arm 2, -> the receiver's 2xx (the delivery's
   time), both on the bench's clock. The controller's CPU seconds over the churn and its RSS
   after it, per arm: what delivery adds.
3. *A 429* (arm 2 carries on): five deaths, each answered once with `Retry-After: 2`: from
   the death's write to the receiver's 2xx (the wait, kept to the second: #43).
4. *An outage*: the receiver down for `--outage` seconds while deaths go on
   at the same rate; the controller's RSS every 10 s; then up: how long the backlog takes to
   drain, whether every death arrived, and how long into the outage the DeathWatch's
   `Delivered` condition said False.
"""

from __future__ import annotations

import argparse
import base64
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

from kubernetes import client, config

from bench.controller_bench import NS, TIMEOUT, Watcher, create_ready, statuses, wait_alive
from bench.stats import percentile
from deathwatch._engine.timeutil import format_time
from hack.localcluster import controlplane
from hack.localcluster.controller_process import ControllerProcess, metrics_reader_token
from hack.localcluster.procstat import rss_mib
from hack.localcluster.receiver import Fault, Receiver, sink_secret
from hack.localcluster.sandbox_script import SandboxScript

ROOT = Path(__file__).resolve().parent.parent
SECRET = "whsec_" + base64.b64encode(b"bench-key-0123456789abcdefghij").decode()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Churn:
    """The bench's kubelet: R status writes a second, one in ten a death of the next victim."""

    def __init__(self, core: client.CoreV1Api, scripts: dict[str, SandboxScript],
                 victims: list[str]) -> None:  # fmt: skip
        self.core, self.scripts, self.victims = core, scripts, iter(victims)
        self.names = list(scripts)
        self.deaths: dict[str, float] = {}  # pod -> monotonic time its death was written

    def run(self, rate: float, seconds: float, stop: threading.Event | None = None) -> float:
        interval, total = 1.0 / rate, int(rate * seconds)
        started = time.monotonic()
        done = 0
        for i in range(total):
            if stop is not None and stop.is_set():
                break
            target = started + i * interval
            if target > time.monotonic():
                time.sleep(target - time.monotonic())
            if i % 10 == 0:
                if self.kill_one() is None:
                    break
            else:
                name = self.names[(i * 7919) % len(self.names)]
                if name in self.deaths:
                    continue
                status = copy.deepcopy(statuses(self.scripts[name])[0])
                status["conditions"][0]["lastTransitionTime"] = format_time(datetime.now(UTC))
                self.core.patch_namespaced_pod_status(name, NS, {"status": status},
                                                      _request_timeout=TIMEOUT)  # fmt: skip
            done += 1
        return done / (time.monotonic() - started)

    def kill_one(self) -> str | None:
        """The next victim's death written (None: no victims left)."""
        name = next(self.victims, None)
        if name is not None:
            self.core.patch_namespaced_pod_status(
                name, NS, {"status": statuses(self.scripts[name])[1]}, _request_timeout=TIMEOUT
            )
            self.deaths[name] = time.monotonic()
        return name


def dead_watcher(custom: client.CustomObjectsApi) -> Watcher:
    return Watcher(
        custom.list_namespaced_custom_object, "deathwatch.dev", "v1alpha1", NS, "sandboxverdicts",
        key=lambda o: o["metadata"]["name"] if o.get("status", {}).get("state") == "Dead" else None,
    )  # fmt: skip


def namespace_ready(core: client.CoreV1Api, namespace: str = NS) -> bool:
    """The namespace's default ServiceAccount exists: pods can be created."""
    try:
        core.read_namespaced_service_account("default", namespace, _request_timeout=TIMEOUT)
    except client.ApiException:
        return False
    return True


def wait_until(probe: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return True
        time.sleep(0.1)
    return False


def arm(name: str, work: Path, cp: controlplane.ControlPlane, api: client.ApiClient,
        churn: Churn, rate: float, seconds: float, receiver: Receiver | None,
        delivery: Path | None) -> tuple[dict[str, Any], ControllerProcess]:  # fmt: skip
    extra = ["--delivery-config", str(delivery)] if delivery else []
    ctrl = ControllerProcess(cp.kubeconfig, [NS], work / f"{name}.log", extra=extra,
                             reader_token=metrics_reader_token(api)).start()  # fmt: skip
    assert ctrl.proc is not None
    custom = client.CustomObjectsApi(api)
    # every pod tracked and its verdict written Alive before the churn (the first arm writes
    # them; the second restores them from the API)
    alive = len(churn.names) - len(churn.deaths)
    wait_alive(custom, alive, 1800)
    wait_until(lambda: ((ctrl.get("/readyz") or {}).get("details") or {}).get("tracked", 0)
               >= len(churn.names), 600)  # fmt: skip
    time.sleep(3)  # settled
    dead = dead_watcher(custom)
    dead.start()
    before = set(churn.deaths)
    cpu0 = cpu_seconds(ctrl.proc.pid)
    achieved = churn.run(rate, seconds)
    cpu = cpu_seconds(ctrl.proc.pid) - cpu0
    mine = {n: t for n, t in churn.deaths.items() if n not in before}
    wait_until(lambda: all(n in dead.seen for n in mine), 60)
    verdict_ms = [(dead.seen[n] - t) * 1e3 for n, t in mine.items() if n in dead.seen]
    result: dict[str, Any] = {
        "achieved_rate_per_s": round(achieved, 1), "deaths": len(mine),
        "verdict_ms_p50": round(percentile(verdict_ms, 50), 1),
        "verdict_ms_p99": round(percentile(verdict_ms, 99), 1),
        "cpu_seconds_in_churn": round(cpu, 2), "rss_mib": round(rss_mib(ctrl.proc.pid), 1),
    }  # fmt: skip
    if receiver is not None:
        uids = {n: churn.core.read_namespaced_pod(n, NS, _request_timeout=TIMEOUT).metadata.uid
                for n in mine}  # fmt: skip
        wait_until(lambda: all(receiver.of(n) for n in mine), 60)
        delivered_ms = [(min(r.at for r in receiver.of(n)) - t) * 1e3
                        for n, t in mine.items() if receiver.of(n)]  # fmt: skip
        result.update({
            "delivered": sum(1 for n in mine if receiver.of(n)),
            "delivered_ms_p50": round(percentile(delivered_ms, 50), 1),
            "delivered_ms_p99": round(percentile(delivered_ms, 99), 1),
            "ids_stable": all(r.id == f"{uids[n]}/dead" for n in mine for r in receiver.of(n)),
            "invalid_signatures": len(receiver.invalid),
        })  # fmt: skip
    dead.stop = True
    return result, ctrl


def delivered_status(custom: client.CustomObjectsApi) -> str | None:
    """The bench DeathWatch's Delivered condition: True, False, or None (not said)."""
    dw = custom.get_namespaced_custom_object("deathwatch.dev", "v1alpha1", NS, "deathwatches",
                                             "bench", _request_timeout=TIMEOUT)  # fmt: skip
    found = [
        c for c in (dw.get("status") or {}).get("conditions") or [] if c["type"] == "Delivered"
    ]
    return str(found[0]["status"]) if found else None


def retry_after(churn: Churn, receiver: Receiver, kills: int = 5, wait: int = 2) -> dict[str, Any]:
    """Each of `kills` deaths answered 429 with Retry-After `wait` once: from the death's write
    to the receiver's 2xx (the wait, plus the verdict's and the event's own time)."""
    took = []
    for _ in range(kills):
        receiver.fault(Fault("429", retry_after=wait))
        name = churn.kill_one()
        if name is None:
            break
        if wait_until(lambda n=name: receiver.of(n), 60):
            took.append(min(r.at for r in receiver.of(name)) - churn.deaths[name])
    return {"retry_after_s": wait, "kills": len(took),
            "made_good_s": [round(t, 2) for t in took],
            "late_beyond_retry_after_s_max": round(max(took) - wait, 2) if took else None}  # fmt: skip


def outage(ctrl: ControllerProcess, churn: Churn, receiver: Receiver, rate: float,
           seconds: float, custom: client.CustomObjectsApi) -> dict[str, Any]:  # fmt: skip
    assert ctrl.proc is not None
    before = set(churn.deaths)
    rss = [rss_mib(ctrl.proc.pid)]
    receiver.down()
    stop = threading.Event()
    churner = threading.Thread(target=churn.run, args=(rate, seconds, stop), daemon=True)
    churner.start()
    began = time.monotonic()
    # the Delivered condition: how long after the outage began it said False
    said_false: float | None = None
    while churner.is_alive():
        churner.join(0.5)
        if said_false is None and delivered_status(custom) == "False":
            said_false = time.monotonic() - began
        if len(rss) < 1 + (time.monotonic() - began) // 10:
            rss.append(rss_mib(ctrl.proc.pid))
    owed = ctrl.metric("deathwatch_delivery_backlog", sink="bench")
    receiver.up()
    up = time.monotonic()
    mine = [n for n in churn.deaths if n not in before]
    drained = wait_until(lambda: all(receiver.of(n) for n in mine), 900)
    drain = time.monotonic() - up
    rss.append(rss_mib(ctrl.proc.pid))
    return {
        "down_seconds": round(up - began, 1), "deaths_while_down": len(mine),
        "backlog_at_end_of_outage": owed, "all_delivered": drained,
        "drain_seconds": round(drain, 1),
        "delivered_false_after_s": round(said_false, 1) if said_false is not None else None,
        "rss_mib_before": rss[0], "rss_mib_max": round(max(rss), 1), "rss_mib_after": rss[-1],
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--outage", type=float, default=600.0, help="0: no outage phase")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    deaths_per_arm = int(args.rate * args.seconds / 10) + 1
    outage_deaths = int(args.rate * args.outage / 10) + 1
    needed = 2 * deaths_per_arm + outage_deaths + 5  # and the Retry-After phase's
    work = Path(tempfile.mkdtemp(prefix="deathwatch-delivery-bench-"))
    cp = controlplane.ControlPlane(work / "cp")
    receiver = Receiver(SECRET, tls=True).start()
    ctrls: list[ControllerProcess] = []
    try:
        cp.start()
        cp.kubectl_run("apply", "--server-side", "-f", str(ROOT / "manifests" / "base" / "crds"))
        cp.kubectl_run("wait", "--for=condition=Established", "crd/deathwatches.deathwatch.dev",
                       "crd/sandboxverdicts.deathwatch.dev")  # fmt: skip
        cp.kubectl_run("create", "namespace", NS)
        cp.kubectl_run("create", "namespace", "deathwatch-system", check=False)
        cp.kubectl_run("apply", "-f", str(ROOT / "manifests/base/rbac/metrics-reader.yaml"))
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=configuration)
        configuration.connection_pool_maxsize = 16
        api = client.ApiClient(configuration)
        core = client.CoreV1Api(api)
        wait_until(lambda: namespace_ready(core), 60)
        cp.kubectl_run("apply", "-f", "-", input=(
            f"apiVersion: deathwatch.dev/v1alpha1\nkind: DeathWatch\nmetadata: {{name: bench, "
            f"namespace: {NS}}}\nspec: {{podSelector: {{matchLabels: {{app: sandbox}}}}}}\n"))  # fmt: skip
        names = [f"sbx-{i:05d}" for i in range(max(args.pods, needed))]
        created = time.monotonic()
        scripts = create_ready(core, names)
        secret = sink_secret(work / "sink", SECRET, ca=receiver.ca_cert)
        delivery = work / "sinks.yaml"
        delivery.write_text(json.dumps({"cluster": "bench", "sinks": [
            {"name": "bench", "url": receiver.url, "secretDir": str(secret)}]}))  # fmt: skip
        churn = Churn(core, scripts, names[:needed])
        setup = round(time.monotonic() - created, 1)
        first, ctrl = arm(
            "verdicts-only", work, cp, api, churn, args.rate, args.seconds, None, None
        )
        ctrls.append(ctrl)
        ctrl.stop()
        second, ctrl = arm("with-delivery", work, cp, api, churn, args.rate, args.seconds,
                           receiver, delivery)  # fmt: skip
        ctrls.append(ctrl)
        result: dict[str, Any] = {
            "pods": len(names), "setup_seconds": setup, "verdicts_only": first,
            "with_delivery": second,
            "delivery_adds": {
                "cpu_ratio": round(second["cpu_seconds_in_churn"]
                                   / max(0.01, first["cpu_seconds_in_churn"]), 2),
                "rss_mib": round(second["rss_mib"] - first["rss_mib"], 1),
                "p50_ms_over_verdict": round(second["delivered_ms_p50"] - second["verdict_ms_p50"], 1),
            },
        }  # fmt: skip
        custom = client.CustomObjectsApi(api)
        result["retry_after"] = retry_after(churn, receiver)
        if args.outage > 0:
            result["outage"] = outage(ctrl, churn, receiver, args.rate, args.outage, custom)
    finally:
        for c in ctrls:
            c.stop()
        receiver.stop()
        cp.destroy()
    print(json.dumps(result, indent=2) if args.json else _text(result))
    return 0


def _text(r: dict[str, Any]) -> str:
    a, b, d = r["verdicts_only"], r["with_delivery"], r["delivery_adds"]
    lines = [
        f"{r['pods']} sandboxes; {b['achieved_rate_per_s']} status writes/s, {b['deaths']} deaths an arm",
        f"  verdicts only: verdict p50 {a['verdict_ms_p50']} ms, p99 {a['verdict_ms_p99']} ms; "
        f"CPU {a['cpu_seconds_in_churn']} s, RSS {a['rss_mib']} MiB",
        f"  with delivery: verdict p50 {b['verdict_ms_p50']} ms, p99 {b['verdict_ms_p99']} ms; "
        f"delivered (receiver's 2xx) p50 {b['delivered_ms_p50']} ms, p99 {b['delivered_ms_p99']} ms; "
        f"CPU {b['cpu_seconds_in_churn']} s, RSS {b['rss_mib']} MiB; {b['delivered']}/{b['deaths']} "
        f"delivered, ids stable {b['ids_stable']}, invalid signatures {b['invalid_signatures']}",
        f"  delivery adds: CPU x{d['cpu_ratio']}, RSS +{d['rss_mib']} MiB, p50 +{d['p50_ms_over_verdict']} ms after the verdict",
    ]  # fmt: skip
    ra = r.get("retry_after")
    if ra:
        lines.append(f"  429 with Retry-After {ra['retry_after_s']} s: made good after "
                     f"{ra['made_good_s']} s")  # fmt: skip
    if "outage" in r:
        o = r["outage"]
        lines.append(
            f"  outage {o['down_seconds']} s, {o['deaths_while_down']} deaths meanwhile (backlog "
            f"{o['backlog_at_end_of_outage']:.0f}); Delivered False after "
            f"{o['delivered_false_after_s']} s; drained in {o['drain_seconds']} s, all "
            f"delivered {o['all_delivered']}; RSS {o['rss_mib_before']:.1f} -> max "
            f"{o['rss_mib_max']} -> {o['rss_mib_after']:.1f} MiB"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
