"""A real, local Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager.

Built from Go modules by hack/build-k8s.sh, started on loopback with random free ports,
data and freshly generated certificates in a temporary directory, RBAC on, and service
account signing keys so TokenRequest works. Used by the pytest fixture (tests/conftest.py),
by `hack/control-plane.sh up|down|env` for people, and by the demo.

No kubelet runs here, so tests play kubelet by writing pods/status. kube-controller-manager
therefore runs without the two controllers that would fight that:
  - node-lifecycle-controller marks pods on nodes with no kubelet NotReady after its grace
    period (and taints/evicts them);
  - pod-garbage-collector-controller deletes pods bound to nodes that do not exist.
Everything else (garbage collector for ownerReferences, service accounts and their tokens,
namespace deletion, root CA publishing, CSR signing for a kubelet) runs as in a cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent


def versions() -> dict[str, str]:
    out = {}
    for raw in (ROOT / "hack" / "versions.env").read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key] = value.strip('"')
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("DEATHWATCH_CACHE", Path.home() / ".cache" / "deathwatch"))


def peer_home(module: str, version: str) -> Path:
    """Where hack/build-peers.sh puts a peer built from its Go module: bin/ and src/."""
    return cache_dir() / "peers" / f"{module.replace('/', '_')}@{version}"


def bin_dir(version: str | None = None) -> Path:
    return cache_dir() / "k8s" / (version or versions()["K8S_VERSION"]) / "bin"


def matrix() -> list[str]:
    """The releases the version lane runs beside the pinned one (K8S_MATRIX)."""
    return versions()["K8S_MATRIX"].split()


def shards_apiserver() -> Path:
    """The shard lanes' kube-apiserver (KEP-5866's gate: SHARDS_APISERVER_VERSION)."""
    return bin_dir(versions()["SHARDS_APISERVER_VERSION"]) / "kube-apiserver"


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# ports handed out lie between this and the kernel's ephemeral range: below it sit the
# well-known and registered services of a machine, above it every outgoing connection
_LISTEN_FLOOR = 20000
_handed_out: set[int] = set()
_next_port = [0]


def free_port() -> int:
    """A loopback port nobody listens on, never handed out twice by this process.

    Taken below the kernel's ephemeral range, not from bind(0): a port bind(0) returned is
    free only until the socket closes, and the kernel hands the same range to every outgoing
    connection. CI once saw a controller's metrics port taken, for all of its 30 s, by a
    client connection's source port (EADDRINUSE on every retry).
    """
    top = _ephemeral_floor()
    span = top - _LISTEN_FLOOR
    if not _next_port[0]:
        # processes started together (pytest, the demo, hack scripts) start apart
        _next_port[0] = _LISTEN_FLOOR + (os.getpid() * 7919 + time.monotonic_ns()) % span
    for _ in range(span):
        port = _next_port[0]
        _next_port[0] = _LISTEN_FLOOR + (port + 1 - _LISTEN_FLOOR) % span
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {_LISTEN_FLOOR}-{top - 1}")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def _component_flags(kubeconfig: Path) -> list[str]:
    """What kube-controller-manager and kube-scheduler share: one kubeconfig for the API,
    authentication and authorization, and no serving port of their own."""
    kc = str(kubeconfig)
    return [f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}", "--bind-address=127.0.0.1", "--secure-port=0"]  # fmt: skip


_RELEASED = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")


class StartError(RuntimeError):
    pass


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(d: Path, serving_ips: tuple[str, ...] = ()) -> None:
    """CA, apiserver serving cert (for 127.0.0.1, the Service IP and `serving_ips`), client
    certs of each component, service-account key pair (openssl)."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "2", "-subj", "/CN=deathwatch-local-ca", cwd=d)  # fmt: skip
    (d / "apiserver.ext").write_text(
        "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,"
        + "".join(f"IP:{ip}," for ip in serving_ips)
        + "DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
        "extendedKeyUsage=serverAuth\n"
    )
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    certs = [
        ("apiserver", "/CN=kube-apiserver", "apiserver.ext"),
        ("admin", "/O=system:masters/CN=deathwatch-admin", "client.ext"),
        ("controller-manager", "/CN=system:kube-controller-manager", "client.ext"),
        ("scheduler", "/CN=system:kube-scheduler", "client.ext"),
        (
            "apiserver-kubelet-client",
            "/O=kubeadm:cluster-admins/CN=kube-apiserver-kubelet-client",
            "client.ext",
        ),
    ]
    for name, subject, ext in certs:
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subject, cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", ext, cwd=d)  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


