#!/usr/bin/env python3
"""deathwatch next to the tools people run instead, on one real API server, in one run.

    python3 -m bench.peers [--pods 1000,10000,30000] [--rate 20] [--seconds 60]
                           [--tools deathwatch,agent-sandbox,kopf-naive,kopf-noop,kube-state-metrics]
                           [--saturation] [--json FILE]

For each N: a fresh control plane (etcd, kube-apiserver, kube-controller-manager, built by
hack/build-k8s.sh), every tool started under a ServiceAccount of its own, then N sandboxes
(Sandbox objects when agent-sandbox runs, so it owns the pods; plain pods otherwise), each pod
made Ready by the bench (it plays kubelet: no real containers). Then a kubelet-like writer
makes `--rate` pod status writes per second for `--seconds`; one write in ten is a death
(exit 1, Ready False, phase Failed), the others change only a condition's timestamp.

The peers (hack/build-peers.sh builds the Go ones from their published modules):
- deathwatch: the controller as shipped, two replicas (leader + hot standby); signal: the
  SandboxVerdict turns Dead.
- agent-sandbox v1.0.3 (sigs.k8s.io/agent-sandbox): its Sandbox's Ready turns False.
- kopf-naive (bench/peer_kopf.py): on.field on status.conditions, annotates the pod.
- kopf-noop: on.event doing nothing; the framework's floor (no signal).
- kube-state-metrics v2.20.0: kube_pod_status_ready{condition="false"} is 1 on /metrics,
  scraped every 100 ms by the bench (a real alert adds the scrape interval, rule evaluation
  and `for:` on top).

Measured per tool: write -> signal seen on the bench's own watch, p50/p95/p99/max (baseline:
write -> the pod change seen on a pod watch); RSS idle and with N sandboxes; CPU seconds during
the load; API writes per sandbox lifecycle that ends in death (the API server's audit log, by
ServiceAccount: writes while the N sandboxes arrived / N + writes during the load / deaths).

--saturation: with deathwatch alone at the largest N, the write rate steps up (20 s a step)
until its p99 passes 1 s; reports the highest rate it sustains.

The bench's own client is lean on purpose (raw HTTP keep-alive connections, JSON lines): its
CPU is shared with everything it measures on this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing
import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench.stats import summary
from deathwatch._engine.timeutil import format_time
from hack.localcluster import agentsandbox, controlplane
from hack.localcluster.controlplane import ControlPlane, free_port, kubeconfig
from hack.localcluster.procstat import rss_mib
from hack.localcluster.sandbox_script import Fate, SandboxScript, pod_manifest, timeline

ROOT = Path(__file__).resolve().parent.parent
NS = "bench"
TOOLS_NS = "bench-tools"
TOOLS = ("deathwatch", "agent-sandbox", "kopf-naive", "kopf-noop", "kube-state-metrics")
SANDBOX_API = "/apis/agents.x-k8s.io/v1beta1"
SANDBOX_CRD = "sandboxes.agents.x-k8s.io"
SV_API = "/apis/deathwatch.dev/v1alpha1"
ANNOTATION = "bench.deathwatch.dev/ready"
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Only the tools' writes are audited (each runs as a ServiceAccount in TOOLS_NS).
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete]
    userGroups: ["system:serviceaccounts:{TOOLS_NS}"]
  - level: None
"""


def versions() -> dict[str, str]:
    env: dict[str, str] = {}
    for line in (ROOT / "hack" / "versions.env").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            env[key] = value
    return env


def peer_bin(module: str, version: str, name: str) -> Path:
    return controlplane.peer_home(module, version) / "bin" / name


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


# --- the bench's own API client: raw HTTPS, one keep-alive connection per thread --------------


