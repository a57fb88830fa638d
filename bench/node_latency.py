#!/usr/bin/env python3
"""The whole path of a sandbox's death on a real node, kill to verdict, decomposed (ADR 0028):

    python3 -m bench.node_latency [--kills 60] [--runtime containerd|containerd2|gvisor]
                                  [--runtime-stream auto|cri|containerd] [--evented-pleg]
                                  [--replace-at-kill] [--installed] [--json FILE]
    python3 -m bench.node_latency --chart RESULT.json [RESULT.json ...] OUT.png

One run: a control plane and a real node (kubelet, containerd: Debian's 1.6, or 2.x built
from its module; with `--evented-pleg` the kubelet's alpha EventedPLEG), agent-sandbox's
controller, and deathwatch as two replicas on one Lease: the leader with the node's exits
(`--node-exits`, the exits observer on the node's containerd) and a signed CloudEvents sink,
the standby without them, judging from the kubelet's reports alone. Sandboxes (agent-sandbox
Sandboxes of the test agent) are killed from the host, 0.25-1.25 s apart, in turn by a
SIGKILL of the container's process, `exit 3` and an OOM kill under a 24 MiB limit (the
test agent's /ctl/bell rung, so it acts at once). Each killed sandbox's replacement is made
once the kill's verdict and delivery are seen, not at the kill.

With `--installed`, deathwatch runs as a cluster operator installs it instead: both images
built from their Dockerfiles, `kubectl apply -k manifests/overlays/local-node` on a whole
cluster (hack/localcluster/cluster.py), so the controller's two replicas and the exits
container are pods under their manifests' CPU requests and limits, beside the firewall in
force. Both replicas then hear the node's exits, and no sink is declared: the kubelet-path
verdict and the sink's 2xx are not measured, and each container's CPU and throttling (its
cgroup) over the kills are.

Each kill is timed, on this machine's one clock, at:
- runtime: the exit as containerd recorded it (the exits Lease's `at`);
- heard: deathwatch's node observation (the exits Lease showing it, on the bench's watch);
- verdict: the SandboxVerdict Dead on the bench's watch (the leader, node path);
- sink: the Dead event accepted by the sink (its 2xx);
- kubelet: the pod's status saying so (the kubelet's relist and write);
- kubelet-path verdict: the standby's Dead, as its log stamps it (no node exits);
- agent-sandbox: its Sandbox's Ready turning False.
Every cause is checked (ContainerExited 137 and 3, OOMKilled). The JSON holds every span's
p50/p95/p99/max; `--chart` draws runs side by side as the latency chart is drawn.

`--runtime gvisor`: containerd 2.x with gVisor's runsc beside runc, every Sandbox under
`runtimeClassName: gvisor` (ADR 0033). The host cannot signal one container there: the SIGKILL
is the sandbox's (its Sentry's), and it and the OOM kill read 128 (the shim's status it could
not read). A host FIFO is no bell inside a gVisor sandbox: the agent acts at its next look.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from bench import quantile_chart
from bench.stats import summary
from deathwatch._kube import exits as wire
from hack.localcluster import agentpods, agentsandbox, controlplane, procstat
from hack.localcluster import cluster as localcluster
from hack.localcluster.controller_process import (
    ControllerProcess,
    metrics_reader_token,
    service_account_kubeconfig,
    service_account_token,
)
from hack.localcluster.node import (
    GVISOR_RUNTIME_CLASS,
    NODE_NAME,
    RUNTIME_SOCKET,
    Node,
    gvisor_sandbox_pid,
)
from hack.localcluster.receiver import Receiver, sink_secret

ROOT = Path(__file__).resolve().parent.parent
NS = "bench-node"
SYSTEM = "deathwatch-system"
SANDBOXES = ("agents.x-k8s.io", "v1beta1", "sandboxes")
KEY = b"bench-node-latency-signing-key-32b"
KILLS = ("sigkill", "exit", "oom")
EXPECTED = {"sigkill": ("ContainerExited", 137), "exit": ("ContainerExited", 3),
            "oom": ("OOMKilled", 137)}  # fmt: skip
EXPECTED_GVISOR = {**EXPECTED, "sigkill": ("ContainerExited", 128), "oom": ("OOMKilled", 128)}
SPANS = ("runtime", "heard", "verdict", "sink", "kubelet", "kubelet_path_verdict", "agent_sandbox")
LIVE = 6  # sandboxes alive at once, each waiting for its kill
COUNTED = 10  # --count-requests: sandboxes killed, then as many deleted, each phase counted
# --count-requests: every request deathwatch's two identities make, from the audit log
COUNT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users:
      - system:serviceaccount:{SYSTEM}:deathwatch-controller
      - system:serviceaccount:{SYSTEM}:deathwatch-firewall
  - level: None
"""


