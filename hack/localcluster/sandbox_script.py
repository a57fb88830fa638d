"""Scripted sandbox lives: the pod a platform creates and the statuses a kubelet would write.

One source for three consumers: the demo (plays kubelet against a real API server), test
recordings and the replay benchmark (rendered as `kubectl get pods --watch` events). The
statuses follow what kubelet 1.35 writes: Ready and ContainersReady conditions, container
states with exit codes and reasons, phase, and for deletions the deletionTimestamp the API
sets (request time + grace period).
"""

from __future__ import annotations

import copy
import heapq
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from deathwatch._engine.timeutil import UTC, format_time

ProbeStyle = Literal["none", "exec", "tcp"]
AGENT_PORT = 49983
OTHER_PORT = 8080
GRACE_SECONDS = 30


class Fate(StrEnum):
    LIVES = "lives"  # runs to the end of the script
    EXITS = "exits"  # its container exits with `exit_code`
    OOM = "oom"  # OOMKilled, exit 137
    EVICTED = "evicted"  # kubelet eviction under node pressure
    DELETED = "deleted"  # the platform deletes it while it runs: not a death
    COMPLETES = "completes"  # its container exits 0, pod Succeeded: not a death
    FLAPS = "flaps"  # exec probe fails briefly `flaps` times, recovers within the window
    HANGS = "hangs"  # exec probe fails and never recovers: Unresponsive
    RESTARTS = "restarts"  # restartPolicy Always: the container crashes and comes back
    NODE_LOST = "node-lost"  # the node controller takes Ready away, kubelet silent


@dataclass(frozen=True)
class SandboxScript:
    name: str
    namespace: str = "sandboxes"
    probe: ProbeStyle = "none"
    fate: Fate = Fate.LIVES
    start: datetime = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
    life: timedelta = timedelta(seconds=60)  # time from Ready to its fate
    exit_code: int = 1
    flaps: int = 1
    flap_length: timedelta = timedelta(seconds=20)
    labels: dict[str, str] = field(default_factory=lambda: {"app": "sandbox"})
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    node: str = "node-1"
    period_seconds: int = 10
    failure_threshold: int = 3
    timeout_seconds: int = 1

    @property
    def restart_policy(self) -> str:
        return "Always" if self.fate is Fate.RESTARTS else "Never"


@dataclass(frozen=True)
class Moment:
    """One thing that happens to the pod, `at` after the script's start."""

    at: timedelta
    kind: Literal["status", "delete-request", "deleted"]
    status: dict[str, Any] | None = None


def pod_manifest(
    script: SandboxScript, image: str = "deathwatch.local/agent:demo"
) -> dict[str, Any]:
    """The Pod a platform would create (metadata + spec), bound to its node."""
    container: dict[str, Any] = {
        "name": "agent",
        "image": image,
        "imagePullPolicy": "Never",
        "ports": [
            {"name": "agent", "containerPort": AGENT_PORT, "protocol": "TCP"},
            {"name": "http", "containerPort": OTHER_PORT, "protocol": "TCP"},
        ],
        "resources": {"limits": {"memory": "64Mi"}, "requests": {"memory": "16Mi", "cpu": "10m"}},
    }
    timing = {
        "periodSeconds": script.period_seconds,
        "failureThreshold": script.failure_threshold,
        "timeoutSeconds": script.timeout_seconds,
    }
    if script.probe == "exec":
        container["readinessProbe"] = {"exec": {"command": ["/bin/agent-ready"]}, **timing}
    elif script.probe == "tcp":
        container["readinessProbe"] = {"tcpSocket": {"port": "agent"}, **timing}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": script.name,
            "namespace": script.namespace,
            "labels": dict(script.labels),
        },
        "spec": {
            "nodeName": script.node,
            "restartPolicy": script.restart_policy,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": GRACE_SECONDS,
            "containers": [container],
        },
    }


def _t(script: SandboxScript, at: timedelta) -> str:
    return format_time(script.start + at) or ""


