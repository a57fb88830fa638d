"""A real Kubernetes node on this machine: containerd + runc + CNI bridge + kubelet.

Built from Debian packages (containerd 1.6, runc 1.1, containernetworking-plugins 1.1,
busybox-static) and the pinned kubelet (hack/build-k8s.sh kubelet), registered with a
local control plane (controlplane.py) with a client certificate signed here. Everything
lives under one temporary directory; `down()` removes every process, mount, cgroup
(/kubepods in each hierarchy), network namespace, bridge and nft table it created, so a
second `up()` works.

What this machine kind needs (checked here, see docs/adr/0006):
- cgroup v1 only and no systemd as PID 1: kubelet with cgroupDriver cgroupfs and
  failCgroupV1 false (Kubernetes 1.35);
- no CAP_SYS_RESOURCE: containerd's CRI `restrict_oom_score_adj = true`, or runc fails to
  set a negative oom_score_adj; kubelet logs about its own oom_score_adj and carries on;
- no registry: images are imported from OCI layout tarballs (images.py), pulled never.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hack import deferred
from hack.localcluster import images
from hack.localcluster.controlplane import (
    ControlPlane,
    Process,
    _openssl,
    bin_dir,
    cache_dir,
    free_port,
    kubeconfig,
    peer_home,
    stop_pids,
    versions,
)

NODE_NAME = "dw-node"
BRIDGE = "dwcni0"
# the node's containerd socket (its state and root stay in the node's workdir)
RUNTIME_SOCKET = Path("/run/deathwatch-node/containerd.sock")
POD_SUBNET = "10.88.0.0/24"
CGROUP_ROOT = Path("/sys/fs/cgroup")
# one node on this machine at a time: two would share the bridge, its addresses and the
# cni- namespaces, and each one's teardown would remove the other's (a CI clone started
# while another was still running failed that way). The kernel drops the lock with its
# process, so a killed run never leaves it held.
LOCK = Path("/run/deathwatch-node.lock")
LOCK_WAIT_SECONDS = 1800.0


def _run(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {result.stderr.strip() or result.stdout.strip()}")
    return result


def _tables() -> set[str]:
    """The nftables tables of this network namespace, as "family name"."""
    out = _run("nft", "list", "tables", check=False).stdout
    return {line.split(" ", 1)[1].strip() for line in out.splitlines() if line.startswith("table ")}


def containerd2_bin() -> Path:
    """Where hack/build-peers.sh puts containerd 2.x, its shim and ctr."""
    return (
        peer_home("github.com/containerd/containerd/v2", versions()["CONTAINERD_VERSION"]) / "bin"
    )


def containerd2_available() -> str | None:
    """None if the node can run containerd 2.x here, else why not."""
    if not (containerd2_bin() / "containerd").exists():
        return "containerd 2 not built (hack/build-peers.sh)"
    return node_available()


def gvisor_bin() -> Path:
    """Where hack/build-gvisor.sh puts runsc and containerd-shim-runsc-v1."""
    return cache_dir() / "gvisor" / versions()["GVISOR_VERSION"] / "bin"


def gvisor_available() -> str | None:
    """None if the node can run gVisor sandboxes here (on containerd 2.x), else why not. In a CI
    run of every lane, once its build beside the lanes has ended (hack/deferred.py)."""
    deferred.wait("gvisor")
    for tool in ("runsc", "containerd-shim-runsc-v1"):
        if not (gvisor_bin() / tool).exists():
            return f"{tool} not built (hack/build-gvisor.sh)"
    return containerd2_available()


def gvisor_sandbox_pid(pod_uid: str) -> int | None:
    """The host pid of a pod's gVisor sandbox (its Sentry, `runsc-sandbox`), found by the pod's
    cgroup: every container of the pod runs inside it, so it is what the host can kill."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if b"runsc-sandbox" in (proc / "cmdline").read_bytes()[:64] and (
                f"pod{pod_uid}" in (proc / "cgroup").read_text()
            ):
                return int(proc.name)
        except OSError:  # gone meanwhile
            continue
    return None


