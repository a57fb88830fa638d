"""The facts of a Pod object that a verdict depends on, read strictly from API data.

Everything downstream (engine, policies, replay, operator) sees a `PodView`, never the raw
object, so the rules about odd input live in one place: `raw.py` declares the fields we read
with their types (msgspec validates them in C and skips every other field); a missing
optional field takes the API's default; a field of the wrong type or an unparseable
timestamp makes the whole object `MalformedPod`, naming the field path and the problem, so
callers count it as skipped and say why instead of crashing or guessing.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Final, Literal

import msgspec

from deathwatch._engine import raw
from deathwatch._kube.selection import SANDBOX_GROUP

ProbeKind = Literal["exec", "tcpSocket", "httpGet", "grpc", "unknown"]
NETWORK_PROBES: Final = frozenset({"tcpSocket", "httpGet", "grpc"})

# Kubernetes defaults for a probe's timing fields (core/v1 Probe).
DEFAULT_FAILURE_THRESHOLD: Final = 3
DEFAULT_PERIOD_SECONDS: Final = 10
DEFAULT_TIMEOUT_SECONDS: Final = 1
DEFAULT_GRACE_SECONDS: Final = 30


class MalformedPod(ValueError):
    """A Pod object with a field of the wrong type or an invalid value."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem

    @classmethod
    def from_validation(cls, exc: msgspec.ValidationError) -> MalformedPod:
        return cls(*raw.validation_field(exc))


# Every Track keeps its pod's restart counts, and nearly all are one of a few mappings
# ({"agent": 0}): equal ones are shared, not one dict per sandbox (ADR 0013). Bounded: past
# the cap a mapping is still correct, only not shared.
_RESTART_COUNTS: dict[tuple[tuple[str, int], ...], Mapping[str, int]] = {}
_RESTART_COUNTS_CAP = 1024


class Termination(msgspec.Struct, frozen=True, gc=False):
    """A container's terminated state: the evidence a death verdict carries."""

    exit_code: int | None
    reason: str | None
    started_at: datetime | None
    finished_at: datetime | None


class ContainerView(msgspec.Struct, frozen=True, gc=False):
    name: str
    running_since: datetime | None
    terminated: Termination | None
    last_termination: Termination | None
    restart_count: int
    ready: bool
    container_id: str | None = None  # this instance, as the runtime names it (runtime://id)

    @property
    def runs(self) -> bool:
        """Running and ready: nothing about this container explains a Ready drop."""
        return self.ready and self.terminated is None and self.running_since is not None


# The reason the kubelet gives a container it stopped because another one's exit matched a
# RestartAllContainers rule (KEP-5532, pkg/kubelet/kubelet_pods.go): a restart follows.
RESTARTING_ALL_CONTAINERS: Final = "RestartingAllContainers"
# The pod's status reason the kubelet writes when it evicts the pod, and its Event's reason
EVICTED = "Evicted"
# The Ready condition's reason when only the pod's readiness gates hold it back: every
# container is ready (pkg/kubelet/status/generate.go).
READINESS_GATES_NOT_READY: Final = "ReadinessGatesNotReady"


class ContainerRestart(msgspec.Struct, frozen=True, gc=False):
    """A container's own restart policy and rules (ContainerRestartRules, KEP-5307): each
    rule as (action, operator, exit codes), in order; the first that matches decides."""

    policy: str | None
    rules: tuple[tuple[str, str, frozenset[int]], ...] = ()


class ProbeView(msgspec.Struct, frozen=True, gc=False):
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


class Disruption(msgspec.Struct, frozen=True, gc=False):
    """The pod's DisruptionTarget condition while it is True: a component of the cluster
    (the Eviction API, kube-scheduler, the taint-eviction controller, pod GC, the kubelet)
    is about to take the pod, or took it. As written: `reason` is the component's word
    (`EvictionByEvictionAPI`, `PreemptionByScheduler`, `DeletionByTaintManager`,
    `DeletionByPodGC`, `TerminationByKubelet`, ...), `message` its sentence."""

    reason: str
    message: str | None
    since: datetime | None  # lastTransitionTime: when it was set


