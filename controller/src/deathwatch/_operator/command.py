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
    p.add_argument(
        "--http-port", type=int, default=8080, help="/healthz, /readyz, /metrics (default 8080)"
    )
    p.add_argument("--http-host", default="0.0.0.0")  # noqa: S104 - probes and Prometheus
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
        "--pod-label-selector",
        default=None,
        metavar="SELECTOR",
        help="only watch pods matching this label selector (server-side), e.g. app=sandbox",
    )
    p.add_argument(
        "--agent-sandbox",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="watch agent-sandbox's Sandboxes (read-only; none installed is fine, and they are "
        "picked up once installed): verdicts name their Sandbox and claim, and say Suspended "
        "or Expired (default on)",
    )
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
    for flag, default, what in (
        ("--lease-duration", 15.0, "a standby takes over a lease unchanged this long"),
        ("--renew-deadline", 10.0, "a leader unable to renew this long stops writing"),
        ("--retry-period", 2.0, "how often to try to acquire or renew"),
    ):
        election.add_argument(flag, type=float, default=default, metavar="SECONDS", help=what)
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import asyncio  # here, not at the top: `deathwatch replay` and `--help` never need it

    import kopf

    from deathwatch._operator import logs
    from deathwatch._operator.app import App, Config, register
    from deathwatch._operator.leader import LeaseTimings

    if args.firewall_daemonset is not None and args.firewall_daemonset.count("/") != 1:
        print(
            "deathwatch controller: --firewall-daemonset: expected NS/NAME, "
            f"got {args.firewall_daemonset!r}",
            file=sys.stderr,
        )
        return EXIT_BAD_CONFIG
    if not 0.1 <= args.coverage_interval <= 300:
        print(
            "deathwatch controller: --coverage-interval: expected seconds in [0.1, 300], "
            f"got {args.coverage_interval}",
            file=sys.stderr,
        )
        return EXIT_BAD_CONFIG
    if not 0 < args.http_port < 65536:
        print(
            f"deathwatch controller: --http-port: not a TCP port: {args.http_port}", file=sys.stderr
        )
        return EXIT_BAD_CONFIG
    if args.kubeconfig:
        if not os.path.exists(args.kubeconfig):
            print(
                f"deathwatch controller: --kubeconfig: no such file: {args.kubeconfig}",
                file=sys.stderr,
            )
            return EXIT_BAD_CONFIG
        os.environ["KUBECONFIG"] = args.kubeconfig  # for kopf's own login as well
    try:
        timings = LeaseTimings(args.lease_duration, args.renew_deadline, args.retry_period)
    except ValueError as exc:
        print(f"deathwatch controller: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    if not args.identity:
        print("deathwatch controller: --identity: empty", file=sys.stderr)
        return EXIT_BAD_CONFIG
    logs.configure(args.log_level)
    config = Config(
        namespaces=tuple(dict.fromkeys(args.namespace)),
        kubeconfig=args.kubeconfig,
        http_host=args.http_host,
        http_port=args.http_port,
        firewall_daemonset=args.firewall_daemonset,
        coverage_interval=args.coverage_interval,
        pod_label_selector=args.pod_label_selector,
        agent_sandbox=args.agent_sandbox,
        leader_elect=args.leader_elect,
        identity=args.identity,
        lease_name=args.lease_name,
        lease_namespace=args.lease_namespace,
        lease_timings=timings,
    )
    app = App(config)
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
