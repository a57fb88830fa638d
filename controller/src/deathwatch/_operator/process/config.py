"""The controller's configuration, as the command line (command.py) makes it: one frozen
value the app is built from."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from deathwatch._kube.serving import Limits
from deathwatch._operator.delivery.config import DeliveryConfig
from deathwatch._operator.leadership.leader import LeaseTimings
from deathwatch._operator.ports.endpoints import Address
from deathwatch._operator.shards.slot_claims import Spec
from deathwatch._operator.sources.reflector import OPEN_DEADLINE

STALE_AFTER = 90.0  # a watch with nothing (not even a bookmark) for this long is stale


@dataclass(frozen=True)
class Config:
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    kubeconfig: str | None = None
    metrics_address: Address = ("0.0.0.0", 8443)  # noqa: S104 - HTTPS, /metrics authorized
    health_address: Address = ("0.0.0.0", 8081)  # noqa: S104 - HTTP, the kubelet's probes
    heartbeat_file: Path | None = None  # the exec liveness probe's (written every beat)
    metrics_cert_dir: Path | None = None  # tls.crt and tls.key (cert-manager); None: self-signed
    port_limits: Limits = field(default_factory=Limits)  # what a client may hold of a port
    firewall_daemonset: str | None = None  # "namespace/name"
    pod_label_selector: str | None = None  # optional server-side prefilter of watched pods
    controller_id: str = ""  # serves the DeathWatches annotated with it (ADR 0029)
    agent_sandbox: bool = True  # watch agent-sandbox's Sandboxes (if and once installed)
    probe_interval: float = 15.0  # /readyz and the firewall DaemonSet: one light call each
    coverage_interval: float = 5.0  # the firewall agents' coverage Leases: one list each
    # the other releases' workloads, for what they share with this one (ADR 0038)
    release_check_interval: float = 30.0
    crds_release: str | None = None  # NAMESPACE/RELEASE when this release applies the CRDs
    publish_interval: float = 1.0  # DeathWatch status, at most once per interval
    stream_stale_after: float = STALE_AFTER
    watch_open_deadline: float = OPEN_DEADLINE  # a collection not listed by then is named
    retire_interval: float = 10.0  # how often verdicts past their retention are looked for
    writers: int = 8
    leader_elect: bool = True  # False: this process is the only writer (one replica)
    identity: str = "deathwatch"  # the pod's name: on the Lease, and as field manager
    lease_name: str = "deathwatch-controller"
    lease_namespace: str = "deathwatch-system"
    # the Deployment (in lease_namespace) whose deletion deletes the Lease; None: no owner
    lease_owner: str | None = None
    lease_timings: LeaseTimings = field(default_factory=LeaseTimings)
    delivery: DeliveryConfig | None = None  # the sinks verdicts are delivered to (delivery/)
    shard: Spec = field(default_factory=Spec)  # which slots this process judges (ADR 0025)
    # the shard's epoch is this pod's creation (NAMESPACE, NAME), read at start; None: as given
    shard_epoch_pod: tuple[str, str] | None = None
    # where the node agents' exits Leases are (ADR 0028: deaths heard on the node); None: off
    node_exits_namespace: str | None = None

    @property
    def scopes(self) -> tuple[str | None, ...]:
        """What each reflector lists and watches: one namespace each, or everything."""
        return self.namespaces or (None,)


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("deathwatch")
    except PackageNotFoundError:
        return "unknown"
