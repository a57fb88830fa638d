"""NetworkPolicy enforced, and names that resolve, on the local cluster (cluster.py).

- `KubeRouter`: kube-router's network policy controller alone (`--run-firewall`; no routing,
  no service proxy: the node's bridge CNI and kube-proxy keep those), built from its Go module
  by hack/build-peers.sh, run on the host as a node's DaemonSet pod would run it (root, the
  host's network namespace), under a kubeconfig that may read pods, namespaces and policies.
  It turns every NetworkPolicy into iptables rules and ipsets on the node (the bridge's
  traffic included: br_netfilter), as it does on a cluster that runs it as its CNI's policy
  engine. Why kube-router, and not kube-network-policies: ADR 0027.
- `Dns`: dnsmasq (Debian's) on the CNI bridge's address, the pods' DNS server (the kubelet's
  clusterDNS, `Node(cluster_dns=)`): it answers for the names it is given, and nothing else
  (no upstream), as a cluster's DNS answers for its own.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from hack.localcluster.controlplane import ControlPlane, peer_home, versions
from hack.localcluster.node import NODE_NAME

BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")


def home() -> Path:
    return peer_home("github.com/cloudnativelabs/kube-router/v2", versions()["KUBE_ROUTER_VERSION"])


def binary() -> Path:
    return home() / "bin" / "kube-router"


def missing() -> str | None:
    """Why NetworkPolicy cannot be enforced here, or None."""
    if not binary().exists():
        return f"{binary()} missing: run hack/build-peers.sh"
    for tool in ("iptables", "ipset", "dnsmasq"):
        if subprocess.run(["which", tool], capture_output=True, check=False).returncode:
            return f"{tool} not found (hack/setup.sh installs it)"
    return None


class KubeRouter:
    def __init__(self, cp: ControlPlane, work: Path) -> None:
        self.cp, self.work = cp, work
        self.log = work / "kube-router.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._bridge_nf: str | None = None

    def start(self, timeout: float = 60) -> KubeRouter:
        # bridged pod-to-pod traffic through iptables, as kube-router needs on a bridge CNI
        # (br_netfilter: built into this machine's kernel)
        if BRIDGE_NF.exists():
            self._bridge_nf = BRIDGE_NF.read_text().strip()
            BRIDGE_NF.write_text("1")
        args = [str(binary()), f"--kubeconfig={self.cp.kubeconfig}", "--run-firewall=true",
                "--run-router=false", "--run-service-proxy=false", "--enable-cni=false",
                f"--hostname-override={NODE_NAME}", "--health-port=0", "--metrics-port=0",
                "--iptables-sync-period=5s", "-v=1"]  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kube-router exited:\n{self.tail()}")
            if self._chains():
                return self
            time.sleep(0.2)
        raise TimeoutError(f"kube-router made no chain in {timeout}s:\n{self.tail()}")

    def _chains(self) -> bool:
        listed = subprocess.run(["iptables", "-S", "KUBE-ROUTER-FORWARD"], capture_output=True,
                                check=False, timeout=30)  # fmt: skip
        return listed.returncode == 0

    def tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        # its chains and sets: what a node without it has (the node's teardown removes the
        # tables; the sets are kernel objects of their own)
        subprocess.run(["ipset", "destroy"], check=False, capture_output=True, timeout=30)
        if self._bridge_nf is not None and BRIDGE_NF.exists():
            BRIDGE_NF.write_text(self._bridge_nf)


class Dns:
    """dnsmasq on `address`: each name in `names` resolves to its address; nothing else does."""

    def __init__(self, address: str, names: dict[str, str], work: Path) -> None:
        self.address, self.names, self.work = address, names, work
        self.log = work / "dnsmasq.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10) -> Dns:
        args = ["dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts",
                "--bind-interfaces", f"--listen-address={self.address}", "--port=53",
                "--log-queries", f"--log-facility={self.log}", "--user=root"]  # fmt: skip
        args += [f"--address=/{name}/{ip}" for name, ip in self.names.items()]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        name = next(iter(self.names))
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"dnsmasq exited: {err}")
            if self.resolves(name):
                return self
            time.sleep(0.1)
        raise TimeoutError(f"dnsmasq on {self.address} does not answer for {name}")

    def resolves(self, name: str) -> bool:
        import socket

        query = _query(name)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(1)
            try:
                s.sendto(query, (self.address, 53))
                answer, _ = s.recvfrom(512)
            except OSError:
                return False
        return answer[:2] == query[:2] and answer[7] > 0  # the id, and an answer record

    def queries(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def _query(name: str) -> bytes:
    """A DNS query for `name`'s A record."""
    header = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00"
    return header + labels + b"\x00\x01\x00\x01"
