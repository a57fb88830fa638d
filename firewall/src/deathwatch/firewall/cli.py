"""`deathwatch-firewall render|apply|check|cleanup|agent --config FILE`, and
`deathwatch-firewall exits`: the node's container exits, heard and published (ADR 0028).

Exit codes: 0 done / table as configured; 1 the table differs or nft failed; 2 bad config or
usage (the message names the field and value).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from deathwatch._kube.exits import LEASE_PREFIX as EXITS_PREFIX
from deathwatch.firewall.coverage import LEASE_PREFIX
from deathwatch.firewall.table import NAME, TABLE_NAME

if TYPE_CHECKING:
    from deathwatch.firewall.kubeapi import KubeApi

EXIT_OK, EXIT_FAILED, EXIT_BAD_CONFIG = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="deathwatch-firewall",
        description="Own an nftables table (inet deathwatch, or --table) on this node: refuse "
        "host and hostNetwork connections to sandbox agent ports.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    _exits_parser(sub)
    for name, text in (
        ("render", "print the nft script for the config"),
        ("apply", "replace the table atomically with the configured one"),
        ("check", "exit 0 only if the live table matches the config (readiness probe)"),
        ("cleanup", "delete the table (uninstall)"),
        ("agent", "apply, then keep it so: re-check every resyncSeconds, repair drift, reload"),
    ):
        a = sub.add_parser(name, help=text, description=text)
        a.add_argument("--config", required=name != "cleanup", help="YAML or JSON config file")
        a.add_argument(
            "--table", default=NAME, type=_table,
            help="the table, inet TABLE (default: deathwatch): each release owns its own, "
            "and touches no other (the chart: firewall.table)",
        )  # fmt: skip
        if name in ("render", "apply", "check", "agent"):
            a.add_argument(
                "--sandbox",
                action="append",
                default=[],
                type=_address,
                metavar="IP",
                help="a sandbox address on this node, for the inbound rule (repeatable); in a "
                "cluster the agent lists them from the API instead. check without it compares "
                "the sandbox sets but for their elements",
            )
            a.add_argument(
                "--host-address",
                action="append",
                default=[],
                type=_address,
                metavar="IP",
                help="a host's own address inside the pod ranges (an overlay tunnel's), refused "
                "inbound like a non-pod source (repeatable); in a cluster the agent learns them "
                "from the Node objects",
            )
        if name in ("check", "agent"):
            a.add_argument(
                "--state-file",
                default=None,
                help="agent: write what it applied there; check: compare the live table with "
                "it, not with the config alone (the table also holds the pod ranges learned "
                "from the nodes); missing: not applied yet",
            )
        if name == "agent":
            a.add_argument(
                "--node-name",
                default=os.environ.get("NODE_NAME"),
                help="this node (env NODE_NAME): with it the agent lists the node's "
                "sandboxes and publishes its coverage Lease; without it, it keeps the table",
            )
            a.add_argument(
                "--namespace",
                default=os.environ.get("POD_NAMESPACE", "deathwatch-system"),
                help="where the coverage Lease lives (env POD_NAMESPACE)",
            )
            a.add_argument(
                "--identity",
                default=os.environ.get("POD_NAME"),
                help="the agent's pod (env POD_NAME)",
            )
            a.add_argument(
                "--lease-prefix", default=LEASE_PREFIX, metavar="PREFIX",
                help="the coverage Lease is PREFIX.NODE (the chart: RELEASE-firewall; its "
                "admission policy admits no other name from this node's agent)",
            )  # fmt: skip
            a.add_argument(
                "--remove-on-uninstall", metavar="DAEMONSET", default=None,
                help="this agent's DaemonSet (in --namespace): when the agent stops and finds "
                "it gone or being deleted (an uninstall, never a rollout), it removes the "
                "table; without it the table always stays",
            )  # fmt: skip
            a.add_argument(
                "--daemonset", metavar="DAEMONSET", default=None,
                help="this agent's DaemonSet (in --namespace): another release's firewall, "
                "applied first, on the same table makes this agent leave the table alone "
                "(ADR 0038); without it nothing is checked",
            )  # fmt: skip
            a.add_argument("--kube-api", help="API server URL (default: in-cluster)")
            a.add_argument("--nft", default="nft", help="the nft program (default: nft)")
            a.add_argument("--kube-token-file", help="bearer token file (with --kube-api)")
            a.add_argument("--kube-ca-file", help="CA bundle (with --kube-api)")
            a.add_argument(
                "--metrics-port", type=int, default=9101,
                help="the /metrics port (0: off): HTTPS, to whom RBAC lets get /metrics",
            )  # fmt: skip
            a.add_argument(
                "--metrics-host", default=None,
                help="its address (default: every address in a cluster; 127.0.0.1 without "
                "one, where plain HTTP and loopback only)",
            )  # fmt: skip
            a.add_argument(
                "--metrics-cert-dir", default=None,
                help="tls.crt and tls.key for the metrics port (default: self-signed)",
            )  # fmt: skip
            a.add_argument(
                "--heartbeat-file", default=None, metavar="PATH",
                help="write the heartbeat there at every turn of its loop, for an exec "
                "liveness probe no neighbour on the node's addresses can starve",
            )  # fmt: skip
            a.add_argument(
                "--log-level", default="info", choices=("debug", "info", "warning", "error")
            )
    return p


def _exits_parser(sub: Any) -> None:
    text = ("hear this node's container exits from the runtime and publish them on its exits "
            "Lease, for the controller (ADR 0028)")  # fmt: skip
    a = sub.add_parser("exits", help=text, description=text)
    a.add_argument(
        "--runtime-socket", default="", metavar="PATH",
        help="the container runtime's socket on the host: containerd's own task events "
        "(containerd), CRI events (CRI-O); empty: the first that answers of the known ones "
        "(containerd's, k3s and RKE2's, CRI-O's: ADR 0031). One that is missing or does not "
        "answer is said (a log line, a metric, the exits Lease) and tried again: the "
        "kubelet's reports judge deaths meanwhile",
    )  # fmt: skip
    a.add_argument(
        "--host-root", default="", metavar="PATH",
        help="where the host's /run is mounted, as PATH/run (the chart: /host); empty: the "
        "socket's path is this container's own",
    )  # fmt: skip
    a.add_argument(
        "--runtime-stream", choices=("auto", "cri", "containerd"), default="auto",
        help="which of the runtime's event streams to read: auto (containerd's task events on "
        "containerd, the sooner; CRI elsewhere), cri (containerd >= 2, CRI-O), containerd",
    )  # fmt: skip
    a.add_argument(
        "--oom-wait", type=_seconds, default=0.02, metavar="SECONDS",
        help="containerd's events: how long a SIGKILL's exit (137) waits for the OOM event "
        "that may follow it (0: never), unless its memory cgroup counts no OOM kill",
    )  # fmt: skip
    a.add_argument(
        "--cgroup-root", default="", metavar="PATH",
        help="the host's cgroup tree (/sys/fs/cgroup), mounted read-only: a SIGKILL's exit "
        "whose memory cgroup counts no OOM kill is published at once, not after --oom-wait "
        "(empty: every SIGKILL waits)",
    )  # fmt: skip
    a.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                   help="this node (env NODE_NAME)")  # fmt: skip
    a.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "deathwatch-system"),
                   help="where the exits Lease lives (env POD_NAMESPACE)")  # fmt: skip
    a.add_argument("--identity", default=os.environ.get("POD_NAME"),
                   help="this agent's pod (env POD_NAME)")  # fmt: skip
    a.add_argument(
        "--lease-prefix", default=EXITS_PREFIX, metavar="PREFIX",
        help="the exits Lease is PREFIX.NODE (the chart: RELEASE-exits; its admission policy "
        "admits no other name from this node's agent)",
    )  # fmt: skip
    a.add_argument("--kube-api", help="API server URL (default: in-cluster)")
    a.add_argument("--kube-token-file", help="bearer token file (with --kube-api)")
    a.add_argument("--kube-ca-file", help="CA bundle (with --kube-api)")
    a.add_argument("--metrics-port", type=int, default=9102,
                   help="/metrics, /healthz, /readyz (0: off): HTTPS, to whom RBAC lets get "
                   "/metrics")  # fmt: skip
    a.add_argument("--metrics-host", default="0.0.0.0",  # noqa: S104 - TokenReview guards it
                   help="its address")  # fmt: skip
    a.add_argument(
        "--metrics-cert-dir",
        default=None,
        help="tls.crt and tls.key for the metrics port (default: self-signed)",
    )
    a.add_argument("--heartbeat-file", default=None, metavar="PATH",
                   help="write the heartbeat there every second, for an exec liveness probe "
                   "no neighbour on the node's addresses can starve")  # fmt: skip
    a.add_argument("--log-level", default="info",
                   choices=("debug", "info", "warning", "error"))  # fmt: skip


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value <= 5:
        raise argparse.ArgumentTypeError(f"between 0 and 5 seconds: {text!r}")
    return value


def _table(text: str) -> str:
    if not TABLE_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"not a table name (a letter, then up to 62 letters, digits, - _ .): {text!r}"
        )
    return text


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IP address: {text!r}") from None


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
    from deathwatch._kube.configfile import ConfigError
    from deathwatch.firewall.config import load_config
    from deathwatch.firewall.nft import NftError, SystemNft
    from deathwatch.firewall.ruleset import POD_SETS, SANDBOX_SETS, desired
    from deathwatch.firewall.table import differences, load_state, script

    if args.action == "exits":
        return _exits(args)
    nft = SystemNft(table=args.table)
    if args.action == "cleanup":
        try:
            nft.delete_table()
        except NftError as exc:
            print(f"deathwatch-firewall cleanup: {exc}", file=sys.stderr)
            return EXIT_FAILED
        print(f"table inet {args.table} removed")
        return EXIT_OK
    if args.action == "agent":
        return _agent(args)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"deathwatch-firewall {args.action}: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    hosts = [*args.host_address, *config.extra_host_addresses]
    want = desired(config, args.sandbox, hosts, args.table)
    if args.action == "render":
        sys.stdout.write(script(want))
        return EXIT_OK
    # the readiness probe knows no sandbox addresses: the agent keeps those sets
    loose: tuple[str, ...] = (
        SANDBOX_SETS if args.action == "check" and not (args.sandbox or args.host_address) else ()
    )
    if args.action == "check" and args.state_file:
        try:
            applied, want = load_state(Path(args.state_file).read_bytes())
        except FileNotFoundError:
            print("deathwatch-firewall check: the agent has applied no table yet", file=sys.stderr)
            return EXIT_FAILED
        except (OSError, ValueError) as exc:
            print(f"deathwatch-firewall check: --state-file: {exc}", file=sys.stderr)
            return EXIT_FAILED
        if applied != config.digest():
            print("deathwatch-firewall check: the agent has not applied this config yet",
                  file=sys.stderr)  # fmt: skip
            return EXIT_FAILED
        # its elements change with every sandbox and node: the agent's, between two probes
        loose = (*SANDBOX_SETS, *POD_SETS)
    try:
        if args.action == "apply":
            nft.apply(want)
        diffs = differences(want, nft.list_table(), loose)
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
    print(f"table inet {args.table} matches the config")
    return EXIT_OK


def _kube_api(args: argparse.Namespace) -> KubeApi:
    """The API server both containers talk to: --kube-api with its token and CA (a host
    process, the lanes), else the pod's own service account (raises NotInCluster)."""
    from deathwatch.firewall.kubeapi import KubeApi

    if not args.kube_api:
        return KubeApi.in_cluster()
    return KubeApi(
        args.kube_api.rstrip("/"),
        Path(args.kube_token_file or "/dev/null"),
        Path(args.kube_ca_file) if args.kube_ca_file else None,
    )