# gc=False: it holds no reference back to itself, so the cyclic collector need not scan it
class PodView(msgspec.Struct, frozen=True, gc=False):
    uid: str
    namespace: str
    name: str
    labels: Mapping[str, str]
    phase: str | None
    reason: str | None
    # Ready condition: status as written ("True", "False", "Unknown") or None when absent.
    ready_status: str | None
    ready_changed_at: datetime | None
    # When deletion was requested: deletionTimestamp minus the grace period, because the
    # API writes deletionTimestamp as the deadline by which the pod must be gone.
    deletion_requested_at: datetime | None
    node_name: str | None
    pod_ips: tuple[str, ...]  # as assigned (empty until the pod has a sandbox network)
    containers: tuple[ContainerView, ...]
    readiness_probes: tuple[ProbeView, ...]
    container_ports: Mapping[str, int]
    # The latest instant the object itself proves has passed (replay's clock).
    latest_time: datetime | None
    # The agent-sandbox Sandbox that controls it (its controller ownerReference), if any.
    sandbox: str | None = None
    # Its DisruptionTarget condition while True (None: absent, or cleared to False).
    disruption: Disruption | None = None
    # status.message: the component's sentence beside `reason` ("The node was low on ...").
    message: str | None = None
    # spec.restartPolicy (Always when unset), and the containers with a restart policy or
    # rules of their own (ContainerRestartRules): `restarts_after` reads both
    restart_policy: str = "Always"
    container_restarts: Mapping[str, ContainerRestart] | None = None
    # the native sidecars (init containers with restartPolicy Always) as their statuses show
    # them: never the sandbox unless a DeathWatch names one vital; their readiness is part of
    # the pod's Ready condition, so a sidecar's crash drops the pod's Ready
    sidecars: tuple[ContainerView, ...] = ()
    # the Ready condition's reason as the kubelet wrote it (ContainersNotReady,
    # ReadinessGatesNotReady, PodCompleted, ...): the node controller leaves it as it was
    ready_reason: str | None = None
    # the kubelet's Evicted Event for this pod, its message, where the controller has read
    # one: the kubelet posts it before it kills, and withholds the pod's own reason Evicted
    # until every container has stopped (status_manager.go, mergePodStatus), or loses it (a
    # process that exits 0 on SIGTERM leaves the pod Succeeded)
    eviction_notice: str | None = None

    @property
    def ready(self) -> bool:
        return self.ready_status == "True"

    @property
    def kubelet_eviction(self) -> str | None:
        """The kubelet's word that it evicts or evicted the pod, its message ("" when it gave
        none): the pod's status (reason Evicted), else its Evicted Event. None: no word."""
        if self.reason == EVICTED:
            return self.message or self.eviction_notice or ""
        return self.eviction_notice

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
            and self.ready_reason != READINESS_GATES_NOT_READY
            and bool(self.containers)
            and all(c.ready and c.running_since is not None for c in self.containers)
            and all(c.ready and c.running_since is not None for c in self.sidecars)
        )

    def restarts_after(self, container: str, code: int | None, reason: str | None) -> bool:
        """Whether the kubelet restarts this regular container after it ended with `code`
        (`reason`: its terminated reason): the kubelet's own rule (ContainerShouldRestart,
        pkg/api/v1/pod/util.go): the first of its restart rules that matches the code, else
        its own restart policy, else the pod's. An unknown code counts as a failure."""
        if reason == RESTARTING_ALL_CONTAINERS:
            return True  # stopped by another's RestartAllContainers rule: the pod restarts
        own = self.container_restarts.get(container) if self.container_restarts else None
        if own is not None and own.policy is not None:
            for action, operator, codes in own.rules:
                if (code in codes) is (operator == "In") and operator in ("In", "NotIn"):
                    if action in ("Restart", "RestartAllContainers"):
                        return True
                    break  # an action this version does not know: the policy decides
            if own.policy == "Always":
                return True
            if own.policy == "OnFailure":
                return code != 0
            if own.policy == "Never":
                return False
        policy = self.restart_policy
        if policy == "OnFailure":
            return code != 0
        return policy != "Never"  # Always, and unset or unknown: the API's default

    def completed(self, c: ContainerView) -> bool:
        """A regular container that ended cleanly for good: exit 0, and no restart follows."""
        t = c.terminated
        return (
            t is not None
            and t.exit_code == 0
            and not self.restarts_after(c.name, t.exit_code, t.reason)
        )

    def restart_counts(self) -> Mapping[str, int]:
        """Restart count per container name (sidecars too; names are unique in a pod):
        read-only, and shared between equal ones."""
        key = tuple((c.name, c.restart_count) for c in self.containers)
        if self.sidecars:
            key += tuple((c.name, c.restart_count) for c in self.sidecars)
        counts = _RESTART_COUNTS.get(key)
        if counts is None:
            counts = MappingProxyType(dict(key))
            if len(_RESTART_COUNTS) < _RESTART_COUNTS_CAP:
                _RESTART_COUNTS[key] = counts
        return counts

    def probe_port_number(self, probe: ProbeView) -> int | None:
        """The numeric port a network probe targets, resolving named container ports."""
        if isinstance(probe.port, int):
            return probe.port
        if isinstance(probe.port, str):
            if probe.port.isdigit():
                return int(probe.port)
            return self.container_ports.get(probe.port)
        return None