def whsec(key: bytes) -> str:
    import base64

    return "whsec_" + base64.b64encode(key).decode()


@dataclass
class Kill:
    sandbox: str
    how: str
    pod: str = ""
    uid: str = ""
    at: float = 0.0  # wall clock: the kill
    seen: dict[str, float] = field(default_factory=dict)  # span -> wall clock
    verdict: dict[str, Any] = field(default_factory=dict)


class Seen:
    """What the bench's watches saw, by pod (uid or name), first time only."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_pod: dict[str, dict[str, float]] = {}
        self.times: dict[tuple[str, str], list[float]] = {}
        self.verdicts: dict[str, dict[str, Any]] = {}
        self.pod_of: dict[str, tuple[str, str]] = {}  # Sandbox name -> its pod's name and uid
        self.state: dict[str, str] = {}  # pod uid -> its verdict's state, as last seen

    def note(self, pod: str, span: str, at: float | None = None) -> None:
        with self.lock:
            self.by_pod.setdefault(pod, {}).setdefault(span, at if at is not None else time.time())
            # every time seen: a span counts from the first one after its kill (a Sandbox is
            # Ready False while it starts, too)
            self.times.setdefault((pod, span), []).append(at if at is not None else time.time())

    def after(self, pod: str, span: str, kill: float) -> float | None:
        with self.lock:
            return next((t for t in self.times.get((pod, span), ()) if t >= kill - 0.002), None)


def follow(stop: threading.Event, lister: Callable[..., Any], on: Callable[[dict[str, Any]], None],
           *args: Any) -> None:  # fmt: skip
    """A watch for ever (until `stop`), reconnected; each event's object to `on`, as a dict."""
    api = client.ApiClient()
    while not stop.is_set():
        with contextlib.suppress(Exception):
            # deserialize=False: dicts, not models (the pods' models cost the GIL the other
            # watches need, and delay what they see)
            for event in watch.Watch().stream(lister, *args, timeout_seconds=30,
                                              _request_timeout=60, deserialize=False):  # fmt: skip
                obj = event["object"]
                on(obj if isinstance(obj, dict) else api.sanitize_for_serialization(obj))
                if stop.is_set():
                    return


