"""`deathwatch controller`: run the operator."""

from __future__ import annotations

import argparse
import os
import socket
import sys

EXIT_BAD_CONFIG = 2


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "controller",
        help="run the operator: watch sandbox pods, publish SandboxVerdicts",
        description="Watch sandbox pods selected by DeathWatch objects and publish their verdicts.",
    )
    p.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        metavar="NS",
        help="a namespace to serve (repeatable); default: all namespaces",
    )
    p.add_argument(
        "--kubeconfig", default=None, help="kubeconfig (default: in-cluster, else $KUBECONFIG)"
    )
    _ports(p)
    _firewall_and_releases(p)
    _sources(p)
    _shards(p)
    _election(p)
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.set_defaults(run=run)


def _ports(p: argparse.ArgumentParser) -> None:
    """What the controller serves, to whom, and what a client may hold."""
    ports = p.add_argument_group(
        "ports", "what the controller serves, to whom, and what a client may hold (ADR 0020)"
    )
    ports.add_argument(
        "--metrics-address",
        default=":8443",
        metavar="HOST:PORT",
        help="HTTPS: /metrics to whom RBAC lets get it (TokenReview + SubjectAccessReview), "
        "/readyz (its details to the same), /healthz (default :8443)",
    )
    ports.add_argument(
        "--health-address",
        default=":8081",
        metavar="HOST:PORT",
        help="HTTP, for the kubelet: /healthz and /readyz, up or down (default :8081)",
    )
    ports.add_argument(
        "--heartbeat-file",
        default=None,
        metavar="PATH",
        help='write the heartbeat there every second ("ok", or why not), for an exec '
        "liveness probe that no neighbour on the health port's address can starve (the chart's)",
    )
    ports.add_argument(
        "--metrics-cert-dir",
        default=None,
        metavar="DIR",
        help="tls.crt and tls.key for the metrics port (e.g. a cert-manager Secret), read again "
        "when they change; default: a self-signed certificate made at start",
    )
    ports.add_argument(
        "--max-connections",
        type=int,
        default=1024,
        metavar="N",
        help="connections the metrics port holds at once, at most half the open-files limit "
        "(raised to its hard limit at start), 64 from one address; past it, the address "
        "holding the most makes room, else one that has waited 2 s unanswered is closed for "
        "the newcomer, else the newcomer is (default 1024)",
    )


def _firewall_and_releases(p: argparse.ArgumentParser) -> None:
    """The firewall whose coverage the verdicts report; the other releases weighed against it."""
    p.add_argument(
        "--firewall-daemonset",
        default=None,
        metavar="NS/NAME",
        help="the firewall DaemonSet whose coverage DeathWatch status reports; its "
        "namespace holds the agents' coverage Leases, from which every verdict gets Shielded",
    )
    p.add_argument(
        "--coverage-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how often the firewall coverage Leases are listed (default 5)",
    )
    p.add_argument(
        "--crds-release",
        default=None,
        metavar="NAMESPACE/RELEASE",
        help="this release applies the CRDs, as NAMESPACE/RELEASE: another release found "
        "applying them too is said (ADR 0038); default: it does not",
    )
    p.add_argument(
        "--release-check-interval",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how often the other deathwatch releases are read for what they share with this "
        "one (with --lease-owner: ADR 0038; default 30)",
    )


def _sources(p: argparse.ArgumentParser) -> None:
    """What the controller watches and where it delivers."""
    p.add_argument(
        "--watch-open-deadline",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="a watched collection not listed this long after its watch began is named in "
        "/readyz (watches_not_open), the deathwatch_watch_not_open metric and a log line; "
        "start-up keeps waiting for it (default 30: one API call's cap)",
    )
    p.add_argument(
        "--pod-label-selector",
        default=None,
        metavar="SELECTOR",
        help="only watch pods matching this label selector (server-side), e.g. app=sandbox",
    )
    p.add_argument(
        "--controller-id",
        default="",
        metavar="ID",
        help="serve only the DeathWatches annotated deathwatch.dev/controller-id=ID (default: "
        "those without it): a second release in one cluster serves its own; whichever serves "
        "them, the oldest DeathWatch in a namespace that selects a pod judges it",
    )
    p.add_argument(
        "--agent-sandbox",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="watch agent-sandbox's Sandboxes (read-only; none installed is fine, and they are "
        "picked up once installed): verdicts name their Sandbox and claim, and say Suspended "
        "or Expired (default on)",
    )
    p.add_argument(
        "--node-exits",
        default=None,
        metavar="NAMESPACE",
        help="watch the node agents' exits Leases in NAMESPACE (deathwatch-firewall exits): a "
        "container's exit heard on its node is judged at once, before the kubelet's next "
        "relist (ADR 0028); default off",
    )
    p.add_argument(
        "--delivery-config",
        default=None,
        metavar="FILE",
        help="the sinks verdicts are delivered to, as signed CloudEvents (YAML: cluster, sinks; "
        "docs/delivery.md); read at start, each sink's keys at every send",
    )