def _conditions(
    script: SandboxScript, ready: bool, ready_at: timedelta, base: timedelta
) -> list[dict[str, Any]]:
    def cond(kind: str, status: bool, at: timedelta, reason: str | None = None) -> dict[str, Any]:
        c: dict[str, Any] = {
            "type": kind,
            "status": "True" if status else "False",
            "lastProbeTime": None,
            "lastTransitionTime": _t(script, at),
        }
        if reason:
            c["reason"] = reason
        return c

    not_ready = None if ready else "ContainersNotReady"
    return [
        cond("PodReadyToStartContainers", True, base),
        cond("Initialized", True, timedelta(0)),
        cond("Ready", ready, ready_at, not_ready),
        cond("ContainersReady", ready, ready_at, not_ready),
        cond("PodScheduled", True, timedelta(0)),
    ]


def _container(
    script: SandboxScript,
    *,
    state: dict[str, Any],
    ready: bool,
    restart_count: int = 0,
    last_state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "name": "agent",
        "image": "deathwatch.local/agent:demo",
        "imageID": "",
        "containerID": f"containerd://{script.uid.replace('-', '')}",
        "ready": ready,
        "started": "running" in state,
        "restartCount": restart_count,
        "state": state,
        "lastState": last_state or {},
    }


def _status(
    script: SandboxScript,
    *,
    phase: str,
    ready: bool,
    ready_at: timedelta,
    container: dict[str, Any],
    reason: str | None = None,
    message: str | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": _conditions(script, ready, ready_at, timedelta(seconds=1)),
        "containerStatuses": [container],
        "hostIP": "10.0.0.1",
        "podIP": "10.244.0.10",
        "qosClass": "Burstable",
        "startTime": _t(script, timedelta(0)),
    }
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    return status


def _terminated(
    script: SandboxScript, code: int, reason: str, started: timedelta, at: timedelta
) -> dict[str, Any]:
    return {
        "terminated": {
            "exitCode": code,
            "reason": reason,
            "startedAt": _t(script, started),
            "finishedAt": _t(script, at),
            "containerID": f"containerd://{script.uid.replace('-', '')}",
        }
    }