class Bench:
    def __init__(self, work: Path, runtime: str, evented_pleg: bool,
                 replace_at_kill: bool = False, stream: str = "auto",
                 installed: bool = False,
                 apart: tuple[float, float] = (0.25, 1.25),
                 count_requests: bool = False) -> None:  # fmt: skip
        self.work, self.runtime, self.evented_pleg = work, runtime, evented_pleg
        self.apart = apart  # seconds between kills, drawn uniformly
        self.count_requests = count_requests
        self.requests: dict[str, Any] = {}  # --count-requests: per death, per deletion
        self.gvisor = runtime == "gvisor"  # containerd 2.x, every Sandbox under gVisor
        self.stream = stream  # the exits container's --runtime-stream
        self.replace_at_kill = replace_at_kill
        self.installed = installed
        self.installation: localcluster.Cluster | None = None  # --installed: the cluster
        self.receiver: Receiver | None = None  # the sink (host processes only)
        self.cpu: dict[str, dict[str, float]] = {}  # --installed: each container's, the kills
        self.stop = threading.Event()
        self.seen = Seen()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.kills: list[Kill] = []

    # --- the cluster --------------------------------------------------------------------

    @contextlib.contextmanager
    def cluster(self) -> Iterator[None]:
        if self.installed:
            with self._installed():
                yield
            return
        cp = controlplane.ControlPlane(self.work / "cp", audit=self.count_requests,
                                       audit_policy=COUNT_POLICY)  # fmt: skip
        self.cp = cp
        node: Node | None = None
        others: list[Any] = []
        try:
            cp.start()
            node = Node(cp, runtime="containerd2" if self.gvisor else self.runtime,
                        evented_pleg=self.evented_pleg, gvisor=self.gvisor).up()  # fmt: skip
            self.node = node
            client.Configuration.set_default(_configuration(cp))
            self.api = client.ApiClient()
            self._install()
            sandbox = agentsandbox.AgentSandboxController(cp, self.api, self.work).start()
            others.append(sandbox)
            receiver = self.receiver = Receiver(whsec(KEY)).start()
            others.append(receiver)
            self._deathwatch(receiver)
            yield
        finally:
            self.stop.set()
            for p in self.procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(15)
            for o in others:
                o.stop()
            for c in getattr(self, "controllers", []):
                c.stop()
            if node is not None:
                node.down()
            cp.destroy()

    @contextlib.contextmanager
    def _installed(self) -> Iterator[None]:
        """deathwatch installed from manifests/overlays/local-node on a whole cluster."""
        if self.stream != "auto":
            raise SystemExit("node_latency: --runtime-stream is the manifests' with --installed")
        others: list[Any] = []
        with localcluster.running(self.work / "cluster", runtime=self.runtime,
                                  evented_pleg=self.evented_pleg) as c:  # fmt: skip
            self.installation, self.cp, self.node = c, c.cp, c.node
            try:
                client.Configuration.set_default(_configuration(c.cp))
                self.api = client.ApiClient()
                agentsandbox.install_crds(c.cp)  # before the controller: it watches them
                agentsandbox.install_rbac(c.cp)
                c.kubectl("apply", "--server-side", "-k", str(localcluster.OVERLAY))
                localcluster.wait_rollouts(c)
                c.kubectl("create", "namespace", NS)
                # the sandboxes mount their control directory from the host: not baseline's
                c.kubectl("label", "namespace", NS, "pod-security.kubernetes.io/enforce=privileged")
                sandbox = agentsandbox.AgentSandboxController(c.cp, self.api, self.work).start()
                others.append(sandbox)
                self._watching()
                _wait(self._exits_published, 60, "the node's exits Lease")
                yield
            finally:
                self.stop.set()
                for o in others:
                    o.stop()

    def _exits_published(self) -> bool:
        leases = client.CoordinationV1Api(self.api).list_namespaced_lease(
            SYSTEM, label_selector=wire.LABEL_SELECTOR, _request_timeout=10)  # fmt: skip
        return bool(leases.items)

    def _installed_cpu(self) -> dict[str, dict[str, float]]:
        """Each deathwatch container's CPU so far, by pod/container (its cgroup)."""
        got: dict[str, dict[str, float]] = {}
        pods = client.CoreV1Api(self.api).list_namespaced_pod(SYSTEM, _request_timeout=10)
        for pod in pods.items:
            for status in pod.status.container_statuses or ():
                if status.container_id and status.state.running:
                    cid = status.container_id.split("://", 1)[1]
                    got[f"{pod.metadata.name}/{status.name}"] = procstat.container_cpu(
                        pod.metadata.uid, cid)  # fmt: skip
        return got

    def _installed_logs(self) -> None:
        """The exits container's and the leader's logs, where the host processes' go."""
        c = self.installation
        assert c is not None
        lease = client.CoordinationV1Api(self.api).read_namespaced_lease(
            "deathwatch-controller", SYSTEM, _request_timeout=10)  # fmt: skip
        logs = {"exits.log": ("ds/deathwatch-firewall", "-c", "exits"),
                "leader.log": (str(lease.spec.holder_identity), "-c", "controller")}  # fmt: skip
        for name, args in logs.items():
            got = c.kubectl("logs", "-n", SYSTEM, *args, check=False, timeout=60)
            (self.work / name).write_text(got.stdout)

    def _install(self) -> None:
        cp = self.cp
        cp.kubectl_run("apply", "--server-side", "-f", str(ROOT / "manifests/base/crds"))
        cp.kubectl_run("create", "namespace", SYSTEM, check=False)
        cp.kubectl_run("create", "namespace", NS, check=False)
        for role in ("controller.yaml", "metrics-reader.yaml", "firewall.yaml"):
            cp.kubectl_run("apply", "-f", str(ROOT / "manifests/base/rbac" / role))
        cp.kubectl_run("create", "rolebinding", "deathwatch-controller", "-n", NS,
                       "--clusterrole=deathwatch-controller",
                       f"--serviceaccount={SYSTEM}:deathwatch-controller")  # fmt: skip
        agentsandbox.install_crds(cp)
        agentsandbox.install_rbac(cp)
        cp.kubectl_run("wait", "--for=condition=Established", "--timeout=60s",
                       "crd/deathwatches.deathwatch.dev", "crd/sandboxverdicts.deathwatch.dev")  # fmt: skip

    def _deathwatch(self, receiver: Receiver) -> None:
        cp, work = self.cp, self.work
        kc = service_account_kubeconfig(cp, self.api, SYSTEM, "deathwatch-controller",
                                        work / "controller.kubeconfig")  # fmt: skip
        token = work / "firewall.token"
        token.write_text(service_account_token(self.api, SYSTEM, "deathwatch-firewall"))
        secret = sink_secret(work / "sink", whsec(KEY))
        config = work / "sinks.yaml"
        config.write_text(json.dumps({"cluster": "bench", "sinks": [{
            "name": "platform", "url": receiver.url, "secretDir": str(secret),
            "allowInsecure": True, "states": ["Dead"]}]}))  # fmt: skip
        observer = [sys.executable, "-m", "deathwatch.firewall.cli", "exits",
                    "--runtime-socket", str(RUNTIME_SOCKET), "--node-name", NODE_NAME,
                    "--identity", "bench-exits", "--namespace", SYSTEM, "--kube-api", cp.server,
                    "--kube-token-file", str(token), "--kube-ca-file", str(cp.certs / "ca.crt"),
                    "--metrics-port", "0", "--runtime-stream", self.stream,
                    "--cgroup-root", "/sys/fs/cgroup"]  # fmt: skip
        self.procs.append(_spawn(observer, work / "exits.log"))
        elect = ["--leader-elect", "--lease-namespace", SYSTEM]  # its Role names the Lease
        reader = metrics_reader_token(self.api)
        leader = ControllerProcess(kc, [NS], work / "leader.log", reader_token=reader, extra=[
            *elect, "--identity", "leader", "--node-exits", SYSTEM,
            "--delivery-config", str(config)]).start()  # fmt: skip
        self.controllers = [leader]
        _wait(lambda: "acquired the lease" in leader.log.read_text(), 60, "the leader")
        self.standby = ControllerProcess(kc, [NS], work / "standby.log", reader_token=reader,
                                         extra=[*elect, "--identity", "standby"]).start()  # fmt: skip
        self.controllers.append(self.standby)
        self._watching()
        _wait(lambda: "reading the runtime's exits" in (work / "exits.log").read_text(), 60,
              "the exits observer")  # fmt: skip

    def _watching(self) -> None:
        """The bench's DeathWatch: every agent-sandbox Sandbox of its namespace."""
        client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            "deathwatch.dev", "v1alpha1", NS, "deathwatches",
            {"apiVersion": "deathwatch.dev/v1alpha1", "kind": "DeathWatch",
             "metadata": {"name": "sandboxes"},
             "spec": {"sandboxes": "agent-sandbox", "podSelector": {}}}, _request_timeout=30)  # fmt: skip

    # --- the watches ----------------------------------------------------------------------

    def watch(self) -> None:
        core, custom, coordination = (client.CoreV1Api(self.api), client.CustomObjectsApi(self.api),
                                      client.CoordinationV1Api(self.api))  # fmt: skip
        seen = self.seen

        def pods(obj: dict[str, Any]) -> None:
            meta = obj["metadata"]
            for owner in meta.get("ownerReferences") or ():
                with seen.lock:
                    seen.pod_of[owner["name"]] = (meta["name"], meta["uid"])
            status = obj.get("status") or {}
            conditions: list[dict[str, Any]] = status.get("conditions") or []
            ready = next((c for c in conditions if c["type"] == "Ready"), {})
            ended = any((c.get("state") or {}).get("terminated")
                        for c in status.get("containerStatuses") or ())  # fmt: skip
            if ready.get("status") == "False" and ended:
                seen.note(obj["metadata"]["uid"], "kubelet")

        def verdicts(obj: dict[str, Any]) -> None:
            status = obj.get("status") or {}
            if status.get("podUID") and status.get("state"):
                with seen.lock:
                    seen.state[status["podUID"]] = status["state"]
            if status.get("state") == "Dead":
                seen.note(status["podUID"], "verdict")
                with seen.lock:
                    seen.verdicts.setdefault(status["podUID"], status)

        def leases(obj: dict[str, Any]) -> None:
            read = wire.read_lease(obj)
            for e in read[1] if read else ():
                seen.note(e.pod_uid, "heard")
                seen.note(e.pod_uid, "runtime", e.exited_at.timestamp())

        def sandboxes(obj: dict[str, Any]) -> None:
            conditions = (obj.get("status") or {}).get("conditions") or ()
            if any(c["type"] == "Ready" and c["status"] == "False" for c in conditions):
                seen.note(f"sandbox/{obj['metadata']['name']}", "agent_sandbox")

        for target in (
            (core.list_namespaced_pod, pods, NS),
            (custom.list_namespaced_custom_object, verdicts, "deathwatch.dev", "v1alpha1", NS,
             "sandboxverdicts"),
            (coordination.list_namespaced_lease, leases, SYSTEM),
            (custom.list_namespaced_custom_object, sandboxes, *SANDBOXES[:2], NS, SANDBOXES[2]),
        ):  # fmt: skip
            lister, on, *args = target
            threading.Thread(target=follow, args=(self.stop, lister, on, *args),
                             daemon=True).start()  # fmt: skip

    # --- the kills --------------------------------------------------------------------------

    def sandbox(self, name: str, how: str) -> Kill:
        ctl = self.node.ctl(f"{NS}-{name}")
        if not (ctl / "bell").exists() and not self.gvisor:
            os.mkfifo(ctl / "bell")  # the agent acts on a command at once, not at its next look
        spec = agentpods.agent_pod(name, ctl, node=NODE_NAME,
                                   memory="24Mi" if how == "oom" else "32Mi",
                                   runtime_class=GVISOR_RUNTIME_CLASS if self.gvisor else None,
                                   )["spec"]  # fmt: skip
        client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            *SANDBOXES[:2], NS, SANDBOXES[2],
            {"apiVersion": "/".join(SANDBOXES[:2]), "kind": "Sandbox", "metadata": {"name": name},
             "spec": {"podTemplate": {"spec": spec}}}, _request_timeout=30)  # fmt: skip
        return Kill(name, how)

    def alive(self, kill: Kill, timeout: float = 120) -> None:
        """Wait for its verdict Alive, from the bench's own watches: no API call (a poll's
        lists had cost the 2 cores what the deaths it raced needed)."""

        def ready() -> bool:
            with self.seen.lock:
                pod = self.seen.pod_of.get(kill.sandbox)
                if pod is None:
                    return False
                kill.pod, kill.uid = pod
                return self.seen.state.get(kill.uid) == "Alive"

        _wait(ready, timeout, f"{kill.sandbox} Alive", every=0.01)

    def kill(self, k: Kill) -> None:
        ctl = self.node.ctl(f"{NS}-{k.sandbox}")
        if k.how == "sigkill":
            pid = self._pid(k)
            k.at = time.time()
            os.kill(pid, signal.SIGKILL)
        else:
            k.at = time.time()
            (ctl / k.how).write_text("3" if k.how == "exit" else "")
            if self.gvisor:
                return
            bell = os.open(ctl / "bell", os.O_WRONLY | os.O_NONBLOCK)  # the agent holds it open
            try:
                os.write(bell, b"\n")
            finally:
                os.close(bell)

    def _pid(self, k: Kill) -> int:
        pod = client.CoreV1Api(self.api).read_namespaced_pod(k.pod, NS, _request_timeout=10)
        if self.gvisor:  # the sandbox's Sentry: the host can kill only the whole sandbox
            sandbox = gvisor_sandbox_pid(pod.metadata.uid)
            if sandbox is None:
                raise RuntimeError(f"no gVisor sandbox for {k.pod}")
            return sandbox
        cid = pod.status.container_statuses[0].container_id.split("://", 1)[1]
        for line in self.node.ctr("tasks", "ls").stdout.splitlines()[1:]:
            task, pid, *_ = line.split()
            if task == cid:
                return int(pid)
        raise RuntimeError(f"no task for {k.pod}")

    def run(self, kills: int) -> None:
        self.watch()
        rng = random.Random(42)
        pending = [self.sandbox(f"sbx-{i}", KILLS[i % len(KILLS)]) for i in range(min(LIVE, kills))]
        made = len(pending)
        for k in pending:
            self.alive(k)
        before = self._installed_cpu() if self.installation is not None else {}
        while pending:
            k = pending.pop(0)
            time.sleep(rng.uniform(*self.apart))
            self.kill(k)
            self.kills.append(k)
            # the replacement is made once this death's verdict and its delivery are seen (2 s
            # at most): made at the kill, its pod's start (the API server, agent-sandbox, the
            # kubelet and containerd at once) had raced every death on the 2 cores
            if not self.replace_at_kill:
                self._judged(k, 2.0)
            if made < kills:
                fresh = self.sandbox(f"sbx-{made}", KILLS[made % len(KILLS)])
                made += 1
                self.alive(fresh)
                pending.append(fresh)
        _wait(lambda: all(self._complete(k) for k in self.kills), 120, "every kill seen")
        if self.installation is not None:
            after = self._installed_cpu()
            self.cpu = {name: {key: round(value - before[name][key], 4)
                               for key, value in used.items()}
                        for name, used in after.items() if name in before}  # fmt: skip
            self._installed_logs()
            return
        for k in self.kills:
            self._standby_verdict(k)
        if self.count_requests:
            self.requests = {"per_death": self._counted("dead"),
                             "per_deletion": self._counted("deleted")}  # fmt: skip

    def _in_state(self, uid: str, state: str) -> bool:
        return self.seen.state.get(uid) == state

    def _counted(self, end: str) -> dict[str, Any]:
        """COUNTED sandboxes made and Alive, then each killed (`dead`: in turn, as the run
        kills) or deleted (`deleted`: its Sandbox, so agent-sandbox deletes its pod and the
        kubelet kills it): the requests deathwatch made from the first kill or deletion to
        the last verdict (Dead, Gone), per sandbox, from the API server's audit log."""
        batch = [self.sandbox(f"{end}-{i}", KILLS[i % len(KILLS)]) for i in range(COUNTED)]
        for k in batch:
            self.alive(k)
        start = datetime.now(UTC)
        for k in batch:
            if end == "dead":
                self.kill(k)
                _until(functools.partial(self._in_state, k.uid, "Dead"), 5.0, every=0.005)
            else:
                client.CustomObjectsApi(self.api).delete_namespaced_custom_object(
                    *SANDBOXES[:2], NS, SANDBOXES[2], k.sandbox, _request_timeout=30)  # fmt: skip
            time.sleep(0.5)
        final = "Dead" if end == "dead" else "Gone"
        _wait(lambda: all(self.seen.state.get(k.uid) == final for k in batch), 120,
              f"every {final}")  # fmt: skip
        time.sleep(3.0)  # a standby's deferred judgement (2 s) included
        counts = audited(self.cp.audit_log, start, datetime.now(UTC))
        return {
            "sandboxes": COUNTED,
            "total": round(sum(counts.values()) / COUNTED, 2),
            "by_request": {key: round(n / COUNTED, 2) for key, n in sorted(counts.items())},
        }

    def _judged(self, k: Kill, timeout: float) -> None:
        """Its verdict and delivery seen, or `timeout` passed (the run goes on either way:
        `run` waits for every kill at its end)."""
        _until(lambda: self.seen.after(k.uid, "verdict", k.at) is not None
               and self._delivered(k), timeout, every=0.005)  # fmt: skip

    def _delivered(self, k: Kill) -> bool:
        if self.receiver is None:  # --installed: no sink
            return True
        return any(r.data.get("podUID") == k.uid or r.subject.endswith(f"/{k.pod}")
                   for r in self.receiver.received)  # fmt: skip

    def _complete(self, k: Kill) -> bool:
        return (
            all(self.seen.after(k.uid, s, k.at) for s in ("verdict", "kubelet", "heard"))
            and self.seen.after(f"sandbox/{k.sandbox}", "agent_sandbox", k.at) is not None
            and self._delivered(k)
        )

    def _standby_verdict(self, k: Kill) -> None:
        """The standby's Dead, from its log: it judges from the kubelet's reports alone."""
        for line in self.standby.log.read_text(errors="replace").splitlines():
            if '"verdict"' not in line or k.pod not in line:
                continue
            with contextlib.suppress(ValueError, KeyError):
                entry = json.loads(line)
                if entry.get("pod") == k.pod and entry.get("to") == "Dead":
                    at = datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00"))
                    self.seen.note(k.uid, "kubelet_path_verdict", at.timestamp())
                    return

    # --- the result ---------------------------------------------------------------------

    def result(self) -> dict[str, Any]:
        offset = time.time() - time.monotonic()  # the sink stamps with the monotonic clock
        spans: dict[str, list[float]] = {s: [] for s in SPANS}
        wrong: list[str] = []
        observed = {"node": 0, "kubelet": 0}
        from_exit: dict[str, list[float]] = {s: [] for s in SPANS}
        by_kind: dict[str, list[float]] = {how: [] for how in KILLS}
        rows: list[dict[str, Any]] = []
        for k in self.kills:
            got = {span: t for span in SPANS
                   if (t := self.seen.after(k.uid, span, k.at)) is not None}  # fmt: skip
            at = self.seen.after(f"sandbox/{k.sandbox}", "agent_sandbox", k.at)
            if at is not None:
                got["agent_sandbox"] = at
            received = self.receiver.received if self.receiver is not None else []
            sink = sorted(r.at + offset for r in received
                          if r.data.get("podUID") == k.uid or r.subject.endswith(f"/{k.pod}"))  # fmt: skip
            if sink:
                got["sink"] = sink[0]
            for span in SPANS:
                if span in got:
                    spans[span].append((got[span] - k.at) * 1e3)
            exit_at = got.get("runtime")
            if exit_at is not None:  # from the exit itself: the part deathwatch answers for
                for span in ("heard", "verdict", "sink", "kubelet", "kubelet_path_verdict"):
                    if span in got:
                        from_exit[span].append((got[span] - exit_at) * 1e3)
            if "verdict" in got:
                by_kind[k.how].append((got["verdict"] - k.at) * 1e3)
            rows.append({"pod": k.pod, "how": k.how,
                         "ms": {sp: round((t - k.at) * 1e3, 1) for sp, t in got.items()}})  # fmt: skip
            verdict = self.seen.verdicts.get(k.uid) or {}
            observed[verdict.get("observedBy", "kubelet")] += 1
            expected = (EXPECTED_GVISOR if self.gvisor else EXPECTED)[k.how]
            if (verdict.get("cause"), verdict.get("exitCode")) != expected:
                wrong.append(f"{k.pod} ({k.how}): {verdict.get('cause')} {verdict.get('exitCode')}")
        return {
            "runtime": self.runtime + (" + EventedPLEG" if self.evented_pleg else ""),
            "runtime_stream": self.stream,
            "deathwatch": "installed: local-node overlay" if self.installed else "host processes",
            "kills": len(self.kills),
            "apart_s": list(self.apart),
            "replacement": "at the kill" if self.replace_at_kill else "after the verdict",
            "by_kind": {how: sum(1 for k in self.kills if k.how == how) for how in KILLS},
            "observed_by": observed,
            "wrong_causes": wrong,
            "spans_ms": {s: summary(v) | {"n": len(v)} for s, v in spans.items() if v},
            "from_exit_ms": {s: summary(v) | {"n": len(v)} for s, v in from_exit.items() if v},
            "kill_to_verdict_by_kind_ms": {
                h: summary(v) | {"n": len(v)} for h, v in by_kind.items() if v
            },
            "oom_gap_ms": self.oom_gaps(),
            "exits_container_ms": self.exits_container(),
            "controller_read_ms": self.controller_reads(),
            "controller_write_ms": self.controller_writes(),
            "api_requests": self.requests,
            "cpu_over_the_kills": self.cpu,
            "kills_ms": rows,
        }

    def exits_container(self) -> dict[str, Any]:
        """The exits container's own share of runtime -> heard (its log): from the exit to
        its batch taken for a write (the runtime's event, the OOM wait, the container's
        labels read), and the Lease write itself."""
        taken: list[float] = []
        written: list[float] = []
        log = self.work / "exits.log"
        for line in log.read_text().splitlines() if log.exists() else ():
            if '"exits published"' in line:
                said = json.loads(line)
                taken.append(said["taken_ms"])
                written.append(said["write_ms"])
        return {"exit_to_taken": summary(taken) | {"n": len(taken)},
                "write": summary(written) | {"n": len(written)}}  # fmt: skip

    def controller_reads(self) -> dict[str, Any]:
        """The leader's share after the exits Lease reached it: from its watch event to the
        exit judged (its pod read, the engine), as its log says."""
        reads: list[float] = []
        log = self.work / "leader.log"
        for line in log.read_text().splitlines() if log.exists() else ():
            if '"exit heard on its node"' in line:
                reads.append(json.loads(line)["read_seconds"] * 1e3)
        return summary(reads) | {"n": len(reads)}

    def controller_writes(self) -> dict[str, Any]:
        """The leader's share from the exits Lease's event to its Dead verdict written: the
        whole (received), until the status was sent (queued: the read, the engine, the
        writer's queue) and the write itself, as its log says."""
        spans: dict[str, list[float]] = {"received": [], "queued": [], "write": []}
        log = self.work / "leader.log"
        for line in log.read_text().splitlines() if log.exists() else ():
            if '"dead verdict written"' in line:
                said = json.loads(line)
                for span, values in spans.items():
                    values.append(said[f"{span}_ms"])
        return {span: summary(v) | {"n": len(v)} for span, v in spans.items()}

    def oom_gaps(self) -> dict[str, list[float]]:
        """containerd's task events: how far each OOM event came from its exit, by order
        (the exits container's log), what `--oom-wait` is chosen from."""
        gaps: dict[str, list[float]] = {}
        log = self.work / "exits.log"
        for line in log.read_text().splitlines() if log.exists() else ():
            if "an OOM kill and its exit" in line:
                said = json.loads(line)
                gaps.setdefault(said["order"], []).append(said["gap_ms"])
        return {order: sorted(g) for order, g in gaps.items()}


