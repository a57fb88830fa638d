"""A Kubernetes node's networking, built from network namespaces, for firewall tests.

    host       the node's own namespace (where kubelet, hostNetwork pods and the firewall
               agent live); forwarding on
    sandbox    a pod namespace: agent port and another port listening
    ordinary   a pod namespace: a normal pod on the same node

Two wirings, as CNI plugins do it:
    routed     each pod on its own veth, a /32 (and /128) route per pod on the host side,
               pods reach everything through a link-local-style gateway (Calico's way)
    bridge     pods on veths enslaved to a bridge in the host namespace (the bridge plugin)

Names are unique per instance; `destroy()` removes every namespace (and with them the
veths and the bridge), even after a failure. Needs root and iproute2.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

TOOL = Path(__file__).resolve().parent / "netns_tool.py"
AGENT_PORT = 49983
OTHER_PORT = 8080


def run(*args: str, check: bool = True, timeout: float = 10) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
        )
    return result


@dataclass
class Pod:
    ns: str
    v4: str
    v6: str


@dataclass
class Node:
    wiring: str = "routed"  # or "bridge"
    subnet: int = 1  # this node's pod range: 10.244.<subnet>.0/24, fd00:10:244:<subnet>::/64
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    host: str = ""
    sandbox: Pod | None = None
    ordinary: Pod | None = None
    listeners: list[subprocess.Popen[str]] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    userspace_ipip: bool = False  # the kernel has no ipip: the tunnel is netns_tool's relay

    @property
    def pod_cidrs(self) -> list[str]:
        return ["10.244.0.0/16", "fd00:10:244::/56"]

    def ns_exec(
        self, ns: str, *args: str, check: bool = True, timeout: float = 10
    ) -> subprocess.CompletedProcess[str]:
        return run("ip", "netns", "exec", ns, *args, check=check, timeout=timeout)

    def _netns(self, name: str) -> str:
        run("ip", "netns", "add", name)
        self.namespaces.append(name)
        self.ns_exec(name, "ip", "link", "set", "lo", "up")
        return name

    def create(self) -> Node:
        try:
            self.host = self._netns(f"dw-host-{self.tag}")
            for key in ("net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"):
                self.ns_exec(self.host, "sysctl", "-qw", key)
            if self.wiring == "bridge":
                self.ns_exec(self.host, "ip", "link", "add", "br0", "type", "bridge")
                self.ns_exec(
                    self.host, "ip", "addr", "add", f"10.244.{self.subnet}.1/24", "dev", "br0"
                )
                self.ns_exec(
                    self.host,
                    "ip",
                    "-6",
                    "addr",
                    "add",
                    f"fd00:10:244:{self.subnet}::1/64",
                    "dev",
                    "br0",
                    "nodad",
                )
                self.ns_exec(self.host, "ip", "link", "set", "br0", "up")
            self.sandbox = self._pod("s", 2)
            self.ordinary = self._pod("o", 3)
            # a route for a Service-like virtual IP: DNAT decides where it really goes
            self.ns_exec(self.host, "ip", "route", "add", "10.96.0.0/24", "dev", "lo")
        except BaseException:
            self.destroy()
            raise
        return self

    def _pod(self, role: str, n: int) -> Pod:
        ns = self._netns(f"dw-{role}-{self.tag}")
        host_if, pod_if = f"v{role}{self.tag}", "eth0"
        self.ns_exec(
            self.host,
            "ip",
            "link",
            "add",
            host_if,
            "type",
            "veth",
            "peer",
            "name",
            pod_if,
            "netns",
            ns,
        )
        v4, v6 = f"10.244.{self.subnet}.{n}", f"fd00:10:244:{self.subnet}::{n}"
        if self.wiring == "bridge":
            self.ns_exec(self.host, "ip", "link", "set", host_if, "master", "br0", "up")
            self.ns_exec(ns, "ip", "addr", "add", f"{v4}/24", "dev", pod_if)
            self.ns_exec(ns, "ip", "-6", "addr", "add", f"{v6}/64", "dev", pod_if, "nodad")
            self.ns_exec(ns, "ip", "link", "set", pod_if, "up")
            self.ns_exec(ns, "ip", "route", "add", "default", "via", f"10.244.{self.subnet}.1")
            self.ns_exec(
                ns, "ip", "-6", "route", "add", "default", "via", f"fd00:10:244:{self.subnet}::1"
            )
        else:
            gw4, gw6 = "169.254.1.1", "fe80::1"
            self.ns_exec(self.host, "ip", "link", "set", host_if, "up")
            self.ns_exec(self.host, "ip", "addr", "add", f"{gw4}/32", "dev", host_if)
            self.ns_exec(self.host, "ip", "-6", "addr", "add", f"{gw6}/64", "dev", host_if, "nodad")
            self.ns_exec(self.host, "ip", "route", "add", f"{v4}/32", "dev", host_if)
            self.ns_exec(self.host, "ip", "-6", "route", "add", f"{v6}/128", "dev", host_if)
            self.ns_exec(ns, "ip", "addr", "add", f"{v4}/32", "dev", pod_if)
            self.ns_exec(ns, "ip", "-6", "addr", "add", f"{v6}/128", "dev", pod_if, "nodad")
            self.ns_exec(ns, "ip", "link", "set", pod_if, "up")
            self.ns_exec(ns, "ip", "route", "add", gw4, "dev", pod_if, "scope", "link")
            self.ns_exec(ns, "ip", "route", "add", "default", "via", gw4, "dev", pod_if)
            self.ns_exec(ns, "ip", "-6", "route", "add", "default", "via", gw6, "dev", pod_if)
        return Pod(ns, v4, v6)

    def listen(self, pod: Pod, ports: tuple[int, ...] = (AGENT_PORT, OTHER_PORT)) -> None:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", pod.ns, sys.executable, str(TOOL), "listen", *map(str, ports)],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.listeners.append(proc)
        line = proc.stdout.readline() if proc.stdout else ""
        if line.strip() != "ready":
            raise RuntimeError(f"listener in {pod.ns} did not start: {line!r}")

    def connect(
        self, ns: str, host: str, port: int, timeout: float = 2.0, source: str | None = None
    ) -> str:
        """connected, refused (TCP reset) or timeout, from namespace `ns` (and address
        `source`, which need not be local there)."""
        how = ["connect-from", source] if source else ["connect"]
        out = self.ns_exec(
            ns, sys.executable, str(TOOL), *how, host, str(port), str(timeout),
            timeout=timeout + 10,
        )  # fmt: skip
        return out.stdout.split()[0]

    def wait_reachable(self, ns: str, host: str, port: int, timeout: float = 10) -> None:
        """Addresses and neighbours settle in milliseconds, but not instantly: wait, bounded."""
        deadline = time.monotonic() + timeout
        while True:
            outcome = self.connect(ns, host, port, timeout=1)
            if outcome == "connected" or time.monotonic() > deadline:
                if outcome != "connected":
                    raise RuntimeError(f"{host}:{port} not reachable from {ns}: {outcome}")
                return
            time.sleep(0.05)

    def nft(
        self, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["ip", "netns", "exec", self.host, "nft", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"nft {' '.join(args)}: {result.stderr.strip()}")
        return result

    def destroy(self) -> None:
        for proc in self.listeners:
            proc.kill()
            proc.wait(5)
        self.listeners.clear()
        for ns in reversed(self.namespaces):
            run("ip", "netns", "del", ns, check=False)
        self.namespaces.clear()


@contextlib.contextmanager
def node(wiring: str = "routed") -> Iterator[Node]:
    n = Node(wiring).create()
    try:
        yield n
    finally:
        n.destroy()


# the node network between two nodes (their InternalIPs), and a second address on B: a
# "gateway" host that may be allowed to reach sandbox agents
NODE_A, NODE_B, GATEWAY = "192.168.77.1", "192.168.77.2", "192.168.77.3"
NODE_A6, NODE_B6 = "fd00:77::1", "fd00:77::2"


def tunnel_addresses(n: Node, overlay: str) -> tuple[str, str | None]:
    """A host's own address inside the pod range on an overlay, as the CNIs take it: flannel's
    VXLAN device the network address of the node's range (and an address there for v6),
    Calico's IPIP device an address of the node's block (no v6: IPIP carries IPv4 only)."""
    if overlay == "vxlan":
        return f"10.244.{n.subnet}.0", f"fd00:10:244:{n.subnet}::ffff"
    return f"10.244.{n.subnet}.192", None


def _overlay(n: Node, other: Node, overlay: str, local: str, remote: str) -> None:
    """`other`'s pod range routed through a tunnel device from `n`'s host, which sends from
    its own tunnel address (a pod-range address) as those CNIs' routes make it."""
    dev = f"dw{overlay[:2]}{n.tag}"
    v4, v6 = tunnel_addresses(n, overlay)
    o4, o6 = tunnel_addresses(other, overlay)
    if overlay == "ipip":
        made = n.ns_exec(n.host, "ip", "link", "add", dev, "type", "ipip", "local", local,
                         "remote", remote, check=False)  # fmt: skip
        if made.returncode != 0:  # no CONFIG_NET_IPIP: the same encapsulation, in userspace
            relay = subprocess.Popen(
                ["ip", "netns", "exec", n.host, sys.executable, str(TOOL), "ipip", dev, local,
                 remote], stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            n.listeners.append(relay)
            if (relay.stdout.readline() if relay.stdout else "").strip() != "ready":
                raise RuntimeError(f"the IPIP relay on {n.host} did not start")
            n.userspace_ipip = True
    else:
        n.ns_exec(n.host, "ip", "link", "add", dev, "type", "vxlan", "id", "42", "local", local,
                  "remote", remote, "dstport", "4789")  # fmt: skip
    n.ns_exec(n.host, "ip", "addr", "add", f"{v4}/32", "dev", dev)
    if v6:
        n.ns_exec(n.host, "ip", "-6", "addr", "add", f"{v6}/128", "dev", dev, "nodad")
    n.ns_exec(n.host, "ip", "link", "set", dev, "up")
    if overlay == "ipip":  # point to point: the pod range straight into the tunnel
        n.ns_exec(n.host, "ip", "route", "add", f"10.244.{other.subnet}.0/24", "dev", dev,
                  "src", v4)  # fmt: skip
        return
    # VXLAN is a link layer: via the other VTEP's address, resolved over the tunnel (flannel)
    n.ns_exec(n.host, "ip", "route", "add", f"10.244.{other.subnet}.0/24", "via", o4, "dev", dev,
              "onlink", "src", v4)  # fmt: skip
    if v6 is None or o6 is None:
        raise RuntimeError("a VXLAN overlay carries IPv6 too: both tunnel addresses need one")
    n.ns_exec(n.host, "ip", "-6", "route", "add", f"fd00:10:244:{other.subnet}::/64", "via", o6,
              "dev", dev, "onlink", "src", v6)  # fmt: skip


@contextlib.contextmanager
def two_nodes(wiring: str = "routed", overlay: str | None = None) -> Iterator[tuple[Node, Node]]:
    """Two nodes, A (pods 10.244.1.0/24) and B (10.244.2.0/24), their hosts joined by a
    link. Without `overlay`, each node's pod range is routed to the other node over that
    link, as a CNI's native routing does it (Calico BGP without overlay, flannel host-gw,
    Cilium native routing); with overlay "ipip" (Calico IPIP) or "vxlan" (flannel, Calico
    VXLAN, Cilium's tunnel mode) through a real tunnel device instead, each host sending from
    its own tunnel address inside the pod range (`tunnel_addresses`)."""
    a, b = Node(wiring, subnet=1), Node(wiring, subnet=2)
    try:
        a.create()
        b.create()
        link_a, link_b = f"na{a.tag}", f"nb{b.tag}"
        a.ns_exec(a.host, "ip", "link", "add", link_a, "type", "veth", "peer", "name", link_b,
                  "netns", b.host)  # fmt: skip
        for n, dev, v4, v6, other, other4, other6 in (
            (a, link_a, NODE_A, NODE_A6, b, NODE_B, NODE_B6),
            (b, link_b, NODE_B, NODE_B6, a, NODE_A, NODE_A6),
        ):
            n.ns_exec(n.host, "ip", "addr", "add", f"{v4}/24", "dev", dev)
            n.ns_exec(n.host, "ip", "-6", "addr", "add", f"{v6}/64", "dev", dev, "nodad")
            n.ns_exec(n.host, "ip", "link", "set", dev, "up")
            if overlay is not None:
                _overlay(n, other, overlay, v4, other4)
                continue
            n.ns_exec(n.host, "ip", "route", "add", f"10.244.{other.subnet}.0/24", "via", other4)
            n.ns_exec(n.host, "ip", "-6", "route", "add", f"fd00:10:244:{other.subnet}::/64",
                      "via", other6)  # fmt: skip
        b.ns_exec(b.host, "ip", "addr", "add", f"{GATEWAY}/24", "dev", link_b)
        yield a, b
    finally:
        b.destroy()
        a.destroy()


def netns_available() -> str | None:
    """None if network namespaces and nft can be used here, else why not (one line)."""
    import os
    import shutil

    if os.geteuid() != 0:
        return "needs root (network namespaces, nftables)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install iproute2 nftables)"
    return None
