"""The controller under test: a namespace, the kubelet player, the API, and the controller
process running under its ServiceAccount token with the RBAC from manifests/. Shared by the
control-plane lanes (tests/apiserver/, tests/chaos/) and the node lane (tests/node/)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from hack.localcluster import controlplane
from hack.localcluster.controller_process import (
    ControllerProcess,
    metrics_reader_token,
    service_account_kubeconfig,
)
from hack.localcluster.kubelet import Kubelet
from hack.localcluster.sandbox_script import Fate, SandboxScript, timeline
from tests.kube import wait_for

ROOT = Path(__file__).resolve().parent.parent
GROUP, VERSION = "deathwatch.dev", "v1alpha1"


def prepare(cp: controlplane.ControlPlane) -> None:
    """A module's own control plane made ready for the controller: the CRDs and the
    controller's ServiceAccount and ClusterRole, exactly as manifests/ ship them."""
    cp.kubectl_run("apply", "--server-side", "-f", str(ROOT / "manifests" / "base" / "crds"))
    cp.kubectl_run("wait", "--for=condition=Established", "--timeout=60s",
                   "crd/deathwatches.deathwatch.dev", "crd/sandboxverdicts.deathwatch.dev")  # fmt: skip
    cp.kubectl_run("create", "namespace", "deathwatch-system")
    for role in ("controller.yaml", "metrics-reader.yaml"):
        cp.kubectl_run("apply", "-f", str(ROOT / "manifests" / "base" / "rbac" / role))


@contextlib.contextmanager
def audited(
    name: str, results: dict[str, Any], **options: Any
) -> Iterator[controlplane.ControlPlane]:
    """A module's own control plane with an audit log of every write, made ready for the
    controller (`prepare`); the module's measurements printed when it ends."""
    from tests.conftest import _binaries_or_skip

    _binaries_or_skip()
    c = controlplane.ControlPlane(Path(tempfile.mkdtemp(prefix="deathwatch-cp-")), audit=True,
                                  **options)  # fmt: skip
    c.start()
    try:
        prepare(c)
        yield c
    finally:
        c.destroy()
        print(f"\n{name} measurements:", json.dumps(results, indent=1))


def admin_api(cp: controlplane.ControlPlane) -> client.ApiClient:
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration)


def ready_status(script: SandboxScript) -> dict[str, Any]:
    """The status kubelet writes once the sandbox is Ready."""
    for m in timeline(script):
        if m.status and any(
            c["type"] == "Ready" and c["status"] == "True" for c in m.status["conditions"]
        ):
            return m.status
    raise AssertionError("script never becomes Ready")


def fate_status(script: SandboxScript) -> dict[str, Any]:
    """The last status of the script (its fate)."""
    statuses = [m.status for m in timeline(script) if m.status is not None]
    return statuses[-1]


