"""Concise Pod dicts for unit tests, shaped as the API serves them."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from deathwatch._engine.timeutil import UTC, format_time

T0 = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ts(seconds: float) -> str:
    return format_time(at(seconds)) or ""


def running(
    name: str = "agent",
    since: float = 1,
    restarts: int = 0,
    ready: bool = True,
    last: dict[str, Any] | None = None,
    cid: str | None = None,
) -> dict[str, Any]:
    """`cid`: the instance's runtime id (containerStatuses[].containerID)."""
    return {
        "name": name,
        "ready": ready,
        "restartCount": restarts,
        "state": {"running": {"startedAt": ts(since)}},
        "lastState": {"terminated": last} if last else {},
        **({"containerID": cid} if cid else {}),
    }


def terminated(
    name: str = "agent",
    code: int = 1,
    reason: str = "Error",
    started: float = 1,
    finished: float = 50,
    restarts: int = 0,
    cid: str | None = None,
) -> dict[str, Any]:
    return {
        "name": name,
        "ready": False,
        "restartCount": restarts,
        "state": {
            "terminated": {
                "exitCode": code,
                "reason": reason,
                "startedAt": ts(started),
                "finishedAt": ts(finished),
            }
        },
        "lastState": {},
        **({"containerID": cid} if cid else {}),
    }


def termination(
    code: int = 2, reason: str = "Error", started: float = 1, finished: float = 40
) -> dict[str, Any]:
    return {
        "exitCode": code,
        "reason": reason,
        "startedAt": ts(started),
        "finishedAt": ts(finished),
    }


def waiting(name: str = "agent", reason: str = "ContainerCreating") -> dict[str, Any]:
    return {
        "name": name,
        "ready": False,
        "restartCount": 0,
        "state": {"waiting": {"reason": reason}},
    }


def exec_probe(period: int = 10, threshold: int = 3, timeout: int = 1) -> dict[str, Any]:
    return {
        "exec": {"command": ["true"]},
        "periodSeconds": period,
        "failureThreshold": threshold,
        "timeoutSeconds": timeout,
    }


def tcp_probe(port: int | str = "agent") -> dict[str, Any]:
    return {"tcpSocket": {"port": port}}


def pod(
    *,
    uid: str = "uid-1",
    name: str = "sbx-1",
    namespace: str = "sandboxes",
    ready: bool | None = True,
    ready_at: float = 2,
    phase: str = "Running",
    reason: str | None = None,
    containers: list[dict[str, Any]] | None = None,
    probe: dict[str, Any] | None = None,
    deletion_at: float | None = None,
    grace: int = 30,
    labels: dict[str, str] | None = None,
    created: float = 0,
    node: str | None = None,
    disruption: tuple[str, str, float] | None = None,
    disruption_status: str = "True",
    message: str | None = None,
    restart_policy: str | None = None,
    own_restart_rules: bool = False,
    spec_containers: list[str] | None = None,
    sidecars: list[dict[str, Any]] | None = None,
    ready_reason: str | None = None,
    rules: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A Pod; `deletion_at` is when deletion was requested (the API stores it + grace);
    `disruption` is a DisruptionTarget condition (reason, message, when it was set);
    `own_restart_rules`: its container has a restart policy of its own and rules
    (ContainerRestartRules); `spec_containers`: more containers' names beside `agent`;
    `sidecars`: native sidecars' statuses (each an init container with restartPolicy Always,
    and a regular init container `setup` before them); `ready_reason`: the Ready condition's;
    `rules`: a container's own {restartPolicy, restartPolicyRules} by name."""
    spec_container: dict[str, Any] = {
        "name": "agent",
        "image": "agent:1",
        "ports": [
            {"name": "agent", "containerPort": 49983},
            {"name": "http", "containerPort": 8080},
        ],
    }
    if probe is not None:
        spec_container["readinessProbe"] = probe
    if own_restart_rules:
        spec_container["restartPolicy"] = "Never"
        spec_container["restartPolicyRules"] = [
            {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}
        ]
    meta: dict[str, Any] = {
        "uid": uid,
        "name": name,
        "namespace": namespace,
        "labels": labels if labels is not None else {"app": "sandbox"},
        "creationTimestamp": ts(created),
    }
    if deletion_at is not None:
        meta["deletionTimestamp"] = ts(deletion_at + grace)
        meta["deletionGracePeriodSeconds"] = grace
    status: dict[str, Any] = {"phase": phase}
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    if ready is not None:
        status["conditions"] = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(created)},
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "lastTransitionTime": ts(ready_at),
                **({"reason": ready_reason} if ready_reason else {}),
            },
        ]
    if disruption is not None:
        why, said, since = disruption
        status.setdefault("conditions", []).append(
            {
                "type": "DisruptionTarget",
                "status": disruption_status,
                "reason": why,
                "message": said,
                "lastTransitionTime": ts(since),
            }
        )
    status["containerStatuses"] = containers if containers is not None else [running()]
    spec: dict[str, Any] = {
        "containers": [
            spec_container,
            *({"name": n, "image": "x:1"} for n in spec_containers or ()),
        ],
        **({"nodeName": node} if node else {}),
        **({"restartPolicy": restart_policy} if restart_policy else {}),
    }
    for c in spec["containers"]:
        c.update((rules or {}).get(c["name"], {}))
    if sidecars is not None:
        setup = terminated(name="setup", code=0, reason="Completed", finished=0.5)
        status["initContainerStatuses"] = [setup, *sidecars]
        spec["initContainers"] = [
            {"name": "setup", "image": "x:1"},
            *({"name": c["name"], "image": "x:1", "restartPolicy": "Always"} for c in sidecars),
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}
