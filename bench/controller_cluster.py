"""What bench/ports_bench.py and bench/mass_death.py start from: the real local control plane,
the controller as a process under its own ServiceAccount (the shipped RBAC, containerd 2.x's
open-files limit), one DeathWatch over the sandboxes of NS, and the bench's own watches of
pods dying and verdicts turning Dead. `code_at` runs another revision's source instead."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config

from bench.controller_bench import NS, TIMEOUT, Watcher
from hack.localcluster import controlplane
from hack.localcluster.controller_process import (
    ControllerProcess,
    metrics_reader_token,
    service_account_kubeconfig,
)

ROOT = Path(__file__).resolve().parent.parent
OPEN_FILES = (1024, 8192)  # a Python process's in a containerd 2.x container


def code_at(rev: str, into: Path) -> tuple[str, ...]:
    """Another revision's source, for PYTHONPATH: its kube, controller and firewall packages."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev, "kube/src", "controller/src", "firewall/src"],
                             cwd=ROOT, capture_output=True, check=True, timeout=60).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True, timeout=60)
    return tuple(str(into / part / "src") for part in ("kube", "controller", "firewall"))


def pod_dead(obj: Any) -> str | None:
    statuses = obj.status.container_statuses or []
    return str(obj.metadata.name) if any(s.state.terminated for s in statuses) else None


def verdict_dead(obj: Any) -> str | None:
    dead = (obj.get("status") or {}).get("state") == "Dead"
    return str(obj["metadata"]["name"]) if dead else None


@dataclass
class ControllerCluster:
    cp: controlplane.ControlPlane
    api: client.ApiClient
    ctrl: ControllerProcess
    reader: str  # a metrics reader's token
    watchers: list[Watcher] = field(default_factory=list)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @property
    def pid(self) -> int:
        assert self.ctrl.proc is not None
        return self.ctrl.proc.pid

    def watch_deaths(self) -> tuple[Watcher, Watcher]:
        """The bench's watches (pods dying, verdicts turning Dead), established."""
        pods = Watcher(self.core.list_namespaced_pod, NS, key=pod_dead)
        verdicts = Watcher(self.custom.list_namespaced_custom_object, "deathwatch.dev",
                           "v1alpha1", NS, "sandboxverdicts", key=verdict_dead)  # fmt: skip
        self.watchers += [pods, verdicts]
        pods.start()
        verdicts.start()
        time.sleep(2)  # both watches established before the first death
        return pods, verdicts


@contextmanager
def controller_cluster(
    work: Path, pythonpath: tuple[str, ...] = (), pool: int = 16
) -> Iterator[ControllerCluster]:
    """The control plane, the controller and its DeathWatch, all stopped on leaving."""
    cp = controlplane.ControlPlane(work / "cp")
    ctrl: ControllerProcess | None = None
    cluster: ControllerCluster | None = None
    try:
        cp.start()
        cp.kubectl_run("apply", "--server-side", "-f", str(ROOT / "manifests" / "base" / "crds"))
        cp.kubectl_run("wait", "--for=condition=Established", "crd/deathwatches.deathwatch.dev",
                       "crd/sandboxverdicts.deathwatch.dev")  # fmt: skip
        cp.kubectl_run("create", "namespace", "deathwatch-system")
        for role in ("controller.yaml", "metrics-reader.yaml"):
            cp.kubectl_run("apply", "-f", str(ROOT / "manifests" / "base" / "rbac" / role))
        cp.kubectl_run("create", "namespace", NS)
        cp.kubectl_run("create", "rolebinding", "deathwatch-controller", "-n", NS,
                       "--clusterrole=deathwatch-controller",
                       "--serviceaccount=deathwatch-system:deathwatch-controller")  # fmt: skip
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=configuration)
        configuration.connection_pool_maxsize = pool
        api = client.ApiClient(configuration)
        deadline = time.monotonic() + 60
        while True:  # the namespace's default ServiceAccount: the namespace is usable
            try:
                client.CoreV1Api(api).read_namespaced_service_account(
                    "default", NS, _request_timeout=TIMEOUT
                )
                break
            except client.ApiException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        kubeconfig = service_account_kubeconfig(
            cp, api, "deathwatch-system", "deathwatch-controller", work / "controller.kubeconfig"
        )
        reader = metrics_reader_token(api)
        env = {"PYTHONPATH": os.pathsep.join(pythonpath)} if pythonpath else {}
        ctrl = ControllerProcess(kubeconfig, [NS], work / "controller.log", env=env,
                                 reader_token=reader, open_files=OPEN_FILES).start()  # fmt: skip
        cp.kubectl_run("apply", "-f", "-", input=(
            f"apiVersion: deathwatch.dev/v1alpha1\nkind: DeathWatch\nmetadata: {{name: bench, "
            f"namespace: {NS}}}\nspec: {{podSelector: {{matchLabels: {{app: sandbox}}}}}}\n"))  # fmt: skip
        cluster = ControllerCluster(cp, api, ctrl, reader)
        yield cluster
    finally:
        for w in cluster.watchers if cluster is not None else []:
            w.stop = True
        if ctrl is not None:
            ctrl.stop()
        cp.stop()