def _configuration(cp: controlplane.ControlPlane) -> client.Configuration:
    from kubernetes import config as kubeconfig

    conf = client.Configuration()
    kubeconfig.load_kube_config(str(cp.kubeconfig), client_configuration=conf)
    return conf


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})  # fmt: skip


def _until(probe: Callable[[], bool], timeout: float, every: float = 0.1) -> bool:
    """Whether `probe` said True before `timeout` passed."""
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def _wait(probe: Callable[[], bool], timeout: float, what: str, every: float = 0.1) -> None:
    if not _until(probe, timeout, every):
        raise TimeoutError(f"node_latency: {what} not seen in {timeout:.0f} s")


# --- the chart -------------------------------------------------------------------------------

LABELS = {"runtime": "kill → runtime", "heard": "→ node observation", "verdict": "→ verdict",
          "sink": "→ sink 2xx", "kubelet": "kubelet's report", "kubelet_path_verdict":
          "kubelet-path verdict", "agent_sandbox": "agent-sandbox"}  # fmt: skip


def draw(results: list[dict[str, Any]], out: Path) -> None:
    panels = [
        (f"{run['runtime']}: {run['kills']} kills",
         [(LABELS[s], run["spans_ms"][s]) for s in SPANS if s in run["spans_ms"]])
        for run in results
    ]  # fmt: skip
    quantile_chart.draw(
        panels, out, ylabel="from the kill (ms)",
        title="a sandbox's death on a real node, kill → verdict (bench/node_latency.py)",
        cols=2, size=(6.8, 3.9), fmt="%.0f", label_size=6, rotation=25, tick_size=7,
        title_size=9,
    )  # fmt: skip


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| runtime | span from the kill | p50 ms | p95 ms | p99 ms | max ms | n |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for run in results:
        for span in SPANS:
            s = run["spans_ms"].get(span)
            if s:
                lines.append(f"| {run['runtime']} | {LABELS[span]} | {s['p50']} | {s['p95']} | "
                             f"{s['p99']} | {s['max']} | {s['n']} |")  # fmt: skip
    return "\n".join(lines)


