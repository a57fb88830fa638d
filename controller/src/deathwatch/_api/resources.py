"""The custom resources of group deathwatch.dev, typed: DeathWatch (spec and status) and
SandboxVerdict (status), with their condition types, reasons and Event reasons as constants.

One source of truth for both directions: the operator builds these structs and encodes them
(`to_document`), and reads spec and status back through them (`msgspec.convert`, which names
the path of a bad field). tests/unit/test_resources.py proves that every field, type, enum and
bound here agrees with the CRD schemas under manifests/base/crds.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

import msgspec

from deathwatch._engine.verdict import Cause, Observer, Origin, State
from deathwatch._kube import selection

GROUP: Final = "deathwatch.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
DW_PLURAL: Final = "deathwatches"
SV_PLURAL: Final = "sandboxverdicts"
# of each resource of ours, by plural: its kind, and the noun its API calls are counted by
# (deathwatch_api_writes_total{operation="create_verdict"}, ...)
KINDS: Final = {SV_PLURAL: "SandboxVerdict", DW_PLURAL: "DeathWatch"}
NOUNS: Final = {SV_PLURAL: "verdict", DW_PLURAL: "deathwatch"}
MANAGED_BY: Final = "deathwatch.dev/controller"  # Events' reportingComponent
WATCH_LABEL: Final = "deathwatch.dev/watch"  # on each SandboxVerdict: its DeathWatch
POD_UID_LABEL: Final = "deathwatch.dev/pod-uid"  # on each SandboxVerdict: its pod's uid
# on the SandboxVerdict of an agent-sandbox Sandbox's pod: the Sandbox's name, which a warm
# pool's adoption by a claim keeps (`kubectl get sv -l deathwatch.dev/sandbox=NAME`)
SANDBOX_LABEL: Final = "deathwatch.dev/sandbox"
# sharded: on each SandboxVerdict, its pod's slot (slots.py), so that a shard watches its
# own verdicts only (`-l deathwatch.dev/slot in (...)`)
SLOT_LABEL: Final = "deathwatch.dev/slot"
# selectable fields of a SandboxVerdict (the CRD's selectableFields): `kubectl get sv
# --field-selector status.origin=Infrastructure`; no labels, so no write of their own
SELECTABLE_FIELDS: Final = ("status.state", "status.cause", "status.origin")
AGENT_SANDBOX: Final = "agent-sandbox"  # DeathWatch spec.sandboxes

Time = Annotated[datetime, msgspec.Meta(tz=True)]
LabelValue = Annotated[str, msgspec.Meta(max_length=63)]
Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]
POLICY_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(StrEnum):
    # on a DeathWatch
    READY = "Ready"
    FIREWALL_COVERED = "FirewallCovered"
    DELIVERED = "Delivered"  # every sink has what it is owed (only when sinks are configured)
    # another release shares what this one holds: a controller id, a table, a host port
    # (ADR 0038; only where the other releases are read: the chart's controllers)
    RELEASE_CONFLICT = "ReleaseConflict"
    # on a SandboxVerdict
    ALIVE = "Alive"  # its reason is the verdict's cause, or its state when there is none
    PROBE_BLOCKED = "ProbeBlockedByFirewall"
    POLICY_ERROR = "PolicyError"  # while the pod's policy fails: judged by container-state
    SHIELDED = "Shielded"  # its node's firewall agent is current and covers it (shield.py)


class Reason(StrEnum):
    """Reasons of the conditions above (the Alive condition's come from the engine)."""

    WATCHING = "Watching"
    INVALID_SPEC = "InvalidSpec"
    NOT_CONFIGURED = "NotConfigured"
    NOT_OBSERVED = "NotObserved"
    ALL_NODES = "AllNodes"
    NODES_UNCOVERED = "NodesUncovered"
    NETWORK_PROBE_ON_AGENT_PORT = "NetworkProbeOnAgentPort"
    POLICY_FAILED = "PolicyFailed"
    WATCH_STALE = "WatchStale"
    UP_TO_DATE = "UpToDate"
    RELEASE_COLLISION = "ReleaseCollision"
    NO_COLLISION = "NoCollision"
    BACKLOG = "Backlog"


DeathWatchKey = tuple[str, str]  # a DeathWatch by (namespace, name): how every part keys it


# Which controller serves a DeathWatch (the Prometheus Operator's controller-id, here): a
# controller started with --controller-id ID serves the DeathWatches annotated with ID, and
# one started without it those with none. Every controller still applies one rule to all of
# them: the oldest DeathWatch in a namespace that selects a pod judges it (ADR 0029).
CONTROLLER_ID_ANNOTATION: Final = selection.CONTROLLER_ID_ANNOTATION


class EventReason(StrEnum):
    """Reasons of the Events posted on sandbox pods, once per pod and reason."""

    SANDBOX_DEAD = "SandboxDead"
    SANDBOX_FALSE_POSITIVE = "SandboxFalsePositive"
    PROBE_BLOCKED = "ProbeBlockedByFirewall"
    SANDBOX_LOST_TRACK = "SandboxLostTrack"  # gone while nobody watched: fate unknown
    SANDBOX_UNSHIELDED = "SandboxUnshielded"  # once per spell without a current firewall
    # a death its node heard that the kubelet's report tells otherwise (the verdict stands)
    NODE_EXIT_DISPUTED = "NodeExitDisputed"
    # a container that is not the sandbox (a sidecar not named vital, a helper) restarted
    SIDECAR_RESTARTED = "SidecarRestarted"


class _Object(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True, frozen=True):
    """Camel-case JSON names; fields at their default (None, empty) are left out."""


class Condition(_Object, frozen=True):
    type: str
    status: ConditionStatus
    reason: str
    message: str
    last_transition_time: Time | None = None


# --- DeathWatch ----------------------------------------------------------------------------


class LabelSelectorRequirement(_Object, frozen=True):
    key: Annotated[str, msgspec.Meta(min_length=1, max_length=317)]
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: Annotated[list[LabelValue], msgspec.Meta(max_length=64)] | None = None


class LabelSelector(_Object, frozen=True):
    match_labels: Annotated[dict[str, LabelValue], msgspec.Meta(max_length=64)] | None = None
    match_expressions: (
        Annotated[list[LabelSelectorRequirement], msgspec.Meta(max_length=32)] | None
    ) = None


class ExecProbeSettings(_Object, frozen=True):
    window_multiplier: Annotated[float, msgspec.Meta(gt=0, le=100)] = 2.0


DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # RFC 1123: a container's name, a sink's
ContainerName = Annotated[str, msgspec.Meta(min_length=1, max_length=63, pattern=DNS_LABEL)]


class ContainerRoles(_Object, frozen=True):
    """Which of a pod's containers are the sandbox (ADR 0029): `sandbox`, its regular
    containers (empty: all of them); `vital_sidecars`, the native sidecars whose death is the
    sandbox's (empty: none; a sidecar's restart is evidence, never a death)."""

    sandbox: Annotated[list[ContainerName], msgspec.Meta(max_length=64)] = msgspec.field(
        default_factory=list
    )
    vital_sidecars: Annotated[list[ContainerName], msgspec.Meta(max_length=64)] = msgspec.field(
        default_factory=list
    )


class DeathWatchSpec(_Object, frozen=True):
    sandboxes: Literal["agent-sandbox"] | None = None
    containers: ContainerRoles | None = None
    pod_selector: LabelSelector | None = None
    policy: Annotated[str, msgspec.Meta(max_length=63, pattern=POLICY_PATTERN)] = "auto"
    exec_probe: ExecProbeSettings | None = None
    agent_ports: Annotated[list[Port], msgspec.Meta(max_length=64)] = msgspec.field(
        default_factory=list
    )
    # its format and bound: spec.parse_duration here, two CEL rules in the CRD
    verdict_retention: Annotated[str, msgspec.Meta(max_length=32)] = "1h"


class FirewallCoverage(_Object, frozen=True):
    daemon_set: str
    summary: str  # "ready/desired", or "unknown"
    desired: int | None = None
    ready: int | None = None
    observed_at: Time | None = None


class LastDeath(_Object, frozen=True):
    name: str
    pod_uid: str = msgspec.field(name="podUID")
    policy: str
    cause: Cause
    origin: Origin | None = None
    container: str | None = None
    exit_code: int | None = None
    ready_drop_at: Time | None = None
    declared_at: Time | None = None
    observed_by: Observer | None = None


class OriginCounts(_Object, frozen=True):
    """Ended sandboxes (Dead or Gone) by whose doing their end was: always written, 0s too."""

    workload: int
    infrastructure: int
    platform: int
    unknown: int


class ShardPart(_Object, frozen=True):
    """One shard's share of a DeathWatch (sharding: each shard's leader applies its own
    entry; shard 0 writes the totals from all of them: ADR 0025)."""

    shard: int
    slots: str  # the slots it owns, "0-15"
    tracked: int
    pending: int
    alive: int
    suspect: int
    dead: int
    gone: int
    flaps: int
    false_positives: int
    deaths: OriginCounts
    leader: str | None = None
    uncovered_nodes: Annotated[list[str], msgspec.Meta(max_length=100)] = msgspec.field(
        default_factory=list
    )
    last_deaths: Annotated[list[LastDeath], msgspec.Meta(max_length=20)] = msgspec.field(
        default_factory=list
    )


class DeathWatchStatus(_Object, frozen=True):
    # the counts have no default: they are always written, so `kubectl get dw` shows 0
    tracked: int
    pending: int
    alive: int
    suspect: int
    dead: int
    gone: int
    flaps: int
    false_positives: int
    # Dead by whose doing (Workload: its own; Infrastructure: the cluster's disruptions)
    deaths: OriginCounts
    observed_generation: int | None = None
    leader: str | None = None  # the controller replica that holds the Lease and writes
    term: int | None = None  # stamped by the writer (object_writes.py): the term that wrote it
    firewall: FirewallCoverage | None = None
    # nodes running this DeathWatch's live sandboxes whose firewall is not current (shield.py)
    uncovered_nodes: Annotated[list[str], msgspec.Meta(max_length=100)] = msgspec.field(
        default_factory=list
    )
    last_deaths: Annotated[list[LastDeath], msgspec.Meta(max_length=20)] = msgspec.field(
        default_factory=list
    )
    conditions: list[Condition] = msgspec.field(default_factory=list)
    # sharded (N > 1): each shard's part, written by that shard's leader; the fields above are
    # shard 0's sums of them, and `leader` says who leads each shard ("0=pod-a 1=pod-b")
    shards: Annotated[list[ShardPart], msgspec.Meta(max_length=64)] | None = None


# --- SandboxVerdict ------------------------------------------------------------------------


class SandboxVerdictSpec(_Object, frozen=True):
    death_watch: Annotated[str, msgspec.Meta(max_length=253)] | None = None


ObjectName = Annotated[str, msgspec.Meta(max_length=253)]


class SandboxRef(_Object, frozen=True):
    """The agent-sandbox objects a sandbox pod belongs to (agent_sandboxes.py reads them)."""

    name: ObjectName
    claim: ObjectName | None = None
    template: ObjectName | None = None
    warm_pool: ObjectName | None = None


class DisruptionStatus(_Object, frozen=True):
    """The pod's DisruptionTarget condition behind the verdict, as its component wrote it."""

    reason: str  # EvictionByEvictionAPI, PreemptionByScheduler, DeletionByTaintManager, ...
    message: str | None = None  # "Eviction API: evicting", ...
    since: Time | None = None  # when it was set


class DeliveryOutcome(StrEnum):
    """What became of a verdict's event at one sink (the delivery subpackage)."""

    DELIVERED = "Delivered"  # the receiver answered 2xx
    REFUSED = "Refused"  # a 4xx other than 408 and 429: not sent again
    EXPIRED = "Expired"  # owed longer than the sink's maxAge: given up, counted


class DeliveryMark(_Object, frozen=True):
    """The last event of this verdict a sink was sent to an end: which transition (its
    `sequence`, its CloudEvent `id` and the state it announced) and how it ended. Written by
    the leader only, fenced like every write; a new leader sends what no mark covers."""

    sink: Annotated[str, msgspec.Meta(max_length=63)]
    id: Annotated[str, msgspec.Meta(max_length=128)]
    sequence: int
    state: State
    outcome: DeliveryOutcome
    at: Time
    code: int | None = None  # the HTTP status of a refusal
    message: Annotated[str, msgspec.Meta(max_length=256)] | None = None


class SandboxVerdictStatus(_Object, frozen=True):
    """The verdict and everything the engine needs to carry on after a restart."""

    state: State
    policy: Annotated[str, msgspec.Meta(max_length=63)]
    pod_uid: str = msgspec.field(name="podUID")
    restart_counts: dict[str, int]
    ready_drops: int
    flaps: int
    false_positive: bool
    probe_blocked_by_firewall: bool
    # restarts of its containers that are not the sandbox since it was first Ready (ADR 0029)
    sidecar_restarts: int = 0
    # the pod's Ready as last judged: a restart resumes from it, since after a death only a
    # Ready from not Ready is a false positive (a pod can die Ready: a disruption, an
    # eviction), and the state alone does not say which (absent on older verdicts)
    pod_ready: bool | None = None
    cause: Cause | None = None
    origin: Origin | None = None  # on Dead and Gone: whose doing the end was
    disruption: DisruptionStatus | None = None  # the cluster is taking it, or took it
    container: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    restart_count: int | None = None  # the dead container's, else the sum at first Ready
    # a terminal verdict's: whose report it rests on (node: the runtime's exit, ADR 0028),
    # the container instance that ended, and where the kubelet's report told it otherwise
    observed_by: Observer | None = None
    container_id: Annotated[str, msgspec.Meta(max_length=512)] | None = msgspec.field(
        name="containerID", default=None
    )
    disputed: Annotated[str, msgspec.Meta(max_length=1024)] | None = None
    node: str | None = None
    last_ready_at: Time | None = None
    ready_drop_at: Time | None = None
    deadline: Time | None = None
    declared_at: Time | None = None
    pod_deleted_at: Time | None = None
    sandbox: SandboxRef | None = None
    # while the pod's policy fails: why (it is judged by container-state meanwhile)
    policy_error: str | None = None
    term: int | None = None  # stamped by the writer (object_writes.py): the term that wrote it
    # how many times the state changed: each delivered event's `sequence`
    transitions: int | None = None
    delivery: Annotated[list[DeliveryMark], msgspec.Meta(max_length=16)] | None = None
    conditions: list[Condition] = msgspec.field(default_factory=list)


def to_document(value: msgspec.Struct) -> dict[str, Any]:
    """The JSON-ready dict the API takes (camelCase keys, RFC 3339 "Z" times)."""
    document: dict[str, Any] = msgspec.to_builtins(value)
    return document


LEASES: Final = "/apis/coordination.k8s.io/v1"


def objects(plural: str, namespace: str | None = None) -> str:
    """The path of a collection of ours, in a namespace or across all of them."""
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"/apis/{GROUP}/{VERSION}{where}/{plural}"