def _agent(args: argparse.Namespace) -> int:
    from deathwatch._kube import logs
    from deathwatch._kube.ports import Heartbeat, heartbeat_file
    from deathwatch._kube.serving import Limits, connection_cap, raise_open_files
    from deathwatch._kube.tls import CertificateError
    from deathwatch.firewall.agent import Agent, ClusterLink
    from deathwatch.firewall.endpoint import OpenPort, listener
    from deathwatch.firewall.kubeapi import NotInCluster
    from deathwatch.firewall.metrics import FirewallMetrics
    from deathwatch.firewall.nft import SystemNft

    logs.configure(args.log_level)
    link = None
    if args.remove_on_uninstall and not args.node_name:
        print("deathwatch-firewall agent: --remove-on-uninstall needs --node-name (env "
              "NODE_NAME): the DaemonSet is read from the API", file=sys.stderr)  # fmt: skip
        return EXIT_BAD_CONFIG
    if args.node_name:
        try:
            api = _kube_api(args)
        except NotInCluster as exc:
            print(f"deathwatch-firewall agent: {exc}", file=sys.stderr)
            return EXIT_BAD_CONFIG
        if not args.identity:
            print("deathwatch-firewall agent: --identity (env POD_NAME) is required with "
                  "--node-name", file=sys.stderr)  # fmt: skip
            return EXIT_BAD_CONFIG
        link = ClusterLink(api, args.node_name, args.identity, args.namespace,
                           args.remove_on_uninstall, args.lease_prefix,
                           args.daemonset)  # fmt: skip
    metrics = FirewallMetrics()
    try:
        beats = heartbeat_file(args.heartbeat_file) if args.heartbeat_file else None
    except ValueError as exc:
        print(f"deathwatch-firewall agent: --heartbeat-file: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    heartbeat = Heartbeat(stalled_after=300.0, file=beats)
    # a neighbour holding connections must not take the descriptors the API's calls need
    soft, _ = raise_open_files()
    # 512: a TLS connection is ~30 KiB held, ~65 KiB while a fleet churns it: 1,024 slots
    # took the agent to 114 MiB of its 128 Mi (bench/ports_bench.py)
    limits = Limits(connections=connection_cap(512, soft), evict_after=2.0)
    port = None
    if args.metrics_port:
        host = args.metrics_host or ("0.0.0.0" if link else "127.0.0.1")  # noqa: S104
        try:
            port = listener(host, args.metrics_port, metrics.registry, heartbeat,
                            link.api if link else None,
                            Path(args.metrics_cert_dir) if args.metrics_cert_dir else None,
                            (args.identity or "", args.node_name or ""), limits)  # fmt: skip
            port.start()
        except (OpenPort, CertificateError, OSError) as exc:
            print(f"deathwatch-firewall agent: --metrics-host/--metrics-port: {exc}",
                  file=sys.stderr)  # fmt: skip
            return EXIT_BAD_CONFIG
    stop = threading.Event()
    agent = Agent(args.config, SystemNft(args.nft, args.table), metrics, link, args.sandbox,
                  args.host_address, heartbeat=heartbeat,
                  state_file=Path(args.state_file) if args.state_file else None)  # fmt: skip

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()  # the loop ends; the table stays unless this is an uninstall (Agent.leave)
        agent.wake.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.run(stop)
    if port is not None:
        port.stop()
    return EXIT_OK


def _exits(args: argparse.Namespace) -> int:
    from deathwatch._kube import logs
    from deathwatch._kube.ports import Heartbeat, heartbeat_file
    from deathwatch._kube.serving import Limits
    from deathwatch._kube.tls import CertificateError
    from deathwatch.firewall.cgroups import OomKills
    from deathwatch.firewall.endpoint import OpenPort, listener
    from deathwatch.firewall.exits import ExitListener, ExitsMetrics, Publisher
    from deathwatch.firewall.kubeapi import NotInCluster
    from deathwatch.firewall.runtime import candidates, connect_any

    logs.configure(args.log_level)
    for flag, value in (("--node-name (env NODE_NAME)", args.node_name),
                        ("--identity (env POD_NAME)", args.identity)):  # fmt: skip
        if not value:
            print(f"deathwatch-firewall exits: {flag} is required", file=sys.stderr)
            return EXIT_BAD_CONFIG
    try:
        api = _kube_api(args)
    except NotInCluster as exc:
        print(f"deathwatch-firewall exits: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    metrics = ExitsMetrics()
    try:
        beats = heartbeat_file(args.heartbeat_file) if args.heartbeat_file else None
    except ValueError as exc:
        print(f"deathwatch-firewall exits: --heartbeat-file: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    heartbeat = Heartbeat(stalled_after=60.0, file=beats)
    stop = threading.Event()
    publisher = Publisher(api, args.node_name, args.namespace, args.identity, args.lease_prefix)
    prefer = args.runtime_stream
    oom_kills = None
    if args.cgroup_root:
        if not Path(args.cgroup_root).is_dir():
            print(f"deathwatch-firewall exits: --cgroup-root: {args.cgroup_root} is not a "
                  "directory (mount the host's /sys/fs/cgroup there)", file=sys.stderr)  # fmt: skip
            return EXIT_BAD_CONFIG
        oom_kills = OomKills(Path(args.cgroup_root))
    sockets = candidates(args.runtime_socket, args.host_root)
    heard = ExitListener(", ".join(host for host, _ in sockets), publisher, metrics, heartbeat,
                        stop, args.oom_wait,
                        lambda _, wait: connect_any(sockets, wait, prefer=prefer,
                                                    oom_kills=oom_kills))  # fmt: skip
    port = None
    if args.metrics_port:
        try:
            port = listener(args.metrics_host, args.metrics_port, metrics.registry, heartbeat,
                            api, Path(args.metrics_cert_dir) if args.metrics_cert_dir else None,
                            (args.identity, args.node_name), Limits(),
                            readiness=heard.report)  # fmt: skip
            port.start()
        except (OpenPort, CertificateError, OSError) as exc:
            print(f"deathwatch-firewall exits: --metrics-host/--metrics-port: {exc}",
                  file=sys.stderr)  # fmt: skip
            return EXIT_BAD_CONFIG

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    heard.run()
    if port is not None:
        port.stop()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