class Api:
    def __init__(self, cp: ControlPlane) -> None:
        self.port = cp.apiserver_port
        self.ctx = ssl.create_default_context(cafile=str(cp.certs / "ca.crt"))
        self.ctx.load_cert_chain(str(cp.certs / "admin.crt"), str(cp.certs / "admin.key"))
        self.local = threading.local()

    def connect(self, timeout: float = 30) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "127.0.0.1", self.port, context=self.ctx, timeout=timeout
        )

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        for attempt in range(3):
            conn: http.client.HTTPSConnection | None = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = self.connect()
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
                return resp.status, json.loads(payload) if payload else None
            except (OSError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        status, payload = self.request(method, path, body, **kw)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {payload}")
        return payload


class Watch(threading.Thread):
    """A raw watch of one collection: `on_event(obj, seen_at)` for every event, relisting
    (from a one-item list's resourceVersion) when the stream ends or says 410."""

    def __init__(
        self, api: Api, path: str, on_event: Callable[[dict[str, Any], float], None]
    ) -> None:
        super().__init__(daemon=True)
        self.api, self.path, self.on_event = api, path, on_event
        self.stopped = False
        self.ready = threading.Event()

    def run(self) -> None:
        sep = "&" if "?" in self.path else "?"
        rv: str | None = None
        while not self.stopped:
            try:
                if rv is None:
                    rv = self.api.ok("GET", f"{self.path}{sep}limit=1")["metadata"][
                        "resourceVersion"
                    ]
                conn = self.api.connect(timeout=120)
                conn.request("GET", f"{self.path}{sep}watch=1&allowWatchBookmarks=true"
                             f"&timeoutSeconds=300&resourceVersion={rv}")  # fmt: skip
                resp = conn.getresponse()
                self.ready.set()
                while not self.stopped:
                    line = resp.readline()
                    if not line:
                        break
                    now = time.monotonic()
                    event = json.loads(line)
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        rv = None  # 410 Gone: relist
                        break
                    rv = obj["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self.on_event(obj, now)
                conn.close()
            except (OSError, http.client.HTTPException, ValueError, RuntimeError):
                time.sleep(0.2)


# --- processes ------------------------------------------------------------------------------------


@dataclass
class Tool:
    name: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def rss(self) -> float:
        return sum(rss_mib(p.pid) for p in self.procs.values())

    def cpu(self) -> float:
        return sum(cpu_seconds(p.pid) for p in self.procs.values())

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs.values())

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )  # fmt: skip


def wait_http(port: int, path: str, timeout: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"127.0.0.1:{port}{path} not healthy within {timeout}s")


# --- one run --------------------------------------------------------------------------------------


@dataclass
class Signals:
    """What the bench saw on its own watches, per sandbox name."""

    pod_rv: dict[str, float] = field(default_factory=dict)  # "name/rv" -> first seen
    pods: set[str] = field(default_factory=set)
    annotated: dict[str, str] = field(default_factory=dict)  # kopf-naive's last annotation
    dead: dict[str, dict[str, float]] = field(default_factory=lambda: {t: {} for t in TOOLS})
    alive: dict[str, set[str]] = field(default_factory=lambda: {t: set() for t in TOOLS})
    lock: threading.Lock = field(default_factory=threading.Lock)

    def saw(self, tool: str, name: str, dead: bool, at: float) -> None:
        with self.lock:
            if dead:
                self.dead[tool].setdefault(name, at)
                self.alive[tool].discard(name)
            elif name not in self.dead[tool]:
                self.alive[tool].add(name)

    def on_pod(self, obj: dict[str, Any], at: float) -> None:
        meta = obj["metadata"]
        name = meta["name"]
        self.pod_rv.setdefault(f"{name}/{meta['resourceVersion']}", at)
        self.pods.add(name)
        ready = (meta.get("annotations") or {}).get(ANNOTATION)
        if ready is not None:
            self.saw("kopf-naive", name, ready == "False", at)

    def on_verdict(self, obj: dict[str, Any], at: float) -> None:
        state = (obj.get("status") or {}).get("state")
        if state in ("Alive", "Dead"):
            self.saw("deathwatch", obj["metadata"]["name"], state == "Dead", at)

    def on_sandbox(self, obj: dict[str, Any], at: float) -> None:
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Ready":
                if c.get("status") == "True":
                    self.saw("agent-sandbox", obj["metadata"]["name"], False, at)
                elif c.get("reason") == "PodFailed":
                    self.saw("agent-sandbox", obj["metadata"]["name"], True, at)


KSM_FALSE = re.compile(
    rb'kube_pod_status_ready\{[^}]*pod="([^"]+)"[^}]*condition="(true|false)"\} 1'
)