def node_available() -> str | None:
    """None if a node can run here, else why not (one line)."""
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("containerd", "runc", "ctr", "/usr/lib/cni/bridge", "/bin/busybox"):
        if shutil.which(tool) is None and not Path(tool).exists():
            return f"{tool} not found (apt-get install containerd runc containernetworking-plugins busybox-static)"
    if not (bin_dir() / "kubelet").exists():
        return "kubelet not built (hack/build-k8s.sh kubelet)"
    return None


class _MachineLock:
    """The machine-wide node lock, reentrant within a process (a cluster holds it around its
    bridge and its node). Taking it first sweeps what a killed run left behind."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.depth = 0

    def acquire(self, timeout: float = LOCK_WAIT_SECONDS) -> None:
        if self.depth:
            self.depth += 1
            return
        fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise RuntimeError(
                        f"another local node (pid {holder}) held {LOCK} for {timeout:.0f}s"
                    ) from None
                if not told:
                    print(f"waiting for the local node of pid {holder} ({LOCK})", flush=True)
                    told = True
                time.sleep(1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self.fd, self.depth = fd, 1
        try:
            _sweep_stale()
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        if not self.depth:
            return
        self.depth -= 1
        if self.depth == 0 and self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.close(self.fd)  # closing the only descriptor drops the flock
            self.fd = None


MACHINE_LOCK = _MachineLock()


def _cni_netns() -> list[str]:
    return [
        n.split()[0]
        for n in _run("ip", "netns", "list", check=False).stdout.splitlines()
        if n.startswith("cni-")
    ]


def _del_netns(name: str) -> None:
    """`ip netns del`, and what it cannot do: a /run/netns bound again over itself (a
    machine restart did; `ip netns add` binds it once) hides the namespace's mount beneath,
    and the unlink is EBUSY (the last CI's leftovers). Unbinding the top copies shows it."""
    path = Path("/run/netns", name)
    _run("ip", "netns", "del", name, check=False)
    for _ in range(4):
        if not path.exists():
            return
        _run("umount", "-l", str(path), check=False)
        with contextlib.suppress(OSError):
            path.unlink()
            return
        _run("umount", "-l", "/run/netns", check=False)


def _sweep_stale() -> None:
    """With the lock held, nothing else on this machine owns a node: a bridge or cni-
    namespaces that exist are a killed run's, and would make this one fail (the bridge
    cannot be added twice) or be counted as its own leftovers. A node started by
    `hack/node.sh up` is alive without holding the lock: refuse instead of sweeping it."""
    if STATE.exists():
        pid = json.loads(STATE.read_text()).get("pids", {}).get("kubelet")
        if isinstance(pid, int) and Path(f"/proc/{pid}").exists():
            raise RuntimeError("a node from `hack/node.sh up` is running: hack/node.sh down first")
    stale = _cni_netns()
    bridge = _run("ip", "link", "show", BRIDGE, check=False).returncode == 0
    if stale or bridge:
        print(f"removing a killed run's node leftovers: bridge={bridge}, netns={stale}", flush=True)
    for name in stale:
        _del_netns(name)
    if bridge:
        _run("ip", "link", "del", BRIDGE, check=False)


def _host_ip() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


# the CRI plugin's settings, in each version's plugin names: 1.6's config version 2 has one
# "cri" plugin, 2.x's version 3 splits it into images and runtime
_CRI_16 = """[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # no CAP_SYS_RESOURCE here: runc cannot set a negative oom_score_adj
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"""
_CRI_2 = """[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause}"
[plugins."io.containerd.cri.v1.runtime"]
  # no CAP_SYS_RESOURCE here: runc cannot set a negative oom_score_adj
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{cni}"
"""
# gVisor beside runc (containerd 2.x only: the runsc shim speaks 2.x's bootstrap): the handler
# a RuntimeClass names, its shim found on containerd's PATH, runsc's own flags in its file
_RUNSC = """[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.{handler}]
  runtime_type = "io.containerd.runsc.v1"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.{handler}.options]
    TypeUrl = "io.containerd.runsc.v1.options"
    ConfigPath = "{config}"
"""
# systrap: no nested KVM on this machine kind
_RUNSC_CONFIG = """binary_name = "{runsc}"
root = "{root}"
log_level = "info"
log_path = "{logs}/shim-%ID%.log"
[runsc_config]
  platform = "systrap"
  debug-log = "{logs}/runsc-%ID%-%COMMAND%.log"
"""
GVISOR_HANDLER = "runsc"
GVISOR_RUNTIME_CLASS = "gvisor"
# the sandbox's own processes (the Sentry, the gofer: 28 MB resident here, idle) are charged to
# the pod's cgroup, whose limit is its containers' sum: the RuntimeClass adds this much, as a
# platform's does, or a 32Mi sandbox is OOM-killed as it starts
GVISOR_OVERHEAD = {"memory": "64Mi", "cpu": "10m"}


def _containerd_config(d: Path, sock: Path, cni: Path, *, v2: bool, runsc: Path | None) -> str:
    """The node's containerd config: its root, state and sockets in the node's workdir, only
    the overlayfs snapshotter, runc with cgroupfs, the node's CNI config, and with `runsc`
    (its config file) gVisor's handler beside runc."""
    disabled = ["btrfs", "zfs", "devmapper"] if v2 else ["aufs", "btrfs", "zfs", "devmapper"]
    disabled_plugins = ", ".join(f'"io.containerd.snapshotter.v1.{p}"' for p in disabled)
    return (
        f"""version = {3 if v2 else 2}
root = "{d / "root"}"
state = "{d / "state"}"
disabled_plugins = [{disabled_plugins}]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"
"""
        + (_CRI_2 if v2 else _CRI_16).format(pause=images.PAUSE, cni=cni)
        + (_RUNSC.format(handler=GVISOR_HANDLER, config=runsc) if runsc is not None else "")
    )


@dataclass
class Node:
    cp: ControlPlane
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="deathwatch-node-")))
    processes: dict[str, Process] = field(default_factory=dict)
    kubelet_port: int = field(default_factory=free_port)
    kube_proxy: bool = False  # Services: kube-proxy in nftables mode (cluster.py)
    # the node's address, where its kubelet listens (logs, exec) and hostNetwork pods live:
    # the host's own by default, the bridge's in a whole cluster (reachable by the API
    # server, never from outside this machine; cluster.py)
    node_ip: str = field(default_factory=_host_ip)
    # the kubelet's hard eviction thresholds, besides its defaults here (`reconfigure`)
    eviction_hard: dict[str, str] = field(default_factory=dict)
    # what existed before up(): down() removes only what appeared after (kubelet creates
    # iptables-nft tables with its canary and KUBE-FIREWALL chains; containerd /run/containerd)
    tables_before: set[str] | None = None
    run_containerd_existed: bool = True
    locked: bool = False  # holds MACHINE_LOCK from up() to down()
    # pods' DNS server (the kubelet's clusterDNS); None: pods get none (nothing resolves)
    cluster_dns: str | None = None
    # the container runtime: Debian's containerd 1.6 ("containerd"), or containerd 2.x built
    # from its module ("containerd2", hack/build-peers.sh): CRI container events for every
    # subscriber, and the kubelet's EventedPLEG (ADR 0028)
    runtime: str = "containerd"
    # the kubelet's EventedPLEG (alpha): pod lifecycle events from the runtime's CRI stream
    # rather than the 1 s relist (containerd2 only)
    evented_pleg: bool = False
    # gVisor beside runc (containerd2 only): runsc and its shim from hack/build-gvisor.sh, the
    # handler `runsc` and the RuntimeClass `gvisor` (systrap)
    gvisor: bool = False

    @property
    def sock(self) -> Path:
        """containerd's socket: one fixed path (one node per machine, MACHINE_LOCK), so that
        manifests can name it (the firewall's exits container mounts it: local-node overlay)."""
        return RUNTIME_SOCKET

    def ctl(self, pod: str) -> Path:
        """The host directory mounted at /ctl in the test agent pod `pod`."""
        path = self.workdir / "ctl" / pod
        path.mkdir(parents=True, exist_ok=True)
        return path

    # --- up -------------------------------------------------------------------------------

    def up(self, timeout: float = 90) -> Node:
        reason = node_available()
        if reason:
            raise RuntimeError(f"cannot run a node here: {reason}")
        MACHINE_LOCK.acquire()
        self.locked = True
        self.tables_before = _tables()
        self.run_containerd_existed = Path("/run/containerd").exists()
        try:
            (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
            self._containerd()
            self._import_images()
            self._kubelet()
            self._wait_ready(timeout)
            # the node's pod range on its Node object, as kube-controller-manager's
            # --allocate-node-cidrs records it on every real cluster: the firewall agents learn
            # the host's own addresses in it (.0, and .1 the bridge's gateway) there (ADR 0012)
            cidrs = json.dumps({"spec": {"podCIDR": POD_SUBNET, "podCIDRs": [POD_SUBNET]}})
            self.cp.kubectl_run("patch", "node", NODE_NAME, "--type=merge", "-p", cidrs)
            if self.gvisor:
                self._runtime_class()
            if self.kube_proxy:
                self._kube_proxy(timeout)
        except BaseException:
            self.down()
            raise
        return self

    def _containerd(self) -> None:
        d = self.workdir / "containerd"
        RUNTIME_SOCKET.parent.mkdir(parents=True, exist_ok=True)
        (d / "root").mkdir(parents=True)
        (d / "state").mkdir(parents=True)
        cni = self.workdir / "cni"
        cni.mkdir()
        (cni / "10-deathwatch.conflist").write_text(
            '{"cniVersion": "0.4.0", "name": "deathwatch", "plugins": [{"type": "bridge", '
            f'"bridge": "{BRIDGE}", "isGateway": true, "ipMasq": false, "hairpinMode": true, '
            f'"ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{POD_SUBNET}"}}]], '
            f'"routes": [{{"dst": "0.0.0.0/0"}}], "dataDir": "{self.workdir / "cni-ipam"}"}}}}]}}\n'
        )
        config = d / "config.toml"
        v2 = self.runtime == "containerd2"
        runsc = self._runsc_config() if self.gvisor else None
        config.write_text(_containerd_config(d, self.sock, cni, v2=v2, runsc=runsc))
        # containerd 2 from its module, its shim first on PATH (and runsc's); 1.6 is Debian's
        binaries = containerd2_bin() if v2 else None
        path = [str(binaries)] if binaries else []
        if self.gvisor:
            path.append(str(gvisor_bin()))
        proc = Process(
            "containerd",
            [str(binaries / "containerd") if binaries else "containerd", "--config", str(config)],
            self.workdir / "logs" / "containerd.log",
            env={"PATH": ":".join([*path, os.environ.get("PATH", "")])} if path else None,
        )
        self.processes["containerd"] = proc
        proc.start()
        deadline = time.monotonic() + 30
        while not self.sock.exists():
            if not proc.running or time.monotonic() > deadline:
                raise RuntimeError(f"{self.runtime} did not start:\n{proc.tail()}")
            time.sleep(0.1)

    def _runsc_config(self) -> Path:
        reason = gvisor_available()
        if reason is not None or self.runtime != "containerd2":
            raise RuntimeError(f"gVisor on this node: {reason or 'needs runtime containerd2'}")
        (self.workdir / "runsc").mkdir()
        (self.workdir / "logs" / "runsc").mkdir(parents=True, exist_ok=True)
        config = self.workdir / "runsc.toml"
        config.write_text(_RUNSC_CONFIG.format(
            runsc=gvisor_bin() / "runsc", root=self.workdir / "runsc",
            logs=self.workdir / "logs" / "runsc",
        ))  # fmt: skip
        return config

    def _runtime_class(self) -> None:
        """The RuntimeClass pods name to run under gVisor (`runtimeClassName: gvisor`)."""
        body = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                "metadata": {"name": GVISOR_RUNTIME_CLASS}, "handler": GVISOR_HANDLER,
                "overhead": {"podFixed": GVISOR_OVERHEAD}}  # fmt: skip
        self.cp.kubectl_run("apply", "-f", "-", input=json.dumps(body))

    def ctr(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        tool = str(containerd2_bin() / "ctr") if self.runtime == "containerd2" else "ctr"
        return _run(
            tool, "--address", str(self.sock), "-n", "k8s.io", *args, check=check, timeout=timeout
        )

    def _import_images(self) -> None:
        for ref, tar in images.build_all(self.workdir / "images").items():
            self.import_image(tar, ref)

    def import_image(self, archive: Path, ref: str) -> None:
        """An OCI archive into this node's containerd, where the kubelet finds it by `ref`
        (there is no registry: pods must use imagePullPolicy Never or IfNotPresent)."""
        self.ctr("images", "import", "--snapshotter", "overlayfs", str(archive), timeout=300)
        if ref not in self.ctr("images", "ls", "-q").stdout.split():
            raise RuntimeError(f"image {ref} not imported from {archive}")

    def _kube_proxy(self, timeout: float) -> None:
        """kube-proxy in nftables mode, as a process on the host: ClusterIP Services (the
        `kubernetes` one included) for pods and the host, its DNAT beside our table."""
        pki = self.workdir / "pki"
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "kube-proxy.key",
                 "-out", "kube-proxy.csr", "-subj", "/CN=system:kube-proxy", cwd=pki)  # fmt: skip
        _openssl("x509", "-req", "-in", "kube-proxy.csr", "-CA", str(self.cp.certs / "ca.crt"),
                 "-CAkey", str(self.cp.certs / "ca.key"), "-CAcreateserial", "-out",
                 "kube-proxy.crt", "-days", "2", "-extfile", "client.ext", cwd=pki)  # fmt: skip
        kc = self.workdir / "kube-proxy.kubeconfig"
        kc.write_text(kubeconfig(self.cp.server, self.cp.certs / "ca.crt", pki / "kube-proxy.crt",
                                 pki / "kube-proxy.key", user="system:kube-proxy"))  # fmt: skip
        health, metrics = free_port(), free_port()
        config = self.workdir / "kube-proxy.yaml"
        config.write_text(
            f"""apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: {kc}}}
mode: nftables
clusterCIDR: {POD_SUBNET}
hostnameOverride: {NODE_NAME}
healthzBindAddress: 127.0.0.1:{health}
metricsBindAddress: 127.0.0.1:{metrics}
conntrack: {{maxPerCore: 0}}
"""
        )
        proc = Process(
            "kube-proxy",
            [str(bin_dir() / "kube-proxy"), f"--config={config}", "--v=1"],
            self.workdir / "logs" / "kube-proxy.log",
        )
        self.processes["kube-proxy"] = proc
        proc.start()
        deadline = time.monotonic() + timeout
        while "table ip kube-proxy" not in _run("nft", "list", "tables", check=False).stdout:
            if not proc.running or time.monotonic() > deadline:
                raise RuntimeError(f"kube-proxy did not program nftables:\n{proc.tail(40)}")
            time.sleep(0.2)

    def _kubelet(self, fresh: bool = True) -> None:
        pki = self.workdir / "pki"
        if not fresh:  # its certificates and kubeconfig are made once
            self._write_kubelet_config()
            self._start_kubelet()
            return
        pki.mkdir()
        ca = self.cp.certs
        (pki / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
        (pki / "serving.ext").write_text(
            f"subjectAltName=IP:127.0.0.1,IP:{self.node_ip},DNS:{NODE_NAME}\nextendedKeyUsage=serverAuth\n"
        )
        for name, subject, ext in (
            ("kubelet-client", f"/O=system:nodes/CN=system:node:{NODE_NAME}", "client.ext"),
            ("kubelet-serving", f"/CN={NODE_NAME}", "serving.ext"),
        ):
            _openssl(
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                f"{name}.key",
                "-out",
                f"{name}.csr",
                "-subj",
                subject,
                cwd=pki,
            )
            _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", str(ca / "ca.crt"), "-CAkey", str(ca / "ca.key"),
                     "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", ext, cwd=pki)  # fmt: skip
        kc = self.workdir / "kubelet.kubeconfig"
        kc.write_text(
            kubeconfig(
                self.cp.server,
                ca / "ca.crt",
                pki / "kubelet-client.crt",
                pki / "kubelet-client.key",
                user=f"system:node:{NODE_NAME}",
            )
        )
        self._write_kubelet_config()
        self._start_kubelet()

    def _write_kubelet_config(self) -> None:
        pki, ca = self.workdir / "pki", self.cp.certs
        config = self.workdir / "kubelet-config.yaml"
        config.write_text(
            f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
containerRuntimeEndpoint: unix://{self.sock}
address: {"127.0.0.1" if self.node_ip == _host_ip() else self.node_ip}
port: {self.kubelet_port}
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca / "ca.crt"}}}
authorization: {{mode: AlwaysAllow}}
tlsCertFile: {pki / "kubelet-serving.crt"}
tlsPrivateKeyFile: {pki / "kubelet-serving.key"}
failSwapOn: false
podLogsDir: {self.workdir / "pod-logs"}
# images cannot be pulled here: never garbage-collect the imported ones
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{{self._eviction_hard()}}}
evictionPressureTransitionPeriod: 5s
# an emptyDir's usage is measured (du) once a period (1m by default): its sizeLimit eviction
# within seconds, as a container's ephemeral-storage one (tests/node/test_deaths.py)
volumeStatsAggPeriod: 10s
registerNode: true
resolvConf: ""
"""
            + ("featureGates: {EventedPLEG: true}\n" if self.evented_pleg else "")
            + (f"clusterDNS: [{self.cluster_dns}]\nclusterDomain: cluster.local\n"
               if self.cluster_dns else "")
        )  # fmt: skip

    def _start_kubelet(self) -> None:
        proc = Process(
            "kubelet",
            [
                str(bin_dir() / "kubelet"),
                f"--config={self.workdir / 'kubelet-config.yaml'}",
                f"--kubeconfig={self.workdir / 'kubelet.kubeconfig'}",
                f"--root-dir={self.workdir / 'kubelet'}",
                f"--cert-dir={self.workdir / 'kubelet-certs'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={self.node_ip}",
                "--v=1",
            ],
            self.workdir / "logs" / "kubelet.log",
        )
        self.processes["kubelet"] = proc
        proc.start()

    def _eviction_hard(self) -> str:
        thresholds = {"memory.available": "50Mi", "nodefs.available": "2%",
                      "imagefs.available": "2%", **self.eviction_hard}  # fmt: skip
        return ", ".join(f'{k}: "{v}"' for k, v in thresholds.items())

    def reconfigure(self, eviction_hard: dict[str, str], timeout: float = 90) -> None:
        """Restart the kubelet with these hard eviction thresholds (its pods run on, as
        through any kubelet restart); `{}` puts the defaults back."""
        self.eviction_hard = dict(eviction_hard)
        kubelet = self.processes.pop("kubelet")
        kubelet.stop(timeout=20)
        self._kubelet(fresh=False)
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.cp.kubectl_run(
                "get",
                "node",
                NODE_NAME,
                "-o",
                "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                check=False,
            )
            if out.stdout.strip() == "True":
                return
            for name, proc in self.processes.items():
                if not proc.running:
                    raise RuntimeError(f"{name} exited:\n{proc.tail(40)}")
            time.sleep(0.5)
        raise RuntimeError(
            f"node {NODE_NAME} not Ready within {timeout:.0f}s\n--- kubelet ---\n{self.processes['kubelet'].tail(40)}"
        )

    # --- down -----------------------------------------------------------------------------

    def down(self) -> None:
        """Remove everything this node created. Safe to call more than once, and after a
        failed up()."""
        for name in ("kube-proxy", "kubelet"):
            proc = self.processes.get(name)
            if proc is not None:
                proc.stop(timeout=20)
        if self.sock.exists():
            # stop and remove every pod sandbox and container the node left behind
            tasks = self.ctr("tasks", "ls", "-q", check=False).stdout.split()
            for task in tasks:
                self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
            deadline = time.monotonic() + 10
            while (
                self.ctr("tasks", "ls", "-q", check=False).stdout.split()
                and time.monotonic() < deadline
            ):
                time.sleep(0.1)
            for task in tasks:
                self.ctr("tasks", "delete", "-f", task, check=False)
            for container in self.ctr("containers", "ls", "-q", check=False).stdout.split():
                self.ctr("containers", "delete", container, check=False)
        containerd = self.processes.get("containerd")
        if containerd is not None:
            containerd.stop(timeout=20)
        self._kill_strays()
        self._unmount()
        self._remove_cgroups()
        for name in _cni_netns():
            _del_netns(name)
        _run("ip", "link", "del", BRIDGE, check=False)
        _run("nft", "delete", "table", "inet", "deathwatch", check=False)
        if self.tables_before is not None:
            for table in sorted(_tables() - self.tables_before):
                _run("nft", "delete", "table", *table.split(" ", 1), check=False)
        if not self.run_containerd_existed:
            shutil.rmtree("/run/containerd", ignore_errors=True)
        shutil.rmtree(RUNTIME_SOCKET.parent, ignore_errors=True)
        self.cp.kubectl_run(
            "delete", "node", NODE_NAME, "--ignore-not-found", "--wait=false", check=False
        )
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.processes.clear()
        if self.locked:
            self.locked = False
            MACHINE_LOCK.release()

    def _kill_strays(self) -> None:
        """containerd shims outlive containerd: end the ones serving our socket, and gVisor's
        sandboxes and gofers (runsc processes with this node's runsc root)."""
        marker, runsc_root = str(self.sock), f"--root={self.workdir / 'runsc'}"
        for pid_dir in Path("/proc").glob("[0-9]*"):
            try:
                cmdline = (
                    (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                )
            except OSError:
                continue
            if (marker in cmdline and "containerd-shim" in cmdline) or runsc_root in cmdline:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid_dir.name), signal.SIGKILL)

    def _unmount(self) -> None:
        root = str(self.workdir)
        for _ in range(3):
            mounts = [
                line.split()[1]
                for line in Path("/proc/mounts").read_text().splitlines()
                if line.split()[1].startswith(root)
                or "/run/containerd/io.containerd" in line.split()[1]
            ]
            if not mounts:
                return
            for mount in sorted(mounts, key=len, reverse=True):
                _run("umount", "-l", mount, check=False)

    @staticmethod
    def _remove_cgroups() -> None:
        for hierarchy in CGROUP_ROOT.iterdir():
            top = hierarchy / "kubepods"
            if not top.is_dir():
                continue
            for path in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if path.is_dir():
                    with contextlib.suppress(OSError):
                        path.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()

    def leftovers(self) -> list[str]:
        """What a down() should have removed and did not (for tests)."""
        out = []
        for hierarchy in CGROUP_ROOT.iterdir():
            if (hierarchy / "kubepods").exists():
                out.append(f"cgroup {hierarchy / 'kubepods'}")
        if _run("ip", "link", "show", BRIDGE, check=False).returncode == 0:
            out.append(f"bridge {BRIDGE}")
        out += [f"netns {n}" for n in _cni_netns()]
        if self.workdir.exists():
            out.append(f"directory {self.workdir}")
        if self.tables_before is not None:
            out += [f"nft table {t}" for t in sorted(_tables() - self.tables_before)]
        out += [
            f"mount {m}"
            for m in Path("/proc/mounts").read_text().split()
            if m.startswith(str(self.workdir))
        ]
        return out


