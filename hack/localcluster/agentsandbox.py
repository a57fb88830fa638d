"""agent-sandbox (sigs.k8s.io/agent-sandbox), as its users install it, on a local control
plane: its release CRDs (k8s/crds), its generated RBAC and its controller, built from its Go
module by hack/build-peers.sh (one build, shared with bench/peers.py).

The controller runs as a host process under its own ServiceAccount, bound to the release's
ClusterRoles, so it can do exactly what it could in its Deployment; with `--extensions` it
also runs the SandboxClaim, SandboxTemplate and SandboxWarmPool controllers.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from hack.localcluster.controller_process import service_account_kubeconfig
from hack.localcluster.controlplane import ControlPlane, free_port, peer_home, versions

NAMESPACE = "agent-sandbox-system"
SERVICE_ACCOUNT = "agent-sandbox-controller"
CLUSTER_ROLES = ("agent-sandbox-controller", "agent-sandbox-controller-extensions")
CRDS = (
    "sandboxes.agents.x-k8s.io",
    "sandboxclaims.extensions.agents.x-k8s.io",
    "sandboxtemplates.extensions.agents.x-k8s.io",
    "sandboxwarmpools.extensions.agents.x-k8s.io",
)


def home() -> Path:
    """Where hack/build-peers.sh put the pinned release: bin/ and its module's src/."""
    return peer_home("sigs.k8s.io/agent-sandbox", versions()["AGENT_SANDBOX_VERSION"])


def binary() -> Path:
    return home() / "bin" / "agent-sandbox-controller"


def missing() -> str | None:
    """Why agent-sandbox cannot run here, or None."""
    if not binary().exists():
        return f"{binary()} missing: run hack/build-peers.sh"
    if not (home() / "src" / "k8s" / "crds").is_dir():
        return f"{home() / 'src' / 'k8s' / 'crds'} missing: run hack/build-peers.sh"
    return None


def crds() -> list[dict[str, Any]]:
    """The release CRDs, less their conversion webhook (only v1beta1 is served here, and no
    webhook runs: the API server would refuse every write on the way to one)."""
    out = []
    for path in sorted((home() / "src" / "k8s" / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        crd["spec"].pop("conversion", None)
        out.append(crd)
    return out


def install_crds(cp: ControlPlane) -> None:
    for crd in crds():
        cp.kubectl_run("apply", "--server-side", "-f", "-", input=json.dumps(crd))
    cp.kubectl_run("wait", "--for=condition=Established", "--timeout=60s",
                   *(f"crd/{name}" for name in CRDS))  # fmt: skip


def install_rbac(cp: ControlPlane) -> None:
    """The release's ClusterRoles (k8s/*rbac.generated.yaml) bound to its ServiceAccount."""
    src = home() / "src" / "k8s"
    for name in ("rbac.generated.yaml", "extensions-rbac.generated.yaml"):
        cp.kubectl_run("apply", "-f", str(src / name))
    cp.kubectl_run("create", "namespace", NAMESPACE, check=False)
    cp.kubectl_run("create", "serviceaccount", SERVICE_ACCOUNT, "-n", NAMESPACE, check=False)
    for role in CLUSTER_ROLES:
        cp.kubectl_run("create", "clusterrolebinding", role, f"--clusterrole={role}",
                       f"--serviceaccount={NAMESPACE}:{SERVICE_ACCOUNT}", check=False)  # fmt: skip


class AgentSandboxController:
    """The release's controller (core and extensions), a host process under its account."""

    def __init__(self, cp: ControlPlane, api: client.ApiClient, work: Path) -> None:
        self.cp, self.api, self.work = cp, api, work
        self.health = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = work / "agent-sandbox-controller.log"

    def start(self, timeout: float = 60) -> AgentSandboxController:
        kc = service_account_kubeconfig(self.cp, self.api, NAMESPACE, SERVICE_ACCOUNT,
                                        self.work / "agent-sandbox.kubeconfig")  # fmt: skip
        args = [str(binary()), "--extensions", "--leader-elect=false",
                f"--metrics-bind-address=127.0.0.1:{free_port()}",
                f"--health-probe-bind-address=127.0.0.1:{self.health}"]  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env={"KUBECONFIG": str(kc)}
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent-sandbox controller exited:\n{self.tail()}")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.health}/readyz", timeout=2
                ) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"agent-sandbox controller not ready in {timeout}s:\n{self.tail()}")

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
