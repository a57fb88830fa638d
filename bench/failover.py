#!/usr/bin/env python3
"""Failover: how long a death goes without a verdict when the leading replica goes away.

    python3 -m bench.failover [--rounds N] [--lease-duration S] [--json]

Two controller replicas elect a leader on the real local control plane (Lease timings as
shipped: 15 s, 10 s, 2 s). Each round: a sandbox is Alive, the leader is stopped, and in the
same instant the sandbox dies; the number is the time from that death to the bench seeing
its SandboxVerdict Dead. A replacement replica is started after each round (as the
Deployment would), so every round starts from a leader and a warm standby, and the fault
comes at a random moment (seeded) of the leader's 2 s renewal cycle.

- `sigkill`: the leader is killed (no release). The standby must wait out the Lease.
- `sigterm`: the leader is told to stop (a rollout, a drain). It releases the Lease.
- baseline `cold_start`, same run: one replica only, stopped with SIGTERM, and a new process
  started at once; the time a Deployment without a standby needs at best (no scheduling,
  no image pull: the process start, the LIST and the write).
- `rollout`: while a rolling update (maxSurge 1) replaces both replicas, sandboxes die
  one at a time; verdict latency as users see it.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config

from bench.controller_bench import statuses
from bench.stats import summary
from hack.localcluster import controlplane
from hack.localcluster.controller_process import service_account_kubeconfig
from hack.localcluster.kubelet import Kubelet
from hack.localcluster.replicas import Replica, Replicas
from hack.localcluster.sandbox_script import Fate, SandboxScript

ROOT = Path(__file__).resolve().parent.parent
NS = "failover"
GROUP, VERSION = "deathwatch.dev", "v1alpha1"


class Bench:
    def __init__(self, cp: controlplane.ControlPlane, api: client.ApiClient, work: Path,
                 timings: tuple[float, float, float]) -> None:  # fmt: skip
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.kubelet = Kubelet(api)
        self.replicas = Replicas(cp, api, NS, work, timings=timings)
        self.serial = 0
        self.killed: list[str] = []
        self.rng = random.Random(12)  # a benchmark's phase: seeded, reproducible

    def state(self, name: str) -> str | None:
        try:
            sv = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, NS, "sandboxverdicts", name, _request_timeout=10
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        state: str | None = (sv.get("status") or {}).get("state")
        return state

    def wait_state(
        self, name: str, state: str, timeout: float = 90, since: float | None = None
    ) -> float:
        """Seconds from `since` (monotonic; default now) until the verdict is in `state`,
        polled every 20 ms."""
        started = time.monotonic() if since is None else since
        while self.state(name) != state:
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"{name} not {state} within {timeout}s")
            time.sleep(0.02)
        return time.monotonic() - started

    def alive_sandbox(self) -> SandboxScript:
        self.serial += 1
        script = SandboxScript(name=f"sb-{self.serial:04d}", namespace=NS, fate=Fate.EXITS,
                               start=datetime.now(UTC).replace(microsecond=0))  # fmt: skip
        self.kubelet.create(script)
        self.kubelet.status(NS, script.name, statuses(script)[0])
        self.wait_state(script.name, "Alive")
        return script

    def die(self, script: SandboxScript) -> None:
        self.killed.append(script.name)
        self.kubelet.status(NS, script.name, statuses(script)[1])

    def pair(self) -> Replica:
        """A leader and a standby that knows it; returns the leader."""
        while sum(1 for r in self.replicas.members.values() if r.alive()) < 2:
            self.serial += 1
            self.replicas.start(f"replica-{self.serial:04d}")
        leader = self.replicas.wait_leader(timeout=60)
        for r in self.replicas.members.values():
            if r.alive() and r is not leader:
                _until(lambda r=r: _leader_seen(r) == leader.identity, 30)  # type: ignore[misc]
        return leader

    def round(self, stop: Callable[[Replica], object]) -> float:
        leader = self.pair()
        sandbox = self.alive_sandbox()
        # the fault at a random moment of the leader's renewal cycle, not always the same one
        time.sleep(self.rng.uniform(0, self.replicas.timings[2]))
        stop(leader)
        self.die(sandbox)
        return self.wait_state(sandbox.name, "Dead")

    def cold_start(self) -> float:
        for r in list(self.replicas.members.values()):
            if r.alive():
                r.process.stop()
        self.serial += 1
        only = self.replicas.start(f"single-{self.serial:04d}")
        self.replicas.wait_leader(timeout=60)
        sandbox = self.alive_sandbox()
        only.process.stop(signal.SIGTERM)
        self.die(sandbox)
        died = time.monotonic()
        self.serial += 1
        self.replicas.start(f"single-{self.serial:04d}")  # the restart, at once
        return self.wait_state(sandbox.name, "Dead", since=died)

    def rollout(self) -> list[float]:
        """maxSurge 1, maxUnavailable 0: a new replica up, then one old one stopped."""
        old = [r for r in self.replicas.members.values() if r.alive()]
        latencies = []
        for r in old:
            self.serial += 1
            self.replicas.start(f"replica-{self.serial:04d}")
            sandbox = self.alive_sandbox()
            r.process.stop(signal.SIGTERM)
            self.die(sandbox)
            latencies.append(self.wait_state(sandbox.name, "Dead"))
        return latencies

    def dead_events(self) -> dict[str, int]:
        events = self.core.list_namespaced_event(
            NS, field_selector="reason=SandboxDead", _request_timeout=30
        ).items
        counts: dict[str, int] = {}
        for e in events:
            counts[e.involved_object.name] = counts.get(e.involved_object.name, 0) + (e.count or 1)
        return counts


def _leader_seen(replica: Replica) -> str | None:
    leader: str | None = replica.readyz().get("details", {}).get("leader", {}).get("leader")
    return leader


def _until(probe: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.05)


def setup(cp: controlplane.ControlPlane, api: client.ApiClient, work: Path) -> None:
    cp.kubectl_run("apply", "--server-side", "-f", str(ROOT / "manifests" / "base" / "crds"))
    cp.kubectl_run("wait", "--for=condition=Established", "--timeout=60s",
                   "crd/deathwatches.deathwatch.dev", "crd/sandboxverdicts.deathwatch.dev")  # fmt: skip
    cp.kubectl_run("create", "namespace", "deathwatch-system")
    cp.kubectl_run("apply", "-f", str(ROOT / "manifests" / "base" / "rbac" / "controller.yaml"))
    cp.kubectl_run("apply", "-f", str(ROOT / "manifests" / "base" / "rbac" / "metrics-reader.yaml"))
    cp.kubectl_run("create", "namespace", NS)
    cp.kubectl_run("create", "rolebinding", "deathwatch-controller", "-n", NS,
                   "--clusterrole=deathwatch-controller",
                   "--serviceaccount=deathwatch-system:deathwatch-controller")  # fmt: skip
    core = client.CoreV1Api(api)
    _until(lambda: _exists(core), 60)
    service_account_kubeconfig(cp, api, "deathwatch-system", "deathwatch-controller",
                               work / "probe.kubeconfig")  # fmt: skip
    cp.kubectl_run(
        "apply", "-f", "-",
        input=f"apiVersion: {GROUP}/{VERSION}\nkind: DeathWatch\nmetadata: {{name: bench, namespace: {NS}}}\n"
        "spec: {podSelector: {matchLabels: {app: sandbox}}}\n",
    )  # fmt: skip


def _exists(core: client.CoreV1Api) -> bool:
    try:
        core.read_namespaced_service_account("default", NS, _request_timeout=10)
    except client.ApiException:
        return False
    return True


def _terminated(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the cleanup short
    sys.exit(143)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=10, help="rounds of each kind")
    ap.add_argument("--lease-duration", type=float, default=15.0)
    ap.add_argument("--renew-deadline", type=float, default=10.0)
    ap.add_argument("--retry-period", type=float, default=2.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not 0 < args.retry_period < args.renew_deadline < args.lease_duration:
        ap.error("need 0 < --retry-period < --renew-deadline < --lease-duration")

    # a SIGTERM (timeout, CI cancel) unwinds through `finally`: no control plane left behind
    signal.signal(signal.SIGTERM, _terminated)
    work = Path(tempfile.mkdtemp(prefix="deathwatch-failover-"))
    cp = controlplane.ControlPlane(work / "cp")
    results: dict[str, Any] = {"rounds": args.rounds,
                               "timings": [args.lease_duration, args.renew_deadline, args.retry_period]}  # fmt: skip
    bench: Bench | None = None
    try:
        cp.start()
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=configuration)
        api = client.ApiClient(configuration)
        setup(cp, api, work)
        bench = Bench(cp, api, work, (args.lease_duration, args.renew_deadline, args.retry_period))
        times: dict[str, list[float]] = {"sigkill": [], "sigterm": [], "cold_start": []}
        for i in range(args.rounds):
            times["sigterm"].append(bench.round(lambda r: r.process.stop(signal.SIGTERM)))
            times["sigkill"].append(bench.round(lambda r: r.process.kill()))
            times["cold_start"].append(bench.cold_start())
            print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()),
                  file=sys.stderr)  # fmt: skip
        bench.pair()
        rollout: list[float] = []
        for _ in range(max(1, args.rounds // 2)):
            rollout += bench.rollout()
        cold = summary(times["cold_start"], 2)
        for kind, values in times.items():
            results[kind] = summary(values, 2)
        results["rollout"] = summary(rollout, 2)
        results["ratio_sigterm_to_cold_start_p50"] = round(
            results["sigterm"]["p50"] / cold["p50"], 2
        )
        events = bench.dead_events()
        results["deaths"] = len(bench.killed)
        results["dead_events_not_exactly_one"] = sum(1 for n in bench.killed if events.get(n) != 1)
    finally:
        if bench is not None:
            bench.replicas.stop_all()
        cp.destroy()
    if args.json:
        print(json.dumps(results))
    else:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