def kubeconfig(server: str, ca: Path, cert: Path | None, key: Path | None, token: str | None = None,
               user: str = "admin") -> str:  # fmt: skip
    user_entry: dict[str, str] = {}
    if cert and key:
        user_entry = {"client-certificate": str(cert), "client-key": str(key)}
    if token:
        user_entry = {"token": token}
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}
            ],
            "users": [{"name": user, "user": user_entry}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
            "current-context": "local",
        },
        indent=2,
    )


@dataclass
class Process:
    name: str
    args: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    env: dict[str, str] | None = None  # beside this process's environment

    def start(self) -> None:
        logf = self.log.open("ab")
        # a new session: `hack/control-plane.sh up` leaves it running after the script exits,
        # and a Ctrl-C in the terminal of a test run does not kill it before teardown does
        self.popen = subprocess.Popen(
            self.args, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **self.env} if self.env else None,
        )  # fmt: skip
        logf.close()

    def stop(self, timeout: float = 15) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout)
        self.popen = None

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])


# Which writes the audit log keeps (ControlPlane(audit=True)): those of deathwatch's objects,
# of Events and of Leases, at the Metadata level (who, what, when, the request URI with its
# fieldManager), and reads of single pods (a node exit's causal read, ADR 0028); nothing
# else, so the log stays small.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete]
    resources:
      - {group: deathwatch.dev}
      - {group: "", resources: [events]}
      - {group: coordination.k8s.io, resources: [leases]}
  - level: Metadata
    verbs: [get]
    resources:
      - {group: "", resources: [pods]}
  - level: None
