"""The controller's configuration, as the command line (command.py) makes it: one frozen
value the app is built from (`Config.from_args`: every flag checked before anything starts)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

from deathwatch._api.kubeconfig import CredentialError, KubeconfigError
from deathwatch._api.kubeconfig import load as load_kubeconfig
from deathwatch._kube.configfile import ConfigError
from deathwatch._kube.ports import heartbeat_file
from deathwatch._kube.selector import LABEL_VALUE
from deathwatch._kube.serving import Limits
from deathwatch._operator.delivery import config as delivery_config
from deathwatch._operator.delivery.config import DeliveryConfig
from deathwatch._operator.leadership.leader import LeaseTimings
from deathwatch._operator.ports.endpoints import Address, address
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

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Config:
        """`deathwatch controller`'s flags, each checked: BadFlag names the first refused, its
        flag and value, in one line. Reads the kubeconfig and the delivery config to refuse
        them now, not after start; starts nothing, logs nothing. `port_limits` holds the
        --max-connections asked, before the open-files limit caps it (command.py)."""
        _check_values(args)
        shard, epoch_pod = _shard(args)
        metrics_address, health_address, heartbeat = _ports(args)
        _check_kubeconfig(args)
        return cls(
            namespaces=tuple(dict.fromkeys(args.namespace)),
            kubeconfig=args.kubeconfig,
            metrics_address=metrics_address,
            health_address=health_address,
            heartbeat_file=heartbeat,
            metrics_cert_dir=Path(args.metrics_cert_dir) if args.metrics_cert_dir else None,
            port_limits=Limits(connections=args.max_connections),
            firewall_daemonset=args.firewall_daemonset,
            coverage_interval=args.coverage_interval,
            release_check_interval=args.release_check_interval,
            crds_release=args.crds_release,
            watch_open_deadline=args.watch_open_deadline,
            pod_label_selector=args.pod_label_selector,
            controller_id=args.controller_id,
            agent_sandbox=args.agent_sandbox,
            leader_elect=args.leader_elect,
            identity=args.identity,
            lease_name=args.lease_name,
            lease_namespace=args.lease_namespace,
            lease_owner=args.lease_owner,
            lease_timings=_lease_timings(args),
            delivery=_delivery(args),
            shard=shard,
            shard_epoch_pod=epoch_pod,
            node_exits_namespace=args.node_exits,
        )


class BadFlag(ValueError):
    """A command-line value refused; the message names the flag and the value."""


def _check_values(args: argparse.Namespace) -> None:
    if args.firewall_daemonset is not None and args.firewall_daemonset.count("/") != 1:
        raise BadFlag(f"--firewall-daemonset: expected NS/NAME, got {args.firewall_daemonset!r}")
    if args.controller_id and not LABEL_VALUE.fullmatch(args.controller_id):
        raise BadFlag(
            "--controller-id: expected a label value (up to 63 letters, digits, - _ ., "
            f"beginning and ending alphanumeric), got {args.controller_id!r}"
        )
    for flag, value, low, high in (
        ("--coverage-interval", args.coverage_interval, 0.1, 300),
        ("--release-check-interval", args.release_check_interval, 0.1, 3600),
        ("--watch-open-deadline", args.watch_open_deadline, 1, 3600),
    ):
        if not low <= value <= high:
            raise BadFlag(f"{flag}: expected seconds in [{low}, {high}], got {value}")
    if not args.identity:
        raise BadFlag("--identity: empty")


def _shard(args: argparse.Namespace) -> tuple[Spec, tuple[str, str] | None]:
    try:
        epoch, epoch_pod = shard_epoch(args.shard_epoch)
        shard = Spec(args.shard, args.shards, epoch)
    except ValueError as exc:
        raise BadFlag(f"--shards/--shard/--shard-epoch: {exc}") from None
    if shard.sharded and not args.leader_elect:
        raise BadFlag(
            "--shards above 1 needs --leader-elect: a shard's slots are claimed on its Lease"
        )
    return shard, epoch_pod


def shard_epoch(value: str) -> tuple[int, tuple[str, str] | None]:
    """--shard-epoch: a number, or pod:NAMESPACE/NAME (its epoch read at start: 0 until then)."""
    if value.startswith("pod:"):
        namespace, _, name = value[4:].partition("/")
        if not namespace or not name or "/" in name:
            raise ValueError(f"{value!r}: expected pod:NAMESPACE/NAME")
        return 0, (namespace, name)
    try:
        return int(value), None
    except ValueError:
        raise ValueError(f"{value!r}: expected a number, or pod:NAMESPACE/NAME") from None


def _ports(args: argparse.Namespace) -> tuple[Address, Address, Path | None]:
    """The two addresses and the heartbeat file, as the ports use them; the connection cap
    and the certificates' directory checked."""
    flag = "--metrics-address"
    try:
        metrics_address = address(args.metrics_address)
        flag = "--health-address"
        health_address = address(args.health_address)
        flag = "--max-connections"
        Limits(connections=args.max_connections)
        flag = "--heartbeat-file"
        heartbeat = heartbeat_file(args.heartbeat_file) if args.heartbeat_file else None
    except ValueError as exc:
        raise BadFlag(f"{flag}: {exc}") from None
    if args.metrics_cert_dir is not None and not os.path.isdir(args.metrics_cert_dir):
        raise BadFlag(f"--metrics-cert-dir: no such directory: {args.metrics_cert_dir}")
    return metrics_address, health_address, heartbeat


def _check_kubeconfig(args: argparse.Namespace) -> None:
    try:
        load_kubeconfig(args.kubeconfig)
    except (KubeconfigError, CredentialError) as exc:
        # no flag: the message names the file, the context and the field
        raise BadFlag(str(exc)) from None


def _lease_timings(args: argparse.Namespace) -> LeaseTimings:
    try:
        return LeaseTimings(args.lease_duration, args.renew_deadline, args.retry_period)
    except ValueError as exc:
        raise BadFlag(f"--lease-duration/--renew-deadline/--retry-period: {exc}") from None


def _delivery(args: argparse.Namespace) -> DeliveryConfig | None:
    if args.delivery_config is None:
        return None
    try:
        delivery = delivery_config.load(args.delivery_config)
        for sink in delivery.sinks:  # a sink that cannot sign is refused now, not at a death
            delivery_config.keys(sink)
    except ConfigError as exc:
        raise BadFlag(f"--delivery-config: {exc}") from None
    return delivery


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("deathwatch")
    except PackageNotFoundError:
        return "unknown"
