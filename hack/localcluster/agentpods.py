"""Pods of the test agent image (images.AGENT, busybox): sandboxes that listen on the agent
port, or clients of one. Each is steered through files in its /ctl directory, a hostPath the
caller writes from the host (images.py says which files), so no kubectl exec is needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hack.localcluster import images

AGENT_PORT, OTHER_PORT = 49983, 8080
EXEC_PROBE = {"exec": {"command": ["/bin/ready"]}, "periodSeconds": 1, "failureThreshold": 1,
              "timeoutSeconds": 1}  # fmt: skip  # W = multiplier x (1 x 1 s + 1 s)
TCP_PROBE = {"tcpSocket": {"port": "agent"}, "periodSeconds": 1}  # kubelet probes from the host


def agent_pod(
    name: str,
    ctl: Path,
    *,
    node: str | None = None,
    probe: dict[str, Any] | None = None,
    target: str | None = None,
    host_network: bool = False,
    labels: dict[str, str] | None = None,
    memory: str = "32Mi",
    runtime_class: str | None = None,
) -> dict[str, Any]:
    """A sandbox (listening on the agent port and another), or with `target` ("ip:port") a
    client that tries to connect every 0.2 s and writes the outcome to /ctl/result.
    `node` pins it (no scheduler); the node's ctl directory is mounted at /ctl;
    `runtime_class` runs it under that RuntimeClass (gvisor: node.py)."""
    container: dict[str, Any] = {
        "name": "agent",
        "image": images.AGENT,
        "imagePullPolicy": "Never",
        "ports": [
            {"name": "agent", "containerPort": AGENT_PORT},
            {"name": "http", "containerPort": OTHER_PORT},
        ],
        "volumeMounts": [{"name": "ctl", "mountPath": "/ctl"}],
        "resources": {"limits": {"memory": memory}, "requests": {"memory": "8Mi", "cpu": "10m"}},
    }
    if probe:
        container["readinessProbe"] = probe
    if target:
        container["env"] = [{"name": "TARGET", "value": target}]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 2,
        "automountServiceAccountToken": False,
        "hostNetwork": host_network,
        "containers": [container],
        "volumes": [{"name": "ctl", "hostPath": {"path": str(ctl), "type": "Directory"}}],
    }
    if node is not None:
        spec["nodeName"] = node
    if runtime_class is not None:
        spec["runtimeClassName"] = runtime_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels if labels is not None else {"app": "sandbox"}},
        "spec": spec,
    }