def _probe(container: raw.Container) -> ProbeView | None:
    probe = container.readiness_probe
    if probe is None:
        return None
    kind: ProbeKind = "unknown"
    port: int | str | None = None
    if probe.exec is not None:
        kind = "exec"
    elif probe.tcp_socket is not None:
        kind, port = "tcpSocket", probe.tcp_socket.port
    elif probe.http_get is not None:
        kind, port = "httpGet", probe.http_get.port
    elif probe.grpc is not None:
        kind, port = "grpc", probe.grpc.port
    return ProbeView(
        container=container.name or "",
        kind=kind,
        port=port,
        failure_threshold=probe.failure_threshold or DEFAULT_FAILURE_THRESHOLD,
        period_seconds=probe.period_seconds or DEFAULT_PERIOD_SECONDS,
        timeout_seconds=probe.timeout_seconds or DEFAULT_TIMEOUT_SECONDS,
    )


def _controlling_sandbox(meta: raw.ObjectMeta) -> str | None:
    """The name of the agent-sandbox Sandbox controlling the pod (any version of the group:
    the name is what links them, and agent-sandbox keeps it across versions)."""
    for ref in meta.owner_references or ():
        if (
            ref.controller
            and ref.kind == "Sandbox"
            and (ref.api_version or "").split("/")[0] == SANDBOX_GROUP
            and ref.name
        ):
            return ref.name
    return None


def view_of(pod: raw.Pod) -> PodView:
    """Derive the view from a validated raw Pod. Raises MalformedPod for missing identity.

    Replay's hot loop (one call per recorded event): written with locals and inline
    comparisons rather than a helper call per field, which were a third of its cost; one
    call per part scanned (the conditions, the statuses, the containers' spec) costs what
    bench/replay_bench.py measures against the single function (ADR 0042)."""
    if pod.kind is not None and pod.kind != "Pod":
        raise MalformedPod("kind", f'expected "Pod", got {pod.kind!r}')
    meta = pod.metadata or raw.EMPTY_META
    if not meta.uid:
        raise MalformedPod("metadata.uid", "missing: a Pod needs a uid")
    if not meta.name:
        raise MalformedPod("metadata.name", "missing: a Pod needs a name")
    spec = pod.spec or raw.EMPTY_SPEC
    status = pod.status or raw.EMPTY_STATUS

    # the latest instant the object proves has passed: the max of every time it carries
    latest = meta.creation_timestamp
    deletion_requested_at = None
    if meta.deletion_timestamp is not None:
        grace = meta.deletion_grace_period_seconds
        deletion_requested_at = meta.deletion_timestamp - timedelta(
            seconds=DEFAULT_GRACE_SECONDS if grace is None else grace
        )
        if latest is None or deletion_requested_at > latest:
            latest = deletion_requested_at

    ready, disruption, latest = _conditions(status.conditions, latest)
    containers, latest = _statuses(status.container_statuses, latest)
    sidecars: tuple[ContainerView, ...] = ()
    if spec.init_containers and status.init_container_statuses:
        restartable = {c.name for c in spec.init_containers if c.restart_policy == "Always"}
        if restartable:
            found, latest = _statuses(status.init_container_statuses, latest, restartable)
            sidecars = tuple(found)

    probes, ports, own = _of_containers(spec.containers)
    pod_ips: tuple[str, ...] = ()
    if status.pod_ips:
        pod_ips = tuple([p.ip for p in status.pod_ips if p.ip])
    if not pod_ips and status.pod_ip:
        pod_ips = (status.pod_ip,)
    node = spec.node_name
    return PodView(
        meta.uid,
        # the same few namespaces and nodes in every sandbox: one string each (ADR 0014)
        _intern(meta.namespace or "default"),
        meta.name,
        meta.labels or {},
        status.phase,
        status.reason,
        ready[0],
        ready[1],
        deletion_requested_at,
        _intern(node) if node else None,
        pod_ips,
        tuple(containers),
        probes,
        ports,
        latest,
        _controlling_sandbox(meta) if meta.owner_references else None,
        disruption,
        status.message,
        spec.restart_policy or "Always",
        own,
        sidecars,
        ready[2],
    )


def _conditions(
    conditions: list[raw.PodCondition] | None, latest: datetime | None
) -> tuple[tuple[str | None, datetime | None, str | None], Disruption | None, datetime | None]:
    """Ready's (status, last transition, reason), the DisruptionTarget if it is True, and the
    latest instant seen, the conditions' transitions included."""
    ready: tuple[str | None, datetime | None, str | None] = (None, None, None)
    disruption = None
    for cond in conditions or ():
        at = cond.last_transition_time
        if at is not None and (latest is None or at > latest):
            latest = at
        kind = cond.type
        if kind == "Ready":
            ready = (cond.status, at, cond.reason)
        elif kind == "DisruptionTarget" and cond.status == "True":
            disruption = Disruption(cond.reason or "", cond.message or None, at)
    return ready, disruption, latest


