"""The subset of the Pod API schema deathwatch reads, as typed msgspec Structs.

Declaring only these fields lets msgspec skip the rest of each object (env, volumes,
managedFields...) without building Python objects for it, and validates the types of the
ones we read, naming the path of any that is wrong. Every field is optional, as in the API.
Timestamps must carry a zone, as the API always writes them (RFC 3339, "Z").
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import msgspec

Time = Annotated[datetime, msgspec.Meta(tz=True)]


class OwnerReference(msgspec.Struct, rename="camel", frozen=True, gc=False):
    api_version: str | None = None
    kind: str | None = None
    name: str | None = None
    controller: bool | None = None


class ObjectMeta(msgspec.Struct, rename="camel", frozen=True, gc=False):
    uid: str | None = None
    name: str | None = None
    namespace: str | None = None
    resource_version: str | None = None
    labels: dict[str, str] | None = None
    creation_timestamp: Time | None = None
    deletion_timestamp: Time | None = None
    deletion_grace_period_seconds: int | None = None
    owner_references: tuple[OwnerReference, ...] | None = None


class PortHandler(msgspec.Struct, rename="camel", frozen=True, gc=False):
    port: int | str | None = None


class Probe(msgspec.Struct, rename="camel", frozen=True, gc=False):
    exec: dict[str, Any] | None = None
    tcp_socket: PortHandler | None = None
    http_get: PortHandler | None = None
    grpc: PortHandler | None = None
    failure_threshold: int | None = None
    period_seconds: int | None = None
    timeout_seconds: int | None = None


class ContainerPort(msgspec.Struct, rename="camel", frozen=True, gc=False):
    name: str | None = None
    container_port: int | None = None


class ExitCodes(msgspec.Struct, rename="camel", frozen=True, gc=False):
    operator: str | None = None  # In, NotIn
    values: list[int] | None = None


class RestartRule(msgspec.Struct, rename="camel", frozen=True, gc=False):
    """One of a container's restartPolicyRules (ContainerRestartRules, KEP-5307)."""

    action: str | None = None  # Restart, RestartAllContainers (KEP-5532)
    exit_codes: ExitCodes | None = None


class Container(msgspec.Struct, rename="camel", frozen=True, gc=False):
    name: str | None = None
    readiness_probe: Probe | None = None
    ports: list[ContainerPort] | None = None
    # a container's own restart policy and rules (ContainerRestartRules, 1.34+): whether the
    # kubelet restarts it after an exit is theirs to say, not the pod's restartPolicy. On an
    # init container, restartPolicy Always makes it a native sidecar.
    restart_policy: str | None = None
    restart_policy_rules: list[RestartRule] | None = None


class PodSpec(msgspec.Struct, rename="camel", frozen=True, gc=False):
    containers: list[Container] | None = None
    init_containers: list[Container] | None = None
    node_name: str | None = None
    restart_policy: str | None = None


class PodCondition(msgspec.Struct, rename="camel", frozen=True, gc=False):
    type: str | None = None
    status: str | None = None
    reason: str | None = None
    message: str | None = None
    last_transition_time: Time | None = None


class Terminated(msgspec.Struct, rename="camel", frozen=True, gc=False):
    exit_code: int | None = None
    reason: str | None = None
    started_at: Time | None = None
    finished_at: Time | None = None


class Running(msgspec.Struct, rename="camel", frozen=True, gc=False):
    started_at: Time | None = None


class ContainerState(msgspec.Struct, rename="camel", frozen=True, gc=False):
    running: Running | None = None
    terminated: Terminated | None = None


class ContainerStatus(msgspec.Struct, rename="camel", frozen=True, gc=False):
    name: str | None = None
    # the runtime's id of the container instance (containerd://<id>): what a node's runtime
    # names in an exit, and a new one for every restart
    container_id: str | None = msgspec.field(name="containerID", default=None)
    ready: bool | None = None
    restart_count: int | None = None
    state: ContainerState | None = None
    last_state: ContainerState | None = None


class PodIP(msgspec.Struct, frozen=True, gc=False):
    ip: str | None = None


class PodStatus(msgspec.Struct, rename="camel", frozen=True, gc=False):
    phase: str | None = None
    reason: str | None = None
    message: str | None = None
    pod_ip: str | None = msgspec.field(name="podIP", default=None)
    pod_ips: list[PodIP] | None = msgspec.field(name="podIPs", default=None)
    conditions: list[PodCondition] | None = None
    container_statuses: list[ContainerStatus] | None = None
    init_container_statuses: list[ContainerStatus] | None = None


class Pod(msgspec.Struct, rename="camel", frozen=True, gc=False):
    kind: str | None = None
    metadata: ObjectMeta | None = None
    spec: PodSpec | None = None
    status: PodStatus | None = None
    # Not a Pod field: the Status object of a watch ERROR event decodes here too, and its
    # message is what a person needs to see ("too old resource version: ...").
    message: str | None = None


def validation_field(exc: msgspec.ValidationError) -> tuple[str, str]:
    """The field path and the problem of a validation error, for a message that names both.

    msgspec says "Expected `int | null`, got `str` - at `$.status.containerStatuses[0]...`";
    this returns ("status.containerStatuses[0]...", "Expected int | null, got str").
    """
    problem, sep, where = str(exc).rpartition(" - at `")
    if not sep:
        return "object", str(exc)
    field = where.rstrip("`").removeprefix("$").lstrip(".")
    return field or "object", problem.replace("`", "")


EMPTY_META = ObjectMeta()
EMPTY_SPEC = PodSpec()
EMPTY_STATUS = PodStatus()


class ExitRecord(msgspec.Struct, frozen=True, gc=False):
    """A container's exit heard on its node, as a recording carries it (`type: NODE_EXIT`,
    with `object` the pod as read at the exit): the node agent's exits Lease entry
    (deathwatch._kube.exits) and the node."""

    id: str
    code: int
    at: Time
    oom: bool = False
    node: str = ""


class WatchValue(msgspec.Struct, rename="camel", frozen=True, gc=False):
    """One recorded value: a watch event ({type, object}), a bare Pod, a List of Pods, or a
    node's exit ({type: NODE_EXIT, exit, object})."""

    type: str | None = None
    object: Pod | None = None
    exit: ExitRecord | None = None
    kind: str | None = None
    metadata: ObjectMeta | None = None
    spec: PodSpec | None = None
    status: PodStatus | None = None
    items: list[Pod] | None = None
