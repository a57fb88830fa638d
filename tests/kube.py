"""Helpers for tests on the real control plane: explicit waits with deadlines, and kubelet's
side of pod status (the tests play kubelet by writing pods/status)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    pass


def wait_for(
    probe: Callable[[], T | None],
    *,
    timeout: float = 30,
    interval: float = 0.05,
    what: str = "condition",
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll `probe` until it returns a truthy value, or fail after `timeout` seconds naming
    `what` and the last value seen. Never a bare sleep-and-hope."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = probe()
        except ignore as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise WaitTimeout(
                f"timed out after {timeout}s waiting for {what}; last: {last!r}"[:2000]
            )
        time.sleep(interval)


def fresh_namespace(api: Any, name: str) -> None:
    """A namespace whose default ServiceAccount exists: the ServiceAccount admission plugin
    refuses a pod (403) until kube-controller-manager has made it, which can take seconds."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name}}, _request_timeout=30)
    wait_for(lambda: core.read_namespaced_service_account("default", name, _request_timeout=10),
             what=f"ServiceAccount {name}/default", ignore=(client.ApiException,))  # fmt: skip


def pod_body(
    name: str,
    labels: dict[str, str] | None = None,
    probe: dict[str, Any] | None = None,
    node: str = "node-1",
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "agent",
        "image": "deathwatch.local/agent:demo",
        "imagePullPolicy": "Never",
    }
    if probe:
        container["readinessProbe"] = probe
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": "sandbox"}},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [container],
        },
    }
