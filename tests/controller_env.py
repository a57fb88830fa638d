"""The controller under test: a namespace, the kubelet player, the API, and the controller
process running under its ServiceAccount token with the RBAC from manifests/. Shared by the
control-plane lane (test_controller.py) and the node lane (test_node.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from hack.localcluster import controlplane
from hack.localcluster.controller_process import ControllerProcess, service_account_kubeconfig
from hack.localcluster.kubelet import Kubelet
from hack.localcluster.sandbox_script import SandboxScript, timeline
from tests.kube import wait_for

ROOT = Path(__file__).resolve().parent.parent
GROUP, VERSION = "deathwatch.dev", "v1alpha1"


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

    def start_controller(
        self, extra: list[str] | None = None, env: dict[str, str] | None = None
    ) -> ControllerProcess:
        self.controller = ControllerProcess(
            self.kubeconfig, [self.ns], self.tmp / "controller.log", extra=extra, env=env
        ).start()
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