def audited(log: Path, start: datetime, end: datetime) -> dict[str, int]:
    """deathwatch's requests the audit log holds from `start` to `end`, by who (the user
    agent: `leader (writes)`, `exits container`), verb and resource."""
    counts: dict[str, int] = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("stage") != "ResponseComplete":
            continue
        at = datetime.fromisoformat(entry["requestReceivedTimestamp"].replace("Z", "+00:00"))
        if not start <= at < end:
            continue
        agent = str(entry.get("userAgent") or "")
        who = agent.split("/", 1)[1] if agent.startswith("deathwatch/") else "exits container"
        ref = entry.get("objectRef") or {}
        what = ref.get("resource", entry.get("requestURI", "?").split("?")[0])
        if ref.get("subresource"):
            what += "/" + ref["subresource"]
        key = f"{who} {entry['verb']} {what}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def _seconds_range(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(":")
    try:
        low, high = float(lo), float(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want LO:HI seconds, e.g. 20:21") from None
    if not 0 <= low <= high:
        raise argparse.ArgumentTypeError(f"{text!r}: want 0 <= LO <= HI")
    return low, high


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.node_latency", description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=60)
    p.add_argument("--runtime", choices=("containerd", "containerd2", "gvisor"),
                   default="containerd")  # fmt: skip
    p.add_argument("--evented-pleg", action="store_true")
    p.add_argument(
        "--runtime-stream",
        choices=("auto", "cri", "containerd"),
        default="auto",
        help="the exits container's stream (auto: containerd's task events)",
    )
    p.add_argument("--replace-at-kill", action="store_true",
                   help="make each killed sandbox's replacement at the kill (its pod's start "
                        "races the death), not once the kill's verdict is seen")  # fmt: skip
    p.add_argument("--installed", action="store_true",
                   help="deathwatch as installed from manifests/overlays/local-node (pods under "
                        "their CPU limits) on a whole cluster, not host processes")  # fmt: skip
    p.add_argument("--apart", type=_seconds_range, default=(0.25, 1.25), metavar="LO:HI",
                   help="seconds between kills, drawn uniformly (default 0.25:1.25); past "
                        "15 s, each death finds the clients' connections idle")  # fmt: skip
    p.add_argument("--count-requests", action="store_true",
                   help="after the run, count deathwatch's API requests per death and per "
                        "deletion (the API server's audit log; host processes only)")  # fmt: skip
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--chart", nargs="+", metavar="FILE", default=None,
                   help="RESULT.json ... OUT.png: draw runs side by side")  # fmt: skip
    args = p.parse_args(argv)
    if args.chart:
        if len(args.chart) < 2:
            print("node_latency: --chart RESULT.json [...] OUT.png", file=sys.stderr)
            return 2
        results = [json.loads(Path(f).read_text()) for f in args.chart[:-1]]
        draw(results, Path(args.chart[-1]))
        print(markdown(results))
        return 0
    if args.installed and args.count_requests:
        print("node_latency: --count-requests counts host processes' requests (no --installed)",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.installed and args.runtime == "gvisor":
        print("node_latency: --runtime gvisor runs deathwatch as host processes (no --installed)",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.evented_pleg and args.runtime != "containerd2":
        print("node_latency: --evented-pleg needs --runtime containerd2 (CRI events)",
              file=sys.stderr)  # fmt: skip
        return 2
    # a SIGTERM (a timeout, ^C from a wrapper) unwinds through cluster()'s cleanup: a node
    # left running would hold the machine's node lock and its mounts
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="bench-node-"))
    bench = Bench(work, args.runtime, args.evented_pleg, args.replace_at_kill, args.runtime_stream,
                  args.installed, args.apart, args.count_requests)  # fmt: skip
    with bench.cluster():
        bench.run(args.kills)
        result = bench.result()
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