class Env:
    """One test's namespace: the kubelet player, the API, and the controller process."""

    def __init__(
        self, cp: controlplane.ControlPlane, api: client.ApiClient, namespace: str, tmp: Path
    ) -> None:
        self.cp = cp
        self.api = api
        self.ns = namespace
        self.tmp = tmp
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.kubelet = Kubelet(api)
        self.controller: ControllerProcess | None = None
        self.kubeconfig = tmp / "controller.kubeconfig"
        self.forbidden_expected = False
        self.server: str | None = None  # the controller's way to the API (a proxy), if not direct
        self._reader: str | None = None

    def bind_controller(self) -> None:
        rbac = client.RbacAuthorizationV1Api(self.api)
        rbac.create_namespaced_role_binding(
            self.ns,
            {
                "metadata": {"name": "deathwatch-controller"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "deathwatch-controller",
                },
                "subjects": [
                    {
                        "kind": "ServiceAccount",
                        "name": "deathwatch-controller",
                        "namespace": "deathwatch-system",
                    }
                ],
            },
            _request_timeout=30,
        )
        service_account_kubeconfig(
            self.cp,
            self.api,
            "deathwatch-system",
            "deathwatch-controller",
            self.kubeconfig,
            server=self.server,
        )

    @property
    def reader_token(self) -> str:
        """A token that may read the controller's metrics and /readyz (a Prometheus's)."""
        if self._reader is None:
            self._reader = metrics_reader_token(self.api)
        return self._reader

    def start_controller(
        self,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
        open_files: tuple[int, int] | None = None,
    ) -> ControllerProcess:
        self.controller = ControllerProcess(
            self.kubeconfig, [self.ns], self.tmp / "controller.log", extra=extra, env=env,
            reader_token=self.reader_token, open_files=open_files,
        ).start()  # fmt: skip
        return self.controller

    def deathwatch(self, name: str = "sandboxes", **spec: Any) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DeathWatch",
            "metadata": {"name": name},
            "spec": {
                "podSelector": {"matchLabels": {"app": "sandbox"}},
                "agentPorts": [49983],
                **spec,
            },
        }
        self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.ns, "deathwatches", body, _request_timeout=30
        )

    def sv(self, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.ns, "sandboxverdicts", name, _request_timeout=10
            )
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def dw(self, name: str = "sandboxes") -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.ns, "deathwatches", name, _request_timeout=10
        )
        return obj

    def wait_state(self, name: str, state: str, timeout: float = 20) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            sv = self.sv(name)
            return sv if sv and (sv.get("status") or {}).get("state") == state else None

        try:
            return wait_for(
                probe, timeout=timeout, what=f"SandboxVerdict {self.ns}/{name} state {state}"
            )
        except AssertionError:
            if self.controller is not None:
                print(self.controller.tail())
            raise

    def script(self, name: str, **kw: Any) -> SandboxScript:
        kw.setdefault("start", datetime.now(UTC).replace(microsecond=0))  # the API keeps seconds
        return SandboxScript(name=name, namespace=self.ns, **kw)

    def create(self, script: SandboxScript) -> str:
        return self.kubelet.create(script)

    def alive_sandboxes(
        self, n: int, prefix: str, first_exit_code: int, timeout: float = 30, **kw: Any
    ) -> list[SandboxScript]:
        """n sandboxes that will exit (each with its own code), made Ready, judged Alive."""
        scripts = [self.script(f"{prefix}-{i}", fate=Fate.EXITS, exit_code=first_exit_code + i,
                               **kw) for i in range(n)]  # fmt: skip
        for s in scripts:
            self.create(s)
            self.kubelet.status(self.ns, s.name, ready_status(s))
        for s in scripts:
            self.wait_state(s.name, "Alive", timeout=timeout)
        return scripts

    def moments(self, script: SandboxScript) -> list[Any]:
        return timeline(script)

    def events(self, pod: str, reason: str) -> list[Any]:
        items = self.core.list_namespaced_event(
            self.ns,
            field_selector=f"involvedObject.name={pod},reason={reason}",
            _request_timeout=10,
        ).items
        return list(items)

    def forbidden_calls(self) -> float:
        return (
            self.controller.metric("deathwatch_api_errors_total", code="403")
            if self.controller
            else 0.0
        )


class VerdictRecorder:
    """Every state each SandboxVerdict of the namespace goes through, seen on a watch of its
    own (relisting after any break), to prove no verdict is ever taken back."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.ns = namespace
        self.seen: dict[str, list[tuple[str | None, str | None]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _note(self, obj: dict[str, Any]) -> None:
        status = obj.get("status") or {}
        entry = (status.get("podUID"), status.get("state"))
        history = self.seen.setdefault(obj["metadata"]["name"], [])
        if not history or history[-1] != entry:
            history.append(entry)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listed = self.custom.list_namespaced_custom_object(
                    GROUP, VERSION, self.ns, "sandboxverdicts", _request_timeout=10
                )
                for obj in listed["items"]:
                    self._note(obj)
                stream = watch.Watch().stream(
                    self.custom.list_namespaced_custom_object, GROUP, VERSION, self.ns,
                    "sandboxverdicts", resource_version=listed["metadata"]["resourceVersion"],
                    timeout_seconds=5, _request_timeout=10,
                )  # fmt: skip
                for event in stream:
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._note(event["object"])
                    if self._stop.is_set():
                        return
            except Exception:  # the apiserver restarts in one case: relist and carry on
                self._stop.wait(0.5)

    def start(self) -> VerdictRecorder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def taken_back(self) -> list[str]:
        out = []
        for name, history in self.seen.items():
            for (uid, state), (later_uid, later_state) in itertools.pairwise(history):
                if state == "Dead" and later_uid == uid and later_state != "Dead":
                    out.append(f"{name}: {history}")
        return out


class Recording:
    """The pod watch of a namespace as `kubectl get pods --watch --output-watch-events -o json`
    writes it (what a user hands `deathwatch replay`), into `path`. With DEATHWATCH_RECORD_DIR
    set, `keep(name)` copies it there: how tests/data's recordings of real components are
    made."""

    def __init__(self, cp: controlplane.ControlPlane, namespace: str, path: Path) -> None:
        self.path = path
        self._out = path.open("wb")
        self._proc = subprocess.Popen(
            [str(cp.kubectl), f"--kubeconfig={cp.kubeconfig}", "get", "pods", "-n", namespace,
             "--watch", "--output-watch-events", "-o", "json"],
            stdout=self._out, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def stop(self) -> Path:
        if self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(10)
        self._out.close()
        return self.path

    def keep(self, name: str) -> None:
        target = os.environ.get("DEATHWATCH_RECORD_DIR")
        if target:
            shutil.copyfile(self.stop(), Path(target) / name)