def scrape(port: int, out: Connection) -> None:
    """Poll kube-state-metrics' /metrics every 100 ms, as a fast Prometheus would; send each
    pod's Ready transitions (name, false?, monotonic time seen). Its own process: parsing
    30,000 lines ten times a second must not hold the GIL the bench's watches time with."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    last: dict[bytes, bytes] = {}
    while True:
        started = time.monotonic()
        try:
            conn.request("GET", "/metrics")
            body = conn.getresponse().read()
        except (OSError, http.client.HTTPException):
            conn.close()
            time.sleep(0.1)
            continue
        at = time.monotonic()
        changes = []
        for name, cond in KSM_FALSE.findall(body):
            if last.get(name) != cond:
                last[name] = cond
                changes.append((name.decode(), cond == b"false", at))
        if changes:
            out.send(changes)
        time.sleep(max(0.0, 0.1 - (time.monotonic() - started)))


class Scraper(threading.Thread):
    """Receives what the scraping process saw."""

    def __init__(self, port: int, signals: Signals) -> None:
        super().__init__(daemon=True)
        self.signals, self.stopped = signals, False
        self.inbox, outbox = multiprocessing.Pipe(duplex=False)
        self.process = multiprocessing.get_context("fork").Process(
            target=scrape, args=(port, outbox), daemon=True
        )

    def run(self) -> None:
        self.process.start()
        while not self.stopped:
            try:
                if not self.inbox.poll(0.2):
                    continue
                changes = self.inbox.recv()
            except (EOFError, OSError):
                return  # the scraping process ended (stop)
            for name, dead, at in changes:
                self.signals.saw("kube-state-metrics", name, dead, at)

    def stop(self) -> None:
        self.stopped = True
        self.process.terminate()


WRITER_PROCESSES = 4
WRITER_THREADS = 4


def write_statuses(
    api: Api,
    bodies: dict[str, tuple[bytes, bytes]],
    jobs: multiprocessing.Queue[tuple[str, bool] | None],
    done: multiprocessing.Queue[list[tuple[str, bool, str, float]]],
) -> None:
    """One writer process: WRITER_THREADS keep-alive connections taking (pod, death?) jobs
    until a None each; sends back (pod, death?, resourceVersion, monotonic time returned).
    CLOCK_MONOTONIC is one clock for every process on the machine, so the parent compares
    these times with its watches' directly."""
    results: list[tuple[str, bool, str, float]] = []
    lock = threading.Lock()

    def worker() -> None:
        while (job := jobs.get()) is not None:
            name, death = job
            ready, dead = bodies[name]
            body = dead
            if not death:
                status = json.loads(ready)
                status["status"]["conditions"][0]["lastTransitionTime"] = format_time(
                    datetime.now(UTC)
                )
                body = json.dumps(status).encode()
            code, pod = api.request(
                "PATCH",
                f"/api/v1/namespaces/{NS}/pods/{name}/status",
                body,
                "application/merge-patch+json",
            )
            now = time.monotonic()
            if code == 200:
                with lock:
                    results.append((name, death, pod["metadata"]["resourceVersion"], now))

    threads = [threading.Thread(target=worker) for _ in range(WRITER_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.put(results)


@dataclass
class Run:
    cp: ControlPlane
    api: Api
    work: Path
    tools: tuple[str, ...]
    signals: Signals = field(default_factory=Signals)
    running: dict[str, Tool] = field(default_factory=dict)
    watches: list[Watch] = field(default_factory=list)
    scraper: Scraper | None = None

    # --- setup -----------------------------------------------------------------------------------

    def kubectl(self, *args: str, stdin: str | None = None) -> None:
        self.cp.kubectl_run(*args, input=stdin)

    def service_account(self, name: str) -> Path:
        self.api.ok(
            "POST", f"/api/v1/namespaces/{TOOLS_NS}/serviceaccounts", {"metadata": {"name": name}}
        )
        self.api.ok("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "metadata": {"name": f"bench-{name}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": TOOLS_NS}],
        })  # fmt: skip
        token = self.api.ok(
            "POST", f"/api/v1/namespaces/{TOOLS_NS}/serviceaccounts/{name}/token",
            {"spec": {"expirationSeconds": 14400}},
        )["status"]["token"]  # fmt: skip
        path = self.work / f"{name}.kubeconfig"
        path.write_text(
            kubeconfig(self.cp.server, self.cp.certs / "ca.crt", None, None, token=token, user=name)
        )
        return path

    def setup(self) -> None:
        crds = ROOT / "manifests" / "base" / "crds"
        self.kubectl("apply", "--server-side", "-f", str(crds))
        if "agent-sandbox" in self.tools:  # its release CRD, as tests/node/test_agent_sandbox.py
            (crd,) = (c for c in agentsandbox.crds() if c["metadata"]["name"] == SANDBOX_CRD)
            self.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(crd))
        crd_names = ["crd/deathwatches.deathwatch.dev", "crd/sandboxverdicts.deathwatch.dev"]
        crd_names += [f"crd/{SANDBOX_CRD}"] * ("agent-sandbox" in self.tools)
        self.kubectl("wait", "--for=condition=Established", *crd_names)
        for ns in (NS, TOOLS_NS, "deathwatch-system"):
            self.api.ok("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        deadline = time.monotonic() + 60
        while self.api.request("GET", f"/api/v1/namespaces/{NS}/serviceaccounts/default")[0] != 200:
            if time.monotonic() > deadline:
                raise TimeoutError("no default ServiceAccount in the bench namespace")
            time.sleep(0.1)
        self.api.ok("POST", f"{SV_API}/namespaces/{NS}/deathwatches", {
            "apiVersion": "deathwatch.dev/v1alpha1", "kind": "DeathWatch",
            "metadata": {"name": "bench"}, "spec": {"podSelector": {"matchLabels": {"app": "sandbox"}}},
        })  # fmt: skip

    def start_tools(self) -> None:
        logs = self.work / "logs"
        logs.mkdir(exist_ok=True)
        v = versions()
        for name in self.tools:
            kc = self.service_account(name)
            tool = self.running[name] = Tool(name)
            if name == "deathwatch":
                for identity in ("dw-a", "dw-b"):
                    port = free_port()
                    tool.procs[identity] = spawn([
                        sys.executable, "-m", "deathwatch._cli", "controller", "--kubeconfig", str(kc),
                        "--namespace", NS, "--pod-label-selector", "app=sandbox",
                        "--metrics-address", f"127.0.0.1:{free_port()}",
                        "--health-address", f"127.0.0.1:{port}",
                        "--leader-elect", f"--identity={identity}",
                    ], logs / f"{identity}.log")  # fmt: skip
                    wait_http(port, "/healthz", 60, tool.procs[identity])
            elif name == "agent-sandbox":
                port = free_port()
                tool.procs[name] = spawn([
                    str(peer_bin("sigs.k8s.io/agent-sandbox", v["AGENT_SANDBOX_VERSION"], "agent-sandbox-controller")),
                    "--leader-elect=false",
                    f"--metrics-bind-address=127.0.0.1:{free_port()}", f"--health-probe-bind-address=127.0.0.1:{port}",
                ], logs / f"{name}.log", env={"KUBECONFIG": str(kc)})  # fmt: skip
                wait_http(port, "/readyz", 60, tool.procs[name])
            elif name in ("kopf-naive", "kopf-noop"):
                port = free_port()
                tool.procs[name] = spawn([
                    sys.executable, "-m", "kopf", "run", "--standalone", "--namespace", NS,
                    f"--liveness=http://127.0.0.1:{port}/healthz", str(ROOT / "bench" / "peer_kopf.py"),
                ], logs / f"{name}.log", env={"KUBECONFIG": str(kc), "PEER_MODE": name.removeprefix("kopf-")})  # fmt: skip
                wait_http(port, "/healthz", 60, tool.procs[name])
            elif name == "kube-state-metrics":
                port = free_port()
                tool.procs[name] = spawn([
                    str(peer_bin("k8s.io/kube-state-metrics/v2", v["KSM_VERSION"], "kube-state-metrics")),
                    f"--kubeconfig={kc}", "--resources=pods", f"--namespaces={NS}",
                    "--metric-allowlist=kube_pod_status_ready", "--host=127.0.0.1", f"--port={port}",
                    "--telemetry-host=127.0.0.1", f"--telemetry-port={free_port()}",
                ], logs / f"{name}.log")  # fmt: skip
                wait_http(port, "/healthz", 60, tool.procs[name])
                self.scraper = Scraper(port, self.signals)
        self.watches = [
            Watch(
                self.api,
                f"/api/v1/namespaces/{NS}/pods?labelSelector=app%3Dsandbox",
                self.signals.on_pod,
            )
        ]
        if "deathwatch" in self.tools:
            self.watches.append(
                Watch(
                    self.api, f"{SV_API}/namespaces/{NS}/sandboxverdicts", self.signals.on_verdict
                )
            )
        if "agent-sandbox" in self.tools:
            self.watches.append(
                Watch(self.api, f"{SANDBOX_API}/namespaces/{NS}/sandboxes", self.signals.on_sandbox)
            )
        for w in self.watches:
            w.start()
            w.ready.wait(30)
        if self.scraper is not None:
            self.scraper.start()

    def stop(self) -> None:
        for w in self.watches:
            w.stopped = True
        if self.scraper is not None and self.scraper.process.pid is not None:
            self.scraper.stop()
        for tool in self.running.values():
            tool.stop()

    # --- sandboxes -------------------------------------------------------------------------------

    def create(
        self, names: list[str], fate: Fate, workers: int = 6
    ) -> dict[str, tuple[bytes, bytes]]:
        """N sandboxes made Ready; returns each one's (Ready status, death status) patch bodies."""
        start = datetime.now(UTC).replace(microsecond=0)
        bodies: dict[str, tuple[bytes, bytes]] = {}

        def one(name: str) -> None:
            script = SandboxScript(name=name, namespace=NS, fate=fate, start=start)
            pod = pod_manifest(script)
            if "agent-sandbox" in self.tools:
                self.api.ok("POST", f"{SANDBOX_API}/namespaces/{NS}/sandboxes", {
                    "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "metadata": {"name": name},
                    "spec": {"podTemplate": {"metadata": {"labels": pod["metadata"]["labels"]}, "spec": pod["spec"]}},
                })  # fmt: skip
            else:
                self.api.ok("POST", f"/api/v1/namespaces/{NS}/pods", pod)
            moments = [m.status for m in timeline(script) if m.status is not None]
            ready, death = dict(moments[0]), dict(moments[-1])
            for status in (ready, death):
                status["podIPs"] = [{"ip": status["podIP"]}]
            bodies[name] = (
                json.dumps({"status": ready}).encode(),
                json.dumps({"status": death}).encode(),
            )
            path = f"/api/v1/namespaces/{NS}/pods/{name}/status"
            for _ in range(600):  # agent-sandbox creates the pod: wait for it
                code, payload = self.api.request(
                    "PATCH", path, bodies[name][0], "application/merge-patch+json"
                )
                if code == 200:
                    return
                if code != 404:
                    raise RuntimeError(f"PATCH {path}: {code} {payload}")
                time.sleep(0.05)
            raise TimeoutError(f"pod {name} never appeared")

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, names))
        return bodies

    def settled(self, names: list[str], timeout: float) -> dict[str, float]:
        """Wait until every tool with a signal says Alive for all `names`; seconds each took."""
        started = time.monotonic()
        took: dict[str, float] = {}
        want = set(names)
        deadline = started + timeout
        signalled = [t for t in self.tools if t != "kopf-noop"]
        while time.monotonic() < deadline and len(took) < len(signalled):
            for t in signalled:
                if t not in took and want <= self.signals.alive[t]:
                    took[t] = round(time.monotonic() - started, 1)
            time.sleep(0.2)
        missing = {t: len(want - self.signals.alive[t]) for t in signalled if t not in took}
        if missing:
            raise TimeoutError(
                f"not all sandboxes Alive after {timeout}s, missing per tool: {missing}"
            )
        return took

    def load(self, names: list[str], bodies: dict[str, tuple[bytes, bytes]], rate: float,
             seconds: float) -> dict[str, Any]:  # fmt: skip
        """The kubelet-like writer: `rate` status writes/s, one in ten a death. Returns what
        each write returned at, per death and per no-op write. The writes go out from
        WRITER_PROCESSES forked processes: one process's GIL tops out near 150 writes/s here,
        which would cap the saturation step, and would share a GIL with the watches that time
        the signals."""
        deaths: dict[str, float] = {}
        noops: dict[str, float] = {}
        live = [n for n in names]
        victims = iter(list(names))
        ctx = multiprocessing.get_context("fork")
        jobs: multiprocessing.Queue[tuple[str, bool] | None] = ctx.Queue()
        done: multiprocessing.Queue[list[tuple[str, bool, str, float]]] = ctx.Queue()
        writers = [
            ctx.Process(target=write_statuses, args=(self.api, bodies, jobs, done), daemon=True)
            for _ in range(WRITER_PROCESSES)
        ]
        for w in writers:
            w.start()
        lag: list[float] = []
        interval = 1.0 / rate
        total = int(rate * seconds)
        dead_names: set[str] = set()
        started = time.monotonic()
        for i in range(total):
            target = started + i * interval
            now = time.monotonic()
            if target > now:
                time.sleep(target - now)
            else:
                lag.append(now - target)
            if i % 10 == 0:
                name = next(victims, None)
                if name is None:
                    break
                dead_names.add(name)
                jobs.put((name, True))
            else:
                name = live[(i * 7919) % len(live)]
                if name in dead_names:
                    continue
                jobs.put((name, False))
        for _ in range(WRITER_PROCESSES * WRITER_THREADS):
            jobs.put(None)
        for _ in writers:
            for name, death, rv, at in done.get(timeout=120):
                if death:
                    deaths[name] = at
                else:
                    noops[f"{name}/{rv}"] = at
        for w in writers:
            w.join(timeout=30)
        elapsed = time.monotonic() - started
        return {"deaths": deaths, "noops": noops, "writes": total, "rate": total / elapsed,
                "dispatch_lag_max_ms": round(max(lag, default=0.0) * 1e3, 1)}  # fmt: skip

    def wait_verdicts(self, deaths: dict[str, float], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        signalled = [t for t in self.tools if t != "kopf-noop"]
        while time.monotonic() < deadline:
            if all(n in self.signals.dead[t] for t in signalled for n in deaths):
                return
            time.sleep(0.1)

    def latencies(self, tool: str, deaths: dict[str, float]) -> list[float]:
        return [
            (self.signals.dead[tool][n] - t) * 1e3
            for n, t in deaths.items()
            if n in self.signals.dead[tool]
        ]


@dataclass(frozen=True)
class AuditWrite:
    tool: str
    resource: str
    at: datetime


def audit_writes(log: Path) -> Iterator[AuditWrite]:
    """Every audited write, from the log and the files it was rotated into (100 MB each)."""
    prefix = f"system:serviceaccount:{TOOLS_NS}:"
    for path in sorted(log.parent.glob(f"{log.stem}*{log.suffix}")):
        yield from _audit_file(path, prefix)


def _audit_file(path: Path, prefix: str) -> Iterator[AuditWrite]:
    with path.open() as f:
        for line in f:
            e = json.loads(line)
            user = e.get("user", {}).get("username", "")
            if not user.startswith(prefix) or e.get("stage") != "ResponseComplete":
                continue
            if e.get("responseStatus", {}).get("code", 0) >= 300:
                continue
            ref = e.get("objectRef", {})
            resource = ref.get("resource", "") + (
                "/" + ref["subresource"] if ref.get("subresource") else ""
            )
            at = datetime.fromisoformat(e["stageTimestamp"].replace("Z", "+00:00"))
            yield AuditWrite(user.removeprefix(prefix), resource, at)


def gc_pauses(offsets: dict[Path, int]) -> dict[str, Any]:
    """The controller's own GC-pause log lines (gcpauses.py) written since `offsets`: the
    collector's pauses during the load, to set next to the latency samples."""
    pauses: list[float] = []
    for path, offset in offsets.items():
        with path.open("rb") as f:
            f.seek(offset)
            for line in f:
                if b'"gc pause"' in line:
                    with contextlib.suppress(ValueError):
                        pauses.append(float(json.loads(line)["seconds"]) * 1e3)
    return {"count": len(pauses), "max_ms": round(max(pauses), 1) if pauses else 0.0}


def measure(
    n: int, rate: float, seconds: float, tools: tuple[str, ...], work: Path
) -> dict[str, Any]:
    cp = ControlPlane(work / "cp", audit=True, audit_policy=AUDIT_POLICY)
    run: Run | None = None
    try:
        cp.start()
        api = Api(cp)
        run = Run(cp, api, work, tools)
        run.setup()
        run.start_tools()
        time.sleep(3)
        idle = {t: round(run.running[t].rss(), 1) for t in tools}
        names = [f"sb-{i:05d}" for i in range(n)]
        created_at = time.monotonic()
        bodies = run.create(names, Fate.EXITS)
        settle = run.settled(names, timeout=600 + n / 20)
        create_s = time.monotonic() - created_at
        time.sleep(10)  # kopf's per-object workers exit after 5 s idle: the steady state
        at_n = {t: round(run.running[t].rss(), 1) for t in tools}
        per_process = {
            t: {k: round(rss_mib(p.pid), 1) for k, p in run.running[t].procs.items()} for t in tools
        }
        api_proc = cp.processes["kube-apiserver"].popen
        cpu_before = {t: run.running[t].cpu() for t in tools}
        cpu_before["kube-apiserver"] = cpu_seconds(api_proc.pid)  # type: ignore[union-attr]
        load_wall = datetime.now(UTC)
        log_offsets = {p: p.stat().st_size for p in (work / "logs").glob("dw-*.log")}
        writes = run.load(names, bodies, rate, seconds)
        run.wait_verdicts(writes["deaths"], 30)
        cpu = {t: round(run.running[t].cpu() - cpu_before[t], 2) for t in tools}
        cpu["kube-apiserver"] = round(cpu_seconds(api_proc.pid) - cpu_before["kube-apiserver"], 2)  # type: ignore[union-attr]
        peak = {
            t: round(sum(rss_mib(p.pid, "VmHWM") for p in run.running[t].procs.values()), 1)
            for t in tools
        }
        deaths = writes["deaths"]
        baseline = [
            (run.signals.pod_rv[k] - t) * 1e3
            for k, t in writes["noops"].items()
            if k in run.signals.pod_rv
        ]
        run.stop()
        time.sleep(1)
        by_tool: dict[str, dict[str, int]] = {t: {"setup": 0, "load": 0} for t in tools}
        for w in audit_writes(cp.audit_log):
            if w.tool in by_tool and w.resource != "leases":
                phase = "load" if w.at >= load_wall else "setup"
                by_tool[w.tool][phase] += 1
                key = f"{phase} {w.resource}"
                by_tool[w.tool][key] = by_tool[w.tool].get(key, 0) + 1
        result: dict[str, Any] = {
            "pods": n, "rate": round(writes["rate"], 1), "seconds": seconds, "deaths": len(deaths),
            "dispatch_lag_max_ms": writes["dispatch_lag_max_ms"], "create_s": round(create_s, 1),
            "baseline_watch_ms": summary(baseline), "settle_s": settle, "tools": {},
        }  # fmt: skip
        for t in tools:
            lat = run.latencies(t, deaths) if t != "kopf-noop" else []
            counts = by_tool[t]
            result["tools"][t] = {
                "latency_ms": summary(lat) if lat else None,
                "seen": len(lat),
                "rss_idle_mib": idle[t], "rss_at_n_mib": at_n[t], "rss_peak_mib": peak[t],
                "rss_at_n_per_process_mib": per_process[t],
                "cpu_s_load": cpu[t],
                "writes_per_lifecycle": round(counts["setup"] / n + counts["load"] / max(1, len(deaths)), 2),
                "writes": counts,
            }  # fmt: skip
        result["apiserver_cpu_s_load"] = cpu["kube-apiserver"]
        if "deathwatch" in tools:
            result["tools"]["deathwatch"]["gc_pauses_over_50ms_in_load"] = gc_pauses(log_offsets)
        return result
    finally:
        if run is not None:
            run.stop()
        cp.destroy()


def saturation(n: int, rates: list[float], seconds: float, work: Path) -> dict[str, Any]:
    """deathwatch alone (two replicas) at N: the highest write rate with p99 < 1 s."""
    cp = ControlPlane(work / "cp", audit=False)
    run: Run | None = None
    steps: list[dict[str, Any]] = []
    try:
        cp.start()
        run = Run(cp, Api(cp), work, ("deathwatch",))
        run.setup()
        run.start_tools()
        names = [f"sb-{i:05d}" for i in range(n)]
        bodies = run.create(names, Fate.EXITS)
        run.settled(names, timeout=600 + n / 20)
        remaining = list(names)
        api_proc = cp.processes["kube-apiserver"].popen
        assert api_proc is not None
        dw = run.running["deathwatch"]
        for rate in rates:
            need = int(rate * seconds / 10) + 1
            if len(remaining) < need * 2:
                break
            cpu_before = (
                cpu_seconds(api_proc.pid),
                {k: cpu_seconds(p.pid) for k, p in dw.procs.items()},
            )
            started = time.monotonic()
            writes = run.load(remaining, bodies, rate, seconds)
            wall = time.monotonic() - started
            run.wait_verdicts(writes["deaths"], 30)
            lat = run.latencies("deathwatch", writes["deaths"])
            baseline = [(run.signals.pod_rv[k] - t) * 1e3 for k, t in writes["noops"].items()
                        if k in run.signals.pod_rv]  # fmt: skip
            # CPU as a share of one core over the step's writing: the API server's next to each
            # replica's, so a step that fails shows whose ceiling it hit
            step = {"target_rate": rate, "rate": round(writes["rate"], 1), "deaths": len(writes["deaths"]),
                    "seen": len(lat), "latency_ms": summary(lat),
                    "baseline_watch_ms": summary(baseline) if baseline else None,
                    "apiserver_cores": round((cpu_seconds(api_proc.pid) - cpu_before[0]) / wall, 2),
                    "deathwatch_cores": {k: round((cpu_seconds(p.pid) - cpu_before[1][k]) / wall, 2)
                                         for k, p in dw.procs.items()}}  # fmt: skip
            steps.append(step)
            print(f"  saturation step {step}", file=sys.stderr)
            remaining = [x for x in remaining if x not in writes["deaths"]]
            if len(lat) < len(writes["deaths"]) or step["latency_ms"]["p99"] >= 1000:
                break
            if writes["rate"] < 0.9 * rate:
                break  # the API server (or the bench) cannot take writes faster here
        sustained = [s for s in steps if s["seen"] == s["deaths"] and s["latency_ms"]["p99"] < 1000]
        return {"pods": n, "seconds_per_step": seconds, "steps": steps,
                "max_sustained_rate": max((s["rate"] for s in sustained), default=0.0)}  # fmt: skip
    finally:
        if run is not None:
            run.stop()
        cp.destroy()


def table(result: dict[str, Any]) -> str:
    lines = [
        f"N = {result['pods']:,}: {result['rate']} status writes/s for {result['seconds']:.0f} s, "
        f"{result['deaths']} deaths; watch baseline p50 {result['baseline_watch_ms']['p50']} ms, "
        f"p99 {result['baseline_watch_ms']['p99']} ms; API server CPU {result['apiserver_cpu_s_load']} s",
        "| tool | p50 ms | p95 ms | p99 ms | max ms | seen | RSS idle MiB | RSS at N MiB | CPU s in load | writes/lifecycle |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t, r in result["tools"].items():
        lat = r["latency_ms"] or {}
        cells = [lat.get(q, "—") for q in ("p50", "p95", "p99", "max")]
        lines.append(
            f"| {t} | " + " | ".join(str(c) for c in cells)
            + f" | {r['seen'] if r['latency_ms'] else '—'} | {r['rss_idle_mib']} | {r['rss_at_n_mib']}"
            f" | {r['cpu_s_load']} | {r['writes_per_lifecycle']} |"
        )  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pods", default="1000,10000,30000", help="comma-separated N values")
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument(
        "--saturation", action="store_true", help="also ramp deathwatch alone at the largest N"
    )
    ap.add_argument("--saturation-pods", type=int, default=None)
    ap.add_argument("--saturation-rates", default="50,100,200,300,400,500,600,800,1000")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    try:
        sizes = [int(x) for x in args.pods.split(",")]
        tools = tuple(t.strip() for t in args.tools.split(",") if t.strip())
        rates = [float(x) for x in args.saturation_rates.split(",")]
    except ValueError as exc:
        ap.error(f"bad number: {exc}")
    unknown = set(tools) - set(TOOLS)
    if unknown:
        ap.error(f"--tools: unknown {sorted(unknown)}; known: {', '.join(TOOLS)}")
    if any(n < 20 for n in sizes):
        ap.error("--pods: each N must be at least 20")
    v = versions()
    needed = {"agent-sandbox": peer_bin("sigs.k8s.io/agent-sandbox", v["AGENT_SANDBOX_VERSION"], "agent-sandbox-controller"),
              "kube-state-metrics": peer_bin("k8s.io/kube-state-metrics/v2", v["KSM_VERSION"], "kube-state-metrics")}  # fmt: skip
    for script in ("build-k8s.sh", "build-peers.sh"):  # idempotent: nothing when cached
        if subprocess.run([str(ROOT / "hack" / script)], check=False).returncode != 0:
            print(f"hack/{script} failed: the bench cannot run", file=sys.stderr)
            return 2
    missing = [str(p) for t, p in needed.items() if t in tools and not p.exists()]
    if missing:
        print(f"peers not built ({', '.join(missing)}): see hack/build-peers.sh", file=sys.stderr)
        return 2
    results: dict[str, Any] = {
        "runs": [],
        "versions": {k: v[k] for k in ("K8S_VERSION", "KSM_VERSION", "AGENT_SANDBOX_VERSION")},
    }
    for n in sizes:
        work = Path(tempfile.mkdtemp(prefix=f"deathwatch-peers-{n}-"))
        print(f"N = {n}: running {', '.join(tools)} (work dir {work})", file=sys.stderr)
        result = measure(n, args.rate, args.seconds, tools, work)
        results["runs"].append(result)
        print(table(result), flush=True)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    if args.saturation:
        n = args.saturation_pods or max(sizes)
        work = Path(tempfile.mkdtemp(prefix="deathwatch-saturation-"))
        print(f"saturation: deathwatch alone at N = {n}", file=sys.stderr)
        results["saturation"] = saturation(n, rates, 20.0, work)
        print(
            f"saturation at N = {n:,}: highest rate with p99 < 1 s: {results['saturation']['max_sustained_rate']} writes/s"
        )
        for s in results["saturation"]["steps"]:
            print(f"  {s['rate']} writes/s: p50 {s['latency_ms']['p50']} ms, p99 {s['latency_ms']['p99']} ms, "
                  f"max {s['latency_ms']['max']} ms ({s['seen']}/{s['deaths']} deaths seen); "
                  f"watch baseline p99 {(s['baseline_watch_ms'] or {}).get('p99')} ms; cores: "
                  f"API server {s['apiserver_cores']}, deathwatch {s['deathwatch_cores']}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # SIGTERM ends the run like Ctrl-C: every tool and the control plane are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