def timeline(script: SandboxScript) -> list[Moment]:
    """What happens to the pod, in order. The last Moment is its end (or the script's)."""
    started = timedelta(seconds=1)
    running = {"running": {"startedAt": _t(script, started)}}
    # With no probe, Ready follows the container start; a probe passes one period later.
    ready_at = (
        started if script.probe == "none" else started + timedelta(seconds=script.period_seconds)
    )
    moments = [
        Moment(
            started,
            "status",
            _status(
                script,
                phase="Running",
                ready=script.probe == "none",
                ready_at=started,
                container=_container(script, state=running, ready=script.probe == "none"),
            ),
        )
    ]
    if script.probe != "none":
        moments.append(
            Moment(
                ready_at,
                "status",
                _status(
                    script,
                    phase="Running",
                    ready=script.probe == "exec",  # a tcp probe on the agent port is refused
                    ready_at=ready_at if script.probe == "exec" else started,
                    container=_container(script, state=running, ready=script.probe == "exec"),
                ),
            )
        )
    if script.probe == "tcp":
        ready_at = started  # never Ready: no later transition
    end = ready_at + script.life
    fate = script.fate

    def alive(at: timedelta, ready: bool, container_ready: bool | None = None) -> dict[str, Any]:
        return _status(
            script,
            phase="Running",
            ready=ready,
            ready_at=at,
            container=_container(
                script, state=running, ready=ready if container_ready is None else container_ready
            ),
        )

    if fate in (Fate.EXITS, Fate.OOM, Fate.COMPLETES):
        code, reason = {
            Fate.EXITS: (script.exit_code, "Error" if script.exit_code else "Completed"),
            Fate.OOM: (137, "OOMKilled"),
            Fate.COMPLETES: (0, "Completed"),
        }[fate]
        phase = "Succeeded" if code == 0 else "Failed"
        moments.append(
            Moment(
                end,
                "status",
                _status(
                    script,
                    phase=phase,
                    ready=False,
                    ready_at=end,
                    container=_container(
                        script, state=_terminated(script, code, reason, started, end), ready=False
                    ),
                ),
            )
        )
    elif fate is Fate.EVICTED:
        moments.append(
            Moment(
                end,
                "status",
                _status(
                    script,
                    phase="Failed",
                    ready=False,
                    ready_at=end,
                    reason="Evicted",
                    message="The node was low on resource: memory.",
                    container=_container(
                        script, state=_terminated(script, 137, "Error", started, end), ready=False
                    ),
                ),
            )
        )
    elif fate is Fate.DELETED:
        moments.append(Moment(end, "delete-request"))
        stop = end + timedelta(seconds=1)
        moments.append(
            Moment(
                stop,
                "status",
                _status(
                    script,
                    phase="Failed",
                    ready=False,
                    ready_at=stop,
                    container=_container(
                        script, state=_terminated(script, 143, "Error", started, stop), ready=False
                    ),
                ),
            )
        )
        moments.append(Moment(stop + timedelta(seconds=1), "deleted"))
    elif fate is Fate.FLAPS:
        at = ready_at
        for _ in range(script.flaps):
            at = at + script.life / (script.flaps + 1)
            moments.append(Moment(at, "status", alive(at, ready=False)))
            back = at + script.flap_length
            moments.append(Moment(back, "status", alive(back, ready=True)))
            at = back
    elif fate is Fate.HANGS:
        moments.append(Moment(end, "status", alive(end, ready=False)))
    elif fate is Fate.RESTARTS:
        crash = end
        back = end + timedelta(seconds=2)
        moments.append(
            Moment(
                back,
                "status",
                _status(
                    script,
                    phase="Running",
                    ready=True,
                    ready_at=back,
                    container=_container(
                        script,
                        state={"running": {"startedAt": _t(script, back)}},
                        ready=True,
                        restart_count=1,
                        last_state=_terminated(script, 2, "Error", started, crash),
                    ),
                ),
            )
        )
    elif fate is Fate.NODE_LOST:
        # MarkPodsNotReady: only the Ready condition flips; containers stay "ready"
        moments.append(Moment(end, "status", alive(end, ready=False, container_ready=True)))
    return moments


def watch_events(
    script: SandboxScript,
) -> Iterator[tuple[datetime, dict[str, Any]]]:
    """The script as `kubectl get pods --watch --output-watch-events -o json` would show it."""
    pod = pod_manifest(script)
    meta = pod["metadata"]
    meta.update(uid=script.uid, creationTimestamp=_t(script, timedelta(0)))
    pod["status"] = {"phase": "Pending", "qosClass": "Burstable", "conditions": []}

    def emit(kind: str, at: timedelta) -> tuple[datetime, dict[str, Any]]:
        return script.start + at, {"type": kind, "object": copy.deepcopy(pod)}

    yield emit("ADDED", timedelta(0))
    for m in timeline(script):
        if m.kind == "status":
            pod["status"] = m.status
            yield emit("MODIFIED", m.at)
        elif m.kind == "delete-request":
            meta["deletionTimestamp"] = _t(script, m.at + timedelta(seconds=GRACE_SECONDS))
            meta["deletionGracePeriodSeconds"] = GRACE_SECONDS
            yield emit("MODIFIED", m.at)
        else:
            yield emit("DELETED", m.at)


def recording(scripts: Iterable[SandboxScript]) -> Iterator[dict[str, Any]]:
    """Many scripts' watch events interleaved in time order, one resourceVersion sequence."""
    streams = [watch_events(s) for s in scripts]
    for rv, (_, event) in enumerate(heapq.merge(*streams, key=lambda item: item[0]), start=1000):
        event["object"]["metadata"]["resourceVersion"] = str(rv)
        yield event