"""


@dataclass
class ControlPlane:
    workdir: Path
    binaries: Path = field(default_factory=bin_dir)
    with_controller_manager: bool = True
    with_scheduler: bool = False  # pods name their node unless a scheduler runs (cluster.py)
    # a real kubelet reports (cluster.py), or nodes are kept alive (fakenodes.py): the node
    # controllers may run (node lifecycle, taint eviction, pod GC)
    with_node_controllers: bool = False
    controller_manager_args: list[str] = field(default_factory=list)  # e.g. monitor periods
    # where kube-apiserver listens and what it advertises (the `kubernetes` Service's endpoint):
    # loopback, or an address pods can reach, the node's bridge (cluster.py); never outside
    bind_address: str = "127.0.0.1"
    # every write to deathwatch's objects, Events and Leases, as JSON lines (audit_log)
    audit: bool = False
    audit_policy: str = AUDIT_POLICY  # which writes it keeps (bench/peers.py: every tool's)
    # another kube-apiserver than the pinned release's (the shard lanes': shards_apiserver()),
    # and its extra flags (e.g. --feature-gates=ShardedListAndWatch=true)
    apiserver_binary: Path | None = None
    apiserver_flags: list[str] = field(default_factory=list)
    # the Pod Security level every namespace without a label of its own enforces (baseline, as
    # hardened clusters and most managed ones default to); None: the API server's (privileged)
    pod_security: str | None = None
    # another Kubernetes release's kube-apiserver, kube-controller-manager and kube-scheduler
    # (the version lane's: K8S_MATRIX, built by hack/build-k8s.sh --version); etcd and kubectl
    # stay the pinned release's
    release: str | None = None
    etcd_port: int = field(default_factory=free_port)
    etcd_peer_port: int = field(default_factory=free_port)
    apiserver_port: int = field(default_factory=free_port)
    processes: dict[str, Process] = field(default_factory=dict)

    @property
    def server(self) -> str:
        return f"https://{self.bind_address}:{self.apiserver_port}"

    @property
    def certs(self) -> Path:
        return self.workdir / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def kubectl(self) -> Path:
        return self.binaries / "kubectl"

    def binary(self, name: str) -> Path:
        """A component's binary: the pinned release's, or `release`'s for the control plane's
        own three."""
        if name in _RELEASED and self.release is not None:
            return bin_dir(self.release) / name
        return self.binaries / name

    def _process(self, name: str, args: list[str]) -> Process:
        proc = Process(name, args, self.workdir / "logs" / f"{name}.log")
        self.processes[name] = proc
        return proc

    # --- lifecycle ----------------------------------------------------------------------

    def start(self, timeout: float = 60) -> None:
        needed = ["etcd", "kube-apiserver", "kube-controller-manager", "kubectl"]
        for b in needed + ["kube-scheduler"] * self.with_scheduler:
            if not self.binary(b).exists():
                version = f"--version {self.release} " if b in _RELEASED and self.release else ""
                raise StartError(f"{self.binary(b)} is missing: run hack/build-k8s.sh {version}{b}")
        if self.apiserver_binary is not None and not self.apiserver_binary.exists():
            raise StartError(f"{self.apiserver_binary} is missing: run hack/setup.sh")
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        extra_ips = () if self.bind_address == "127.0.0.1" else (self.bind_address,)
        make_certs(self.certs, extra_ips)
        self.kubeconfig.write_text(
            kubeconfig(
                self.server,
                self.certs / "ca.crt",
                self.certs / "admin.crt",
                self.certs / "admin.key",
            )
        )
        for component, user in (
            ("controller-manager", "system:kube-controller-manager"),
            ("scheduler", "system:kube-scheduler"),
        ):
            (self.workdir / f"{component}.kubeconfig").write_text(
                kubeconfig(
                    self.server,
                    self.certs / "ca.crt",
                    self.certs / f"{component}.crt",
                    self.certs / f"{component}.key",
                    user=user,
                )
            )
        try:
            self._start_etcd(timeout)
            self.start_apiserver(timeout)
            if self.with_controller_manager:
                self._start_controller_manager()
            if self.with_scheduler:
                self._start_scheduler()
        except BaseException:
            self.stop()
            raise

    def _start_etcd(self, timeout: float) -> None:
        c = f"http://127.0.0.1:{self.etcd_port}"
        p = f"http://127.0.0.1:{self.etcd_peer_port}"
        proc = self._process(
            "etcd",
            [
                str(self.binaries / "etcd"),
                "--name=local",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={c}",
                f"--advertise-client-urls={c}",
                f"--listen-peer-urls={p}",
                f"--initial-advertise-peer-urls={p}",
                f"--initial-cluster=local={p}",
                "--unsafe-no-fsync",  # test data: durability across power loss is not needed
                "--log-level=warn",
            ],
        )
        proc.start()
        self._wait(lambda: self._http_ok(f"{c}/health"), timeout, "etcd")

    @property
    def audit_log(self) -> Path:
        return self.workdir / "logs" / "audit.jsonl"

    def _audit_args(self) -> list[str]:
        if not self.audit:
            return []
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(self.audit_policy)
        return [f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json", "--audit-log-mode=blocking"]  # fmt: skip

    def _admission_args(self) -> list[str]:
        if self.pod_security is None:
            return []
        path = self.workdir / "admission.yaml"
        path.write_text(json.dumps({
            "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
            "plugins": [{"name": "PodSecurity", "configuration": {
                "apiVersion": "pod-security.admission.config.k8s.io/v1",
                "kind": "PodSecurityConfiguration",
                "defaults": {"enforce": self.pod_security, "enforce-version": "latest",
                             "warn": self.pod_security, "warn-version": "latest"},
                "exemptions": {"usernames": [], "runtimeClasses": [], "namespaces": []},
            }}],
        }))  # fmt: skip
        return [f"--admission-control-config-file={path}"]

    def apiserver_args(self) -> list[str]:
        pki = self.certs
        return [
            str(self.apiserver_binary or self.binary("kube-apiserver")),
            *self.apiserver_flags,
            *self._audit_args(),
            *self._admission_args(),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            f"--bind-address={self.bind_address}",
            f"--advertise-address={self.bind_address}",
            f"--secure-port={self.apiserver_port}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={pki / 'ca.crt'}",
            "--kubelet-preferred-address-types=InternalIP",  # no DNS for node names here
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=Node,RBAC",
            "--enable-bootstrap-token-auth",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
            # on loopback, the `kubernetes` Service's endpoint would reach nothing but this
            # host, and from 1.37 the endpoint reconciler refuses a loopback address outright
            *(["--endpoint-reconciler-type=none"] if self.bind_address.startswith("127.") else []),
        ]

    def start_apiserver(self, timeout: float = 60) -> None:
        """Start (or restart, against the same etcd and port) kube-apiserver; wait for /readyz."""
        proc = self.processes.get("kube-apiserver") or self._process(
            "kube-apiserver", self.apiserver_args()
        )
        self.processes["kube-apiserver"] = proc
        proc.start()
        self._wait(lambda: self._http_ok(f"{self.server}/readyz"), timeout, "kube-apiserver")

    def stop_apiserver(self) -> None:
        """Cut every client off: the process ends, its port closes; etcd keeps the data."""
        proc = self.processes.get("kube-apiserver")
        if proc is not None:
            proc.stop()
        deadline = time.monotonic() + 10
        while port_open(self.apiserver_port, self.bind_address) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _start_controller_manager(self) -> None:
        pki = self.certs
        kc = self.workdir / "controller-manager.kubeconfig"
        self._process(
            "kube-controller-manager",
            [
                str(self.binary("kube-controller-manager")),
                *_component_flags(kc),
                # see the module docstring: no kubelet runs, the tests write pod status
                "--controllers=*"
                if self.with_node_controllers
                else "--controllers=*,-node-lifecycle-controller,-pod-garbage-collector-controller",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                "--v=1",
                *self.controller_manager_args,
            ],
        ).start()

    def _start_scheduler(self) -> None:
        kc = self.workdir / "scheduler.kubeconfig"
        self._process(
            "kube-scheduler",
            [
                str(self.binary("kube-scheduler")),
                *_component_flags(kc),
                "--leader-elect=false",
                "--v=1",
            ],
        ).start()

    # --- etcd, for faults the tests inject ----------------------------------------------

    def _etcd(self, path: str, body: dict[str, object]) -> dict[str, object]:
        """etcd's v3 HTTP gateway (JSON; keys base64)."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.etcd_port}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310 - loopback
            answer: dict[str, object] = json.loads(resp.read())
        return answer

    def etcd_revision(self) -> int:
        header = self._etcd("/v3/kv/range", {"key": "AA=="})["header"]
        return int(header["revision"])  # type: ignore[index]

    def compact(self) -> int:
        """Compact etcd's history up to now: every watch resuming from an older resource
        version gets 410 Gone and must list again. Returns the revision compacted at."""
        revision = self.etcd_revision()
        self._etcd("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision

    def stop(self) -> None:
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self.processes.get(name)
            if proc is not None:
                proc.stop()

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # --- helpers ------------------------------------------------------------------------

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))
        ctx.load_cert_chain(str(self.certs / "admin.crt"), str(self.certs / "admin.key"))
        return ctx

    def _http_ok(self, url: str) -> bool:
        try:
            ctx = self._ssl() if url.startswith("https") else None
            with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:  # noqa: S310
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def _wait(self, ok: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ok():  # type: ignore[operator]
                return
            dead = [p for p in self.processes.values() if p.popen is not None and not p.running]
            if dead:
                break
            time.sleep(0.1)
        logs = "\n".join(
            f"--- {p.name} (last lines of {p.log}) ---\n{p.tail()}" for p in self.processes.values()
        )
        raise StartError(f"{what} did not become ready within {timeout:.0f}s\n{logs}")

    def kubectl_run(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.kubectl), f"--kubeconfig={self.kubeconfig}", "--request-timeout=30s", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )

    def state(self) -> dict[str, object]:
        return {
            "workdir": str(self.workdir),
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "pids": {n: p.popen.pid for n, p in self.processes.items() if p.popen is not None},
            "ports": [self.etcd_port, self.etcd_peer_port, self.apiserver_port],
        }