def _of_containers(
    containers: list[raw.Container] | None,
) -> tuple[tuple[ProbeView, ...], dict[str, int], dict[str, ContainerRestart] | None]:
    """From the spec: the readiness probes, the named ports, and each container's own restart
    policy (None: no container sets one, as almost none do)."""
    probes = []
    ports: dict[str, int] = {}
    own: dict[str, ContainerRestart] | None = None
    for c in containers or ():
        if c.restart_policy is not None:
            if own is None:
                own = {}
            own[c.name or ""] = _restart_of(c)
        if c.readiness_probe is not None:
            probe = _probe(c)
            if probe is not None:
                probes.append(probe)
        if c.ports:
            for port in c.ports:
                if port.name and port.container_port is not None:
                    ports[port.name] = port.container_port
    return tuple(probes), ports, own


def _statuses(
    statuses: list[raw.ContainerStatus] | None,
    latest: datetime | None,
    only: set[str | None] | None = None,
) -> tuple[list[ContainerView], datetime | None]:
    """Container views of these statuses (`only`: of these names), and the latest instant
    they prove has passed, at least `latest`."""
    views = []
    for i, cs in enumerate(statuses or ()):
        if only is not None and cs.name not in only:
            continue
        state = cs.state
        running_since = terminated = last = None
        if state is not None:
            if state.running is not None:
                # running with no start time: at least as old as the object
                running_since = state.running.started_at or latest
            t = state.terminated
            if t is not None:
                terminated = Termination(t.exit_code, t.reason, t.started_at, t.finished_at)
                if t.started_at is not None and (latest is None or t.started_at > latest):
                    latest = t.started_at
                if t.finished_at is not None and (latest is None or t.finished_at > latest):
                    latest = t.finished_at
        if cs.last_state is not None and (t := cs.last_state.terminated) is not None:
            last = Termination(t.exit_code, t.reason, t.started_at, t.finished_at)
            if t.started_at is not None and (latest is None or t.started_at > latest):
                latest = t.started_at
            if t.finished_at is not None and (latest is None or t.finished_at > latest):
                latest = t.finished_at
        if running_since is not None and (latest is None or running_since > latest):
            latest = running_since
        views.append(
            ContainerView(
                cs.name or f"#{i}",
                running_since,
                terminated,
                last,
                cs.restart_count or 0,
                cs.ready is True,
                cs.container_id or None,
            )
        )
    return views, latest


def _restart_of(c: raw.Container) -> ContainerRestart:
    rules = []
    for rule in c.restart_policy_rules or ():
        codes = rule.exit_codes
        if codes is None:  # the kubelet skips a rule without exit codes
            continue
        rules.append((rule.action or "", codes.operator or "", frozenset(codes.values or ())))
    return ContainerRestart(c.restart_policy, tuple(rules))


_intern = sys.intern


_POD = msgspec.json.Decoder(raw.Pod)


def decode_pod(data: bytes | msgspec.Raw) -> tuple[PodView, str]:
    """A Pod from its JSON bytes, decoded once, straight into what a verdict needs (a watch
    event's object, a listing's item); with its resourceVersion. Raises MalformedPod only."""
    try:
        pod = _POD.decode(data)
    except msgspec.ValidationError as exc:
        raise MalformedPod.from_validation(exc) from None
    except msgspec.DecodeError as exc:
        raise MalformedPod("object", f"not JSON: {exc}") from None
    return view_of(pod), (pod.metadata.resource_version or "") if pod.metadata else ""


def read_pod(obj: object) -> PodView:
    """Read a Pod as served by the API (a dict, or kopf's Body). Raises MalformedPod only."""
    if not isinstance(obj, Mapping):
        raise MalformedPod("object", f"expected a Pod object, got {type(obj).__name__}")
    try:
        pod = msgspec.convert(obj, raw.Pod, strict=True)
    except msgspec.ValidationError as exc:
        raise MalformedPod.from_validation(exc) from None
    return view_of(pod)


def blocked_probes(pod: PodView, agent_ports: frozenset[int]) -> list[ProbeView]:
    """Readiness probes that kubelet sends from the host to an agent port the node firewall
    refuses: they can never pass (the pod needs exec probes)."""
    return [
        p
        for p in pod.readiness_probes
        if p.kind in NETWORK_PROBES and pod.probe_port_number(p) in agent_ports
    ]
