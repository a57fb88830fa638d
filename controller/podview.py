"""The facts of a Pod object that a verdict depends on, read leniently from API dicts.

Everything downstream (engine, policies, replay, operator) sees a `PodView`, never the raw
dict, so the rules about odd input live in one place: a missing optional field takes the
API's default; a field of the wrong type or an unparseable timestamp makes the whole object
`MalformedPod`, naming the field path and the value, so that callers can count it as skipped
and say why instead of crashing or guessing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from controller.timeutil import parse_time

ProbeKind = Literal["exec", "tcpSocket", "httpGet", "grpc", "unknown"]
NETWORK_PROBES: Final = frozenset({"tcpSocket", "httpGet", "grpc"})

# Kubernetes defaults for a probe's timing fields (core/v1 Probe).
DEFAULT_FAILURE_THRESHOLD: Final = 3
DEFAULT_PERIOD_SECONDS: Final = 10
DEFAULT_TIMEOUT_SECONDS: Final = 1
DEFAULT_GRACE_SECONDS: Final = 30


class MalformedPod(ValueError):
    """A Pod object with a field of the wrong type or an invalid value."""

    def __init__(self, field: str, value: object, expected: str) -> None:
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"{field}: expected {expected}, got {shown}")
        self.field = field
        self.value = value


@dataclass(frozen=True, slots=True)
class Termination:
    """A container's terminated state: the evidence a death verdict carries."""

    exit_code: int | None
    reason: str | None
    started_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class ContainerView:
    name: str
    running_since: datetime | None
    terminated: Termination | None
    last_termination: Termination | None
    waiting_reason: str | None
    restart_count: int
    ready: bool


@dataclass(frozen=True, slots=True)
class ProbeView:
    """A container's readinessProbe: its handler kind, target port and timing."""

    container: str
    kind: ProbeKind
    port: int | str | None
    failure_threshold: int
    period_seconds: int
    timeout_seconds: int

    @property
    def failing_for(self) -> timedelta:
        """How long a healthy container's probe can fail before kubelet marks it not ready."""
        return timedelta(
            seconds=self.failure_threshold * self.period_seconds + self.timeout_seconds
        )


@dataclass(frozen=True, slots=True)
class PodView:
    uid: str
    namespace: str
    name: str
    labels: Mapping[str, str]
    phase: str | None
    reason: str | None
    # Ready condition: status as written ("True", "False", "Unknown") or None when absent.
    ready_status: str | None
    ready_reason: str | None
    ready_changed_at: datetime | None
    # When deletion was requested: deletionTimestamp minus the grace period, because the
    # API writes deletionTimestamp as the deadline by which the pod must be gone.
    deletion_requested_at: datetime | None
    node_name: str | None
    containers: tuple[ContainerView, ...]
    readiness_probes: tuple[ProbeView, ...]
    container_ports: Mapping[str, int]
    # The latest instant the object itself proves has passed (replay's clock).
    latest_time: datetime | None

    @property
    def ready(self) -> bool:
        return self.ready_status == "True"

    @property
    def deleting(self) -> bool:
        return self.deletion_requested_at is not None

    @property
    def node_lost(self) -> bool:
        """The node controller, not the kubelet, took Ready away: the kubelet went silent.

        The node lifecycle controller flips only the pod's Ready condition (MarkPodsNotReady)
        and leaves containerStatuses as the kubelet last wrote them, ready and running; the
        kubelet itself always writes both together. It also sets reason NodeLost when it
        gives up on the pod.
        """
        if self.reason == "NodeLost":
            return True
        return (
            self.ready_status is not None
            and self.ready_status != "True"
            and bool(self.containers)
            and all(c.ready and c.running_since is not None for c in self.containers)
        )

    def restart_counts(self) -> dict[str, int]:
        return {c.name: c.restart_count for c in self.containers}

    def probe_port_number(self, probe: ProbeView) -> int | None:
        """The numeric port a network probe targets, resolving named container ports."""
        if isinstance(probe.port, int):
            return probe.port
        if isinstance(probe.port, str):
            if probe.port.isdigit():
                return int(probe.port)
            return self.container_ports.get(probe.port)
        return None