@contextlib.contextmanager
def running(timeout: float = 60, **options: Any) -> Iterator[ControlPlane]:
    """A control plane for the length of the block; `options` are ControlPlane's fields
    (with_scheduler, with_node_controllers, controller_manager_args, audit, ...)."""
    workdir = Path(tempfile.mkdtemp(prefix="deathwatch-cp-"))
    cp = ControlPlane(workdir, **options)
    try:
        cp.start(timeout)
        yield cp
    finally:
        cp.destroy()


# --- hack/control-plane.sh up|down|env ---------------------------------------------------

STATE = cache_dir() / "run" / "control-plane.json"


def alive(pid: int) -> bool:
    """Running (a zombie left for an init that does not reap counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def stop_pids(pids: list[int], timeout: float = 15) -> None:
    """SIGTERM, wait up to `timeout`, then SIGKILL: for processes an earlier command started."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def cli_up() -> int:
    if STATE.exists():
        state = json.loads(STATE.read_text())
        if any(alive(pid) for pid in state["pids"].values()):
            print(f"already up: export KUBECONFIG={state['kubeconfig']}")
            return 0
    workdir = Path(tempfile.mkdtemp(prefix="deathwatch-cp-"))
    cp = ControlPlane(workdir)
    started = time.monotonic()
    try:
        cp.start()
    except StartError as exc:
        cp.destroy()
        print(exc)
        return 1
    STATE.parent.mkdir(parents=True, exist_ok=True)
    STATE.write_text(json.dumps(cp.state(), indent=2))
    for p in cp.processes.values():  # the processes outlive this command (own sessions)
        p.popen = None
    print(f"control plane up in {time.monotonic() - started:.1f}s at {cp.server}")
    print(f"export KUBECONFIG={cp.kubeconfig}")
    return 0


def cli_down() -> int:
    if not STATE.exists():
        print("not up")
        return 0
    state = json.loads(STATE.read_text())
    # in order, as ControlPlane.stop does: the controller-manager and the apiserver while etcd
    # still answers (an apiserver whose etcd is gone retries until it is killed: 15 s)
    for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
        if name in state["pids"]:
            stop_pids([state["pids"][name]])
    shutil.rmtree(state["workdir"], ignore_errors=True)
    STATE.unlink()
    print("control plane down")
    return 0


def cli_env() -> int:
    if not STATE.exists():
        print("# not up: run hack/control-plane.sh up")
        return 1
    state = json.loads(STATE.read_text())
    print(f"export KUBECONFIG={state['kubeconfig']}")
    print(f"export PATH={bin_dir()}:$PATH")
    return 0


def main(argv: list[str]) -> int:
    commands = {"up": cli_up, "down": cli_down, "env": cli_env}
    if len(argv) != 1 or argv[0] not in commands:
        print("usage: python3 -m hack.localcluster.controlplane up|down|env")
        return 2
    return commands[argv[0]]()


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