def _shards(p: argparse.ArgumentParser) -> None:
    """Past one replica pair: its shard."""
    shards = p.add_argument_group(
        "shards",
        "past one replica pair: N shards, each a leader and a hot standby on a Lease "
        "of its own, each judging the pods of its slots (ADR 0025)",
    )
    shards.add_argument("--shards", type=int, default=1, metavar="N",
                        help="how many shards judge the cluster's sandboxes (1-64; default 1: "
                        "this process's pair judges all of them, as ever)")  # fmt: skip
    shards.add_argument("--shard", type=int, default=0, metavar="I",
                        help="which of them this process is (0 .. N-1)")  # fmt: skip
    shards.add_argument("--shard-epoch", default="0", metavar="E|pod:NAMESPACE/NAME",
                        help="the configuration's epoch: a reshard must come with a higher one; "
                        "the older shards give up the slots the newer ones are assigned. "
                        "pod:NAMESPACE/NAME: that pod's creation, in seconds (the chart: the "
                        "replica's own pod; a reshard's pods are created after the ones they "
                        "replace, however the chart was rendered: helm upgrade, helm template, "
                        "Argo CD)")  # fmt: skip


def _election(p: argparse.ArgumentParser) -> None:
    """Who writes: the Lease and its timings."""
    election = p.add_argument_group(
        "leader election", "replicas elect one writer on a Lease; the others stand by, hot"
    )
    election.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="elect a leader (default); --no-leader-elect: this process is the only writer",
    )
    election.add_argument(
        "--identity",
        default=os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or socket.gethostname(),
        help="this replica's name on the Lease and as field manager (default: $POD_NAME)",
    )
    election.add_argument("--lease-name", default="deathwatch-controller")
    election.add_argument(
        "--lease-namespace", default=os.environ.get("POD_NAMESPACE") or "deathwatch-system"
    )
    election.add_argument(
        "--lease-owner",
        metavar="DEPLOYMENT",
        help="this replica's Deployment (in the Lease's namespace): the Lease is deleted with "
        "it (an uninstall takes the Lease, and no next install waits on it), and another "
        "release serving the same DeathWatches is weighed against it, with or without "
        "election (ADR 0038)",
    )
    for flag, default, what in (
        ("--lease-duration", 15.0, "a standby takes over a lease unchanged this long"),
        ("--renew-deadline", 10.0, "a leader unable to renew this long stops writing"),
        ("--retry-period", 2.0, "how often to try to acquire or renew"),
    ):
        election.add_argument(flag, type=float, default=default, metavar="SECONDS", help=what)


def run(args: argparse.Namespace) -> int:
    import asyncio  # here, not at the top: `deathwatch replay` and `--help` never need it
    import logging
    from dataclasses import replace

    import kopf
    import structlog

    from deathwatch._kube import logs
    from deathwatch._kube.serving import Limits, connection_cap, raise_open_files
    from deathwatch._kube.tls import CertificateError
    from deathwatch._operator.process.app import App
    from deathwatch._operator.process.config import BadFlag, Config
    from deathwatch._operator.process.lifecycle import register

    try:
        config = Config.from_args(args)  # before anything starts or logs
    except BadFlag as exc:
        print(f"deathwatch controller: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    if config.kubeconfig:
        os.environ["KUBECONFIG"] = config.kubeconfig  # for kopf's own login as well
    # kopf's per-object chatter at INFO is one line per handler call: kept at WARNING
    logs.configure(args.log_level, quiet={"kopf": logging.WARNING, "urllib3": logging.ERROR,
                                          "aiohttp.access": logging.WARNING})  # fmt: skip
    # as Go's runtime does: containerd 2.x leaves a Python process 1,024 descriptors, which a
    # neighbour holding connections to our ports would take from the API's (ADR 0020)
    soft, hard = raise_open_files()
    limits = Limits(connections=connection_cap(args.max_connections, soft), evict_after=2.0)
    structlog.get_logger("deathwatch").info("open files", limit=soft, hard_limit=hard,
                                            metrics_connections=limits.connections)  # fmt: skip
    config = replace(config, port_limits=limits)
    try:
        app = App(config)
        app.build()
    except CertificateError as exc:
        print(f"deathwatch controller: metrics TLS: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG

    registry = kopf.OperatorRegistry()
    register(registry, app)
    asyncio.run(
        kopf.operator(
            registry=registry,
            clusterwide=not config.namespaces,
            namespaces=list(config.namespaces),
            standalone=True,
        )
    )
    return 0