# --- reading helpers: each names the field path it reads --------------------------------


def _obj(parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise MalformedPod(f"{path}.{key}", value, "an object")
    return value


def _list(parent: Mapping[str, Any], key: str, path: str) -> list[Any]:
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedPod(f"{path}.{key}", value, "a list")
    return value


def _str(parent: Mapping[str, Any], key: str, path: str) -> str | None:
    value = parent.get(key)
    if value is None or isinstance(value, str):
        return value
    raise MalformedPod(f"{path}.{key}", value, "a string")


def _int(parent: Mapping[str, Any], key: str, path: str, default: int | None = None) -> int | None:
    value = parent.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedPod(f"{path}.{key}", value, "an integer")
    return value


def _time(parent: Mapping[str, Any], key: str, path: str) -> datetime | None:
    value = parent.get(key)
    if value is None:
        return None
    parsed = parse_time(value)
    if parsed is None:
        raise MalformedPod(f"{path}.{key}", value, "an RFC 3339 timestamp")
    return parsed


def _termination(state: Mapping[str, Any], path: str) -> Termination | None:
    term = state.get("terminated")
    if term is None:
        return None
    if not isinstance(term, Mapping):
        raise MalformedPod(f"{path}.terminated", term, "an object")
    p = f"{path}.terminated"
    return Termination(
        exit_code=_int(term, "exitCode", p),
        reason=_str(term, "reason", p),
        started_at=_time(term, "startedAt", p),
        finished_at=_time(term, "finishedAt", p),
    )


def _later(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None:
        return b
    if b is None or a >= b:
        return a
    return b


def _probe(container: Mapping[str, Any], path: str) -> ProbeView | None:
    probe = container.get("readinessProbe")
    if probe is None:
        return None
    p = f"{path}.readinessProbe"
    if not isinstance(probe, Mapping):
        raise MalformedPod(p, probe, "an object")
    kind: ProbeKind = "unknown"
    port: int | str | None = None
    for handler in ("exec", "tcpSocket", "httpGet", "grpc"):
        spec = probe.get(handler)
        if spec is not None:
            if not isinstance(spec, Mapping):
                raise MalformedPod(f"{p}.{handler}", spec, "an object")
            kind = handler
            raw_port = spec.get("port")
            if raw_port is not None and (
                isinstance(raw_port, bool) or not isinstance(raw_port, int | str)
            ):
                raise MalformedPod(f"{p}.{handler}.port", raw_port, "a port number or name")
            port = raw_port
            break
    return ProbeView(
        container=_str(container, "name", path) or "",
        kind=kind,
        port=port,
        failure_threshold=_int(probe, "failureThreshold", p, DEFAULT_FAILURE_THRESHOLD)
        or DEFAULT_FAILURE_THRESHOLD,
        period_seconds=_int(probe, "periodSeconds", p, DEFAULT_PERIOD_SECONDS)
        or DEFAULT_PERIOD_SECONDS,
        timeout_seconds=_int(probe, "timeoutSeconds", p, DEFAULT_TIMEOUT_SECONDS)
        or DEFAULT_TIMEOUT_SECONDS,
    )


def read_pod(obj: object) -> PodView:
    """Read a Pod dict as served by the API. Raises MalformedPod, and nothing else."""
    if not isinstance(obj, Mapping):
        raise MalformedPod("object", obj, "a Pod object")
    try:
        return _read_pod(obj)
    except MalformedPod:
        raise
    except (TypeError, ValueError, AttributeError, OverflowError) as exc:  # pragma: no cover
        # Defence in depth: a shape the readers above did not foresee is still "malformed".
        raise MalformedPod("object", type(exc).__name__, "a readable Pod") from exc


def _read_pod(obj: Mapping[str, Any]) -> PodView:
    kind = obj.get("kind")
    if kind is not None and kind != "Pod":
        raise MalformedPod("kind", kind, '"Pod"')
    meta = _obj(obj, "metadata", "")
    spec = _obj(obj, "spec", "")
    status = _obj(obj, "status", "")

    uid = _str(meta, "uid", "metadata")
    if not uid:
        raise MalformedPod("metadata.uid", meta.get("uid"), "a non-empty uid")
    name = _str(meta, "name", "metadata")
    if not name:
        raise MalformedPod("metadata.name", meta.get("name"), "a non-empty name")
    namespace = _str(meta, "namespace", "metadata") or "default"
    labels = _obj(meta, "labels", "metadata")
    for key, value in labels.items():
        if not isinstance(value, str):
            raise MalformedPod(f"metadata.labels.{key}", value, "a string")

    latest = _time(meta, "creationTimestamp", "metadata")
    deletion = _time(meta, "deletionTimestamp", "metadata")
    deletion_requested_at = None
    if deletion is not None:
        grace = _int(meta, "deletionGracePeriodSeconds", "metadata", DEFAULT_GRACE_SECONDS)
        deletion_requested_at = deletion - timedelta(seconds=grace or 0)
        latest = _later(latest, deletion_requested_at)

    ready_status = ready_reason = None
    ready_changed_at = None
    for i, cond in enumerate(_list(status, "conditions", "status")):
        path = f"status.conditions[{i}]"
        if not isinstance(cond, Mapping):
            raise MalformedPod(path, cond, "an object")
        changed = _time(cond, "lastTransitionTime", path)
        latest = _later(latest, changed)
        if cond.get("type") == "Ready":
            ready_status = _str(cond, "status", path)
            ready_reason = _str(cond, "reason", path)
            ready_changed_at = changed

    containers = []
    for i, cs in enumerate(_list(status, "containerStatuses", "status")):
        path = f"status.containerStatuses[{i}]"
        if not isinstance(cs, Mapping):
            raise MalformedPod(path, cs, "an object")
        state = _obj(cs, "state", path)
        running = _obj(state, "running", f"{path}.state")
        running_since = _time(running, "startedAt", f"{path}.state.running")
        if "running" in state and running_since is None:
            running_since = latest  # running, start unknown: at least as old as the object
        terminated = _termination(state, f"{path}.state")
        last = _termination(_obj(cs, "lastState", path), f"{path}.lastState")
        waiting = _obj(state, "waiting", f"{path}.state")
        for t in (terminated, last):
            if t is not None:
                latest = _later(_later(latest, t.started_at), t.finished_at)
        latest = _later(latest, running_since)
        containers.append(
            ContainerView(
                name=_str(cs, "name", path) or f"#{i}",
                running_since=running_since,
                terminated=terminated,
                last_termination=last,
                waiting_reason=_str(waiting, "reason", f"{path}.state.waiting"),
                restart_count=_int(cs, "restartCount", path, 0) or 0,
                ready=cs.get("ready") is True,
            )
        )

    probes = []
    ports: dict[str, int] = {}
    for i, c in enumerate(_list(spec, "containers", "spec")):
        path = f"spec.containers[{i}]"
        if not isinstance(c, Mapping):
            raise MalformedPod(path, c, "an object")
        probe = _probe(c, path)
        if probe is not None:
            probes.append(probe)
        for j, port in enumerate(_list(c, "ports", path)):
            if isinstance(port, Mapping) and isinstance(port.get("name"), str):
                number = _int(port, "containerPort", f"{path}.ports[{j}]")
                if number is not None:
                    ports[port["name"]] = number

    return PodView(
        uid=uid,
        namespace=namespace,
        name=name,
        labels=labels,
        phase=_str(status, "phase", "status"),
        reason=_str(status, "reason", "status"),
        ready_status=ready_status,
        ready_reason=ready_reason,
        ready_changed_at=ready_changed_at,
        deletion_requested_at=deletion_requested_at,
        node_name=_str(spec, "nodeName", "spec"),
        containers=tuple(containers),
        readiness_probes=tuple(probes),
        container_ports=ports,
        latest_time=latest,
    )