@contextlib.contextmanager
def running(cp: ControlPlane) -> Iterator[Node]:
    node = Node(cp).up()
    try:
        yield node
    finally:
        node.down()


# --- hack/node.sh up|down ------------------------------------------------------------------

STATE = (
    Path(os.environ.get("DEATHWATCH_CACHE", Path.home() / ".cache" / "deathwatch"))
    / "run"
    / "node.json"
)


class _Pid(Process):
    """A process started by an earlier `hack/node.sh up`, known only by its pid."""

    def __init__(self, name: str, pid: int, log: Path) -> None:
        super().__init__(name, [], log)
        self.pid = pid

    def stop(self, timeout: float = 15) -> None:
        stop_pids([self.pid], timeout)


def _control_plane_from_state() -> ControlPlane:
    from hack.localcluster import controlplane

    if not controlplane.STATE.exists():
        raise SystemExit("no control plane: run hack/control-plane.sh up first")
    state = json.loads(controlplane.STATE.read_text())
    return ControlPlane(
        Path(state["workdir"]), apiserver_port=int(state["server"].rsplit(":", 1)[1])
    )


def cli_up() -> int:
    if STATE.exists():
        print(f"already up: {json.loads(STATE.read_text())['workdir']} (hack/node.sh down first)")
        return 1
    cp = _control_plane_from_state()
    started = time.monotonic()
    try:
        node = Node(cp).up()
    except RuntimeError as exc:
        print(exc)
        return 1
    STATE.parent.mkdir(parents=True, exist_ok=True)
    STATE.write_text(
        json.dumps(
            {
                "workdir": str(node.workdir),
                "pids": {n: p.popen.pid for n, p in node.processes.items() if p.popen is not None},
                "tables_before": sorted(node.tables_before or ()),
                "run_containerd_existed": node.run_containerd_existed,
            }
        )
    )
    for p in node.processes.values():
        p.popen = None  # they outlive this command
    print(
        f"node {NODE_NAME} Ready in {time.monotonic() - started:.1f}s; pods use image {images.AGENT} (imagePullPolicy: Never)"
    )
    return 0


def cli_down() -> int:
    if not STATE.exists():
        print("not up")
        return 0
    state = json.loads(STATE.read_text())
    node = Node(_control_plane_from_state(), workdir=Path(state["workdir"]))
    node.tables_before = set(state["tables_before"])
    node.run_containerd_existed = state["run_containerd_existed"]
    node.processes = {
        n: _Pid(n, pid, node.workdir / "logs" / f"{n}.log") for n, pid in state["pids"].items()
    }
    node.down()
    STATE.unlink()
    left = node.leftovers()
    print("node down" + (f"; left over: {left}" if left else ", nothing left over"))
    return 1 if left else 0


def main(argv: list[str]) -> int:
    commands = {"up": cli_up, "down": cli_down}
    if len(argv) != 1 or argv[0] not in commands:
        print("usage: python3 -m hack.localcluster.node up|down")
        return 2
    return commands[argv[0]]()


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
