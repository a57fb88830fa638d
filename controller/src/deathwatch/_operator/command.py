"""`deathwatch controller`: run the operator."""

from __future__ import annotations

import argparse
import asyncio
import os
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
        help="the firewall DaemonSet whose coverage DeathWatch status reports",
    )
    p.add_argument(
        "--pod-label-selector",
        default=None,
        metavar="SELECTOR",
        help="only watch pods matching this label selector (server-side), e.g. app=sandbox",
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import kopf

    from deathwatch._operator import logs
    from deathwatch._operator.app import App, Config, register

    if args.firewall_daemonset is not None and args.firewall_daemonset.count("/") != 1:
        print(
            "deathwatch controller: --firewall-daemonset: expected NS/NAME, "
            f"got {args.firewall_daemonset!r}",
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
    logs.configure(args.log_level)
    config = Config(
        namespaces=tuple(dict.fromkeys(args.namespace)),
        kubeconfig=args.kubeconfig,
        http_host=args.http_host,
        http_port=args.http_port,
        firewall_daemonset=args.firewall_daemonset,
        pod_label_selector=args.pod_label_selector,
    )
    app = App(config)
    registry = kopf.OperatorRegistry()
    register(registry, app)
    asyncio.run(
        kopf.operator(
            registry=registry,
            clusterwide=config.clusterwide,
            namespaces=list(config.namespaces),
            standalone=True,
        )
    )
    return 0
