"""`deathwatch-firewall render|apply|check|cleanup|agent --config FILE`.

Exit codes: 0 done / table as configured; 1 the table differs or nft failed; 2 bad config or
usage (the message names the field and value).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

EXIT_OK, EXIT_FAILED, EXIT_BAD_CONFIG = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="deathwatch-firewall",
        description="Own the nftables table inet deathwatch on this node: refuse host and "
        "hostNetwork connections to sandbox agent ports.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (
        ("render", "print the nft script for the config"),
        ("apply", "replace the table atomically with the configured one"),
        ("check", "exit 0 only if the live table matches the config (readiness probe)"),
        ("cleanup", "delete the table (uninstall)"),
        ("agent", "apply, then keep it so: re-check every resyncSeconds, repair drift, reload"),
    ):
        a = sub.add_parser(name, help=text, description=text)
        a.add_argument("--config", required=name != "cleanup", help="YAML or JSON config file")
        if name == "agent":
            a.add_argument(
                "--metrics-port", type=int, default=9101, help="Prometheus /metrics port (0: off)"
            )
            a.add_argument("--metrics-host", default="0.0.0.0")  # noqa: S104 - Prometheus scrapes it
            a.add_argument(
                "--log-level", default="info", choices=("debug", "info", "warning", "error")
            )
    return p


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("deathwatch-firewall")
    except PackageNotFoundError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130


def run(args: argparse.Namespace) -> int:
    from deathwatch.firewall.config import ConfigError, load_config
    from deathwatch.firewall.nft import NftError, SystemNft
    from deathwatch.firewall.ruleset import desired
    from deathwatch.firewall.table import differences, script

    nft = SystemNft()
    if args.action == "cleanup":
        try:
            nft.delete_table()
        except NftError as exc:
            print(f"deathwatch-firewall cleanup: {exc}", file=sys.stderr)
            return EXIT_FAILED
        print("table inet deathwatch removed")
        return EXIT_OK
    if args.action == "agent":
        return _agent(args)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"deathwatch-firewall {args.action}: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    if args.action == "render":
        sys.stdout.write(script(desired(config)))
        return EXIT_OK
    try:
        if args.action == "apply":
            nft.apply(desired(config))
        diffs = differences(desired(config), nft.list_table())
    except NftError as exc:
        print(f"deathwatch-firewall {args.action}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if diffs:
        print(
            f"deathwatch-firewall {args.action}: the live table differs from the config:",
            file=sys.stderr,
        )
        for line in diffs:
            print(f"  {line}", file=sys.stderr)
        return EXIT_FAILED
    print("table inet deathwatch matches the config")
    return EXIT_OK


def _agent(args: argparse.Namespace) -> int:
    from prometheus_client import start_http_server

    from deathwatch.firewall import logs
    from deathwatch.firewall.agent import Agent
    from deathwatch.firewall.metrics import FirewallMetrics
    from deathwatch.firewall.nft import SystemNft

    logs.configure(args.log_level)
    metrics = FirewallMetrics()
    if args.metrics_port:
        start_http_server(args.metrics_port, args.metrics_host, registry=metrics.registry)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()  # the loop ends; the table stays (a rollout must never open the hole)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    Agent(args.config, SystemNft(), metrics).run(stop)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
