"""A whole cluster on this machine, to install deathwatch the way an operator does: etcd,
kube-apiserver, kube-controller-manager and kube-scheduler; one node (containerd, runc, the
CNI bridge, kubelet, kube-proxy in nftables mode); both product images built from their
Dockerfiles and imported (productimages.py). Then `kubectl apply -k manifests/overlays/local-node`.

The API server listens on the node's bridge address (10.88.0.1), never on an address that
leaves this machine: pods reach it there, and through the `kubernetes` Service (10.0.0.1:443)
that kube-proxy translates, so the controller pod uses in-cluster config as anywhere else.
The bridge is made before the API server starts (the CNI plugin then adopts it) and removed
by the node's teardown.

    with running() as c:       # c.cp: the control plane, c.node: the node
        c.kubectl("apply", "-k", "manifests/overlays/local-node")
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from hack.localcluster import productimages
from hack.localcluster.controlplane import ControlPlane
from hack.localcluster.node import (
    BRIDGE,
    MACHINE_LOCK,
    POD_SUBNET,
    Node,
    node_available,
)

BRIDGE_IP = POD_SUBNET.rsplit(".", 1)[0] + ".1"  # the CNI bridge's gateway: 10.88.0.1
ROOT = Path(__file__).resolve().parent.parent.parent
OVERLAY = ROOT / "manifests" / "overlays" / "local-node"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _bridge() -> None:
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{BRIDGE_IP}/{POD_SUBNET.rsplit('/', 1)[1]}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")


def available() -> str | None:
    """None if a whole cluster can run here, else why not (one line)."""
    reason = node_available()
    if reason:
        return reason
    for tool in ("buildah", "mmdebstrap"):
        if subprocess.run(["which", tool], capture_output=True, check=False).returncode:
            return f"{tool} not found (hack/setup.sh installs it)"
    return None


@dataclass
class Cluster:
    cp: ControlPlane
    node: Node
    images: dict[str, productimages.Image]

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 120, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.cp.kubectl_run(*args, check=check, timeout=timeout, input=input)

    def diagnose(self) -> str:
        """What a lane prints when a wait on the cluster times out: every pod, the latest
        events, and the last lines of deathwatch's own logs (a failed CI run keeps nothing
        else: its cluster is torn down with the test)."""
        parts = [
            ("pods", ("get", "pods", "-A", "-o", "wide")),
            ("events", ("get", "events", "-A", "--sort-by=.lastTimestamp")),
            ("deathwatch's logs", ("logs", "-n", "deathwatch-system", "--all-containers",
                                   "--prefix", "--tail=40", "-l", "app.kubernetes.io/part-of=deathwatch")),
        ]  # fmt: skip
        out = []
        for title, args in parts:
            got = self.kubectl(*args, check=False, timeout=30)
            text = (got.stdout + got.stderr).rstrip().splitlines()
            out.append(f"--- {title}\n" + "\n".join(text[-60:]))
        return "\n".join(out)

    @contextlib.contextmanager
    def logs_followed(self, namespace: str, selector: str) -> Iterator[Callable[[], str]]:
        """Follow the logs of the pods `selector` picks from now on, for pods about to be
        deleted (their logs go with them, before `diagnose` could read them): yields what
        was printed so far."""
        with tempfile.TemporaryFile() as out:
            follower = subprocess.Popen(
                [str(self.cp.kubectl), f"--kubeconfig={self.cp.kubeconfig}", "logs", "-f",
                 "-n", namespace, "-l", selector, "--all-containers", "--prefix",
                 "--timestamps", "--tail=20"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

            def printed() -> str:
                out.seek(0)
                return out.read().decode(errors="replace")

            try:
                yield printed
            finally:
                follower.terminate()
                follower.wait(10)


@contextlib.contextmanager
def running(workdir: Path | None = None, pod_security: str | None = "baseline",
            cluster_dns: bool = False, runtime: str = "containerd",
            evented_pleg: bool = False) -> Iterator[Cluster]:  # fmt: skip
    """`pod_security`: what a namespace without a label of its own enforces (baseline, as a
    hardened cluster: deathwatch's namespaces say privileged, as its manifests and docs do;
    the lanes' own sandboxes mount their control directory from the host, so theirs do too).
    `cluster_dns`: pods look names up at the bridge's address (a DNS server the caller runs
    there: netpol.Dns); otherwise they have none. `runtime`, `evented_pleg`: the node's
    (node.Node)."""
    reason = available()
    if reason:
        raise RuntimeError(f"cannot run a cluster here: {reason}")
    images = productimages.build_all()  # cached: nothing to do unless the sources changed
    workdir = workdir or Path(tempfile.mkdtemp(prefix="deathwatch-cluster-"))
    # the bridge is the node's, so it is made under the node's machine lock (node.py)
    MACHINE_LOCK.acquire()
    cp = ControlPlane(
        workdir / "cp", bind_address=BRIDGE_IP, with_scheduler=True, with_node_controllers=True,
        pod_security=pod_security,
    )  # fmt: skip
    node: Node | None = None
    try:
        _bridge()
        cp.start()
        node = Node(cp, workdir=workdir / "node", kube_proxy=True, node_ip=BRIDGE_IP,
                    cluster_dns=BRIDGE_IP if cluster_dns else None, runtime=runtime,
                    evented_pleg=evented_pleg).up()  # fmt: skip
        for image in images.values():
            node.import_image(image.archive, image.name)
        yield Cluster(cp, node, images)
    finally:
        if node is not None:
            node.down()
        else:
            subprocess.run(["ip", "link", "del", BRIDGE], check=False, capture_output=True)
        cp.destroy()
        shutil.rmtree(workdir, ignore_errors=True)
        MACHINE_LOCK.release()


def wait_rollouts(c: Cluster, timeout: float = 180) -> float:
    """Both of deathwatch's workloads rolled out (every pod Ready); returns the seconds taken."""
    started = time.monotonic()
    for kind in ("daemonset/deathwatch-firewall", "deployment/deathwatch-controller"):
        c.kubectl("rollout", "status", "-n", "deathwatch-system", kind, f"--timeout={timeout:.0f}s",
                  timeout=timeout + 30)  # fmt: skip
    return time.monotonic() - started
