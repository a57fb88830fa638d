"""What the node lane's modules share: sandboxes of the test agent on the node, the
firewall agent and the exits observer as processes, watches that stamp when each change was
seen, and connections to a sandbox from the host and from outside the pod network."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import watch

from hack.localcluster import agentpods, controlplane
from hack.localcluster.netns_tool import connect_once
from hack.localcluster.node import NODE_NAME, RUNTIME_SOCKET, Node
from tests.controller_env import Env
from tests.kube import wait_for

ROOT = Path(__file__).resolve().parents[2]


NODE_EXITS = ["--node-exits", "deathwatch-system"]  # the controller reads the exits Leases


class FirewallAgent:
    """`deathwatch-firewall agent` as a process on this node, its table in force once `up`
    returns (its own `check` says so); `down` stops it and removes the table. With `api`
    (the control plane and the firewall's token) it is the node's agent: it lists the node's
    sandboxes for the inbound rule and publishes its coverage Lease (Shielded)."""

    def __init__(self, tmp_path: Path, pod_cidr: str, agent_port: int,
                 api: tuple[controlplane.ControlPlane, Path] | None = None) -> None:  # fmt: skip
        self.config = tmp_path / "firewall.yaml"
        self.config.write_text(json.dumps({"podCIDRs": [pod_cidr], "agentPorts": [agent_port],
                                           "resyncSeconds": 1}))  # fmt: skip
        self.log = tmp_path / "agent.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.node: list[str] = []
        if api is not None:
            cp, token = api
            self.node = ["--node-name", NODE_NAME, "--identity", "fw-dw-node",
                         "--namespace", "deathwatch-system", "--kube-api", cp.server,
                         "--kube-token-file", str(token), "--kube-ca-file",
                         str(cp.certs / "ca.crt")]  # fmt: skip

    def _cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "deathwatch.firewall.cli", *args]

    def up(self) -> FirewallAgent:
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                self._cli("agent", "--config", str(self.config), "--metrics-port", "0",
                          *self.node),
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])},
            )  # fmt: skip
        check = self._cli("check", "--config", str(self.config))
        wait_for(lambda: subprocess.run(check, capture_output=True, cwd=ROOT, timeout=30,
                                        check=False).returncode == 0,
                 timeout=20, what="the firewall's rule in force")  # fmt: skip
        return self

    def down(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(15)
        subprocess.run(self._cli("cleanup"), cwd=ROOT, capture_output=True, timeout=30,
                       check=False)  # fmt: skip


class Exits:
    """`deathwatch-firewall exits` as a process on this node: the node's containerd socket,
    the firewall's ServiceAccount token (its Role), the API at the control plane."""

    def __init__(self, cp: controlplane.ControlPlane, token: Path, log: Path,
                 extra: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.log = log
        self.args = [
            sys.executable, "-m", "deathwatch.firewall.cli", "exits",
            "--runtime-socket", str(RUNTIME_SOCKET), "--node-name", NODE_NAME,
            "--identity", "exits-dw-node", "--namespace", "deathwatch-system",
            "--kube-api", cp.server, "--kube-token-file", str(token),
            "--kube-ca-file", str(cp.certs / "ca.crt"), "--metrics-port", "0",
            "--cgroup-root", "/sys/fs/cgroup", *extra,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Exits:
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                self.args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )  # fmt: skip
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(15)

    def reading(self) -> bool:
        return "reading the runtime's exits" in self.log.read_text()

    def sigkills(self) -> dict[str, str]:
        """Each SIGKILL's exit heard with no OOM event yet: its pod -> what its memory cgroup
        said (none: published at once; counted, unread: held for the OOM event)."""
        said = (json.loads(line) for line in self.log.read_text().splitlines()
                if "a SIGKILL's exit with no OOM event yet" in line)  # fmt: skip
        return {entry["pod"]: entry["cgroup"] for entry in said}


def agent_pod(
    e: Env,
    name: str,
    *,
    probe: dict[str, Any] | None = None,
    environment: dict[str, str] | None = None,
    memory: str = "32Mi",
    labels: dict[str, str] | None = None,
    runtime_class: str | None = None,
) -> str:
    target = (environment or {}).get("TARGET")
    body = agentpods.agent_pod(name, ctl(e, name), node=NODE_NAME, probe=probe, target=target,
                               labels=labels, memory=memory, runtime_class=runtime_class)  # fmt: skip
    e.core.create_namespaced_pod(e.ns, body, _request_timeout=30)
    return name


def ctl(e: Env, name: str) -> Path:
    return e.node.ctl(f"{e.ns}-{name}")  # type: ignore[attr-defined, no-any-return]


def pod_ready(e: Env, name: str) -> bool:
    pod = e.core.read_namespaced_pod(name, e.ns, _request_timeout=10)
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


EXEC_PROBE = {
    "exec": {"command": ["/bin/ready"]},
    "periodSeconds": 1,
    "failureThreshold": 1,
    "timeoutSeconds": 1,
}


class Stamps(threading.Thread):
    """When this test's own watches saw each change: kubelet's status writes and verdicts."""

    def __init__(self, e: Env) -> None:
        super().__init__(daemon=True)
        self.e = e
        self.terminated: dict[str, float] = {}
        self.dead: dict[str, float] = {}
        self.stop = False

    def run(self) -> None:
        threading.Thread(target=self._verdicts, daemon=True).start()
        while not self.stop:
            try:
                for ev in watch.Watch().stream(
                    self.e.core.list_namespaced_pod,
                    self.e.ns,
                    timeout_seconds=30,
                    _request_timeout=60,
                ):
                    pod = ev["object"]
                    if any(cs.state.terminated for cs in pod.status.container_statuses or []):
                        self.terminated.setdefault(pod.metadata.name, time.monotonic())
            except Exception:
                time.sleep(0.1)

    def _verdicts(self) -> None:
        while not self.stop:
            try:
                for ev in watch.Watch().stream(
                    self.e.custom.list_namespaced_custom_object,
                    "deathwatch.dev",
                    "v1alpha1",
                    self.e.ns,
                    "sandboxverdicts",
                    timeout_seconds=30,
                    _request_timeout=60,
                ):
                    sv = ev["object"]
                    if sv.get("status", {}).get("state") == "Dead":
                        self.dead.setdefault(sv["metadata"]["name"], time.monotonic())
            except Exception:
                time.sleep(0.1)


def container_pid(e: Env, name: str) -> int:
    """The host pid of the pod's container's init process (as `kill -9 PID` on the host)."""
    pod = e.core.read_namespaced_pod(name, e.ns, _request_timeout=10)
    cid = pod.status.container_statuses[0].container_id.split("://", 1)[1]
    node: Node = e.node  # type: ignore[attr-defined]
    for line in node.ctr("tasks", "ls").stdout.splitlines()[1:]:
        task, pid, *_ = line.split()
        if task == cid:
            return int(pid)
    raise AssertionError(f"no task for {name} ({cid})")


DEATHS = [("exit", "3", "ContainerExited", 3), ("sigkill", "", "ContainerExited", 137),
          ("oom", "", "OOMKilled", 137)]  # fmt: skip


def each_death_heard(e: Env, prefix: str, stamps: Stamps | None = None,
                     exits: Exits | None = None, cgroup_may_be_gone: bool = False,
                     ) -> list[float]:  # fmt: skip
    """ADR 0028 on one runtime: an exit, a SIGKILL from the host and an OOM kill, each Dead
    with its cause and code, observedBy node; the kubelet's report that follows agrees (no
    dispute, one SandboxDead). With `stamps` running, how much earlier than the kubelet's
    report each verdict was seen (ms, positive: earlier). With `exits` (reading containerd's
    task events), the SIGKILL's memory cgroup, read from the host's tree, counted no OOM
    kill: it was published without waiting for an OOM event; `cgroup_may_be_gone`: or the
    cgroup was already removed when the exit was read, and the exit held for an OOM event."""
    ahead: list[float] = []
    for i, (how, arg, cause, code) in enumerate(DEATHS):
        name = agent_pod(e, f"{prefix}{i}", memory="24Mi" if how == "oom" else "32Mi")
        e.wait_state(name, "Alive", timeout=60)
        if how == "sigkill":
            os.kill(container_pid(e, name), signal.SIGKILL)
        else:
            (ctl(e, name) / how).write_text(arg)
        dead = e.wait_state(name, "Dead", timeout=30)["status"]
        assert (dead["cause"], dead["exitCode"], dead["observedBy"]) == (cause, code, "node"), dead
        assert dead["containerID"].startswith("containerd://")
        if stamps is not None:
            wait_for(lambda n=name: n in stamps.terminated and n in stamps.dead,  # type: ignore[misc]
                     what="both watches")  # fmt: skip
            ahead.append((stamps.terminated[name] - stamps.dead[name]) * 1e3)
        wait_for(lambda n=name: not pod_ready(e, n), timeout=30, what="the kubelet's report")  # type: ignore[misc]
    # a pod made after the reports: once it is Alive, the controller has judged them
    e.wait_state(agent_pod(e, f"{prefix}marker"), "Alive", timeout=60)
    for i in range(len(DEATHS)):
        sv = (e.sv(f"{prefix}{i}") or {})["status"]
        assert sv["state"] == "Dead" and "disputed" not in sv, sv
        assert e.events(f"{prefix}{i}", "NodeExitDisputed") == []
        assert len(e.events(f"{prefix}{i}", "SandboxDead")) == 1
    if exits is not None:
        sigkill = next(i for i, death in enumerate(DEATHS) if death[0] == "sigkill")
        # none: its cgroup read, no OOM kill counted, published at once. Never counted: a
        # plain SIGKILL is no OOM kill. unread (allowed where asked): the cgroup already
        # removed, held for the OOM event as before ADR 0034
        said = exits.sigkills().get(f"{prefix}{sigkill}")
        allowed = ("none", "unread") if cgroup_may_be_gone else ("none",)
        assert said in allowed, exits.sigkills()
    return ahead


def connect(host: str, port: int) -> str:
    return connect_once(host, port, 2.0)[0]


@contextlib.contextmanager
def outside() -> Iterator[str]:
    """A network namespace outside the pod network (another node's host, a client beyond the
    cluster), routed to the pods through this host: the inbound rule's case."""
    ns, host_end, outer_end = "dw-gv-outside", "dwgvo0", "dwgvo1"
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False, timeout=10)
    for cmd in (["ip", "netns", "add", ns],
                ["ip", "link", "add", host_end, "type", "veth", "peer", "name", outer_end],
                ["ip", "link", "set", outer_end, "netns", ns],
                ["ip", "addr", "add", "172.31.250.1/30", "dev", host_end],
                ["ip", "link", "set", host_end, "up"],
                ["ip", "-n", ns, "addr", "add", "172.31.250.2/30", "dev", outer_end],
                ["ip", "-n", ns, "link", "set", outer_end, "up"],
                ["ip", "-n", ns, "route", "add", "default", "via", "172.31.250.1"]):  # fmt: skip
        subprocess.run(cmd, capture_output=True, check=True, timeout=10)
    forward = Path("/proc/sys/net/ipv4/ip_forward")
    was = forward.read_text().strip()
    forward.write_text("1")
    try:
        yield ns
    finally:
        forward.write_text(was)
        subprocess.run(["ip", "link", "del", host_end], capture_output=True, check=False,
                       timeout=10)  # fmt: skip
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False, timeout=10)


def connect_from(ns: str, host: str, port: int) -> str:
    tool = str(ROOT / "hack" / "localcluster" / "netns_tool.py")
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, tool, "connect", host,
                          str(port), "2"], capture_output=True, text=True, timeout=30,
                         check=False)  # fmt: skip
    return out.stdout.split()[0] if out.stdout else f"error: {out.stderr.strip()}"


def shielded(e: Env, pod: str, want: tuple[str, str | None], timeout: float = 30) -> None:
    """Wait for the verdict's Shielded condition to say `want` (status, reason; None: any)."""

    def said() -> tuple[str, str] | None:
        conditions = ((e.sv(pod) or {}).get("status") or {}).get("conditions") or []
        found = next((c for c in conditions if c["type"] == "Shielded"), None)
        return (found["status"], found["reason"]) if found else None

    def matches() -> bool:
        now = said()
        return now is not None and now[0] == want[0] and want[1] in (None, now[1])

    wait_for(matches, timeout=timeout,
             what=f"Shielded {want} (it says {said()})")  # fmt: skip
