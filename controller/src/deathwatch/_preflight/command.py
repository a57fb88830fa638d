"""`deathwatch preflight` (also `kubectl deathwatch preflight`): read a live cluster before
installing deathwatch, and say, one line each with its fix, what will and will not work: the
Kubernetes version, the pod ranges, pods whose kubelet probes the firewall would refuse, what
the DeathWatches select, agent-sandbox, kube-proxy's mode, the CNI.

Read-only (get and list); a read the role may not make is said (`skip`), not fatal. Exit 0
when nothing failed, 1 when a check failed, 2 on bad input, and as `deathwatch wait` when the
API server cannot be asked at all: 3 unreachable, 4 kubeconfig, 5 credentials, 6 refused.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any, TextIO

EXIT_OK, EXIT_FAILED = 0, 1  # and deathwatch._cli_api's, when the API cannot be asked


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"--agent-port {text!r}: not a TCP port 1-65535")
    return int(text)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "preflight",
        help="read a cluster before install: what will and will not work, and each fix",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("--kubeconfig", default=None, help="else in-cluster, $KUBECONFIG, ~/.kube")
    p.add_argument("--context", default=None, help="a kubeconfig context, not the current")
    p.add_argument("--agent-port", type=_port, action="append", default=None, metavar="PORT",
                   help="the sandbox agent's port (repeatable; default 49983, and every "
                   "DeathWatch's spec.agentPorts)")  # fmt: skip
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    from deathwatch._api.rest import Rest
    from deathwatch._cli_api import cannot_ask, load
    from deathwatch._kube.errors import KubeError
    from deathwatch._preflight.checks import Level, findings

    out, err = out or sys.stdout, err or sys.stderr
    loaded = load("preflight", args.kubeconfig, args.context, err)
    if isinstance(loaded, int):
        return loaded

    async def read() -> Any:
        from deathwatch._preflight.reads import read_cluster

        rest = Rest(loaded.configuration, identity="preflight", purpose="preflight")
        try:
            return await read_cluster(rest)
        finally:
            await rest.close()

    try:
        cluster = asyncio.run(read())
    except (KubeError, OSError, TimeoutError) as exc:
        return cannot_ask("preflight", exc, loaded, err)
    found = findings(cluster, args.agent_port or [49983])
    if args.output == "json":
        doc = {"server": loaded.server, "findings": [f.as_dict() for f in found]}
        out.write(json.dumps(doc, indent=2) + "\n")
    else:
        out.write(text(found, loaded.server))
    return EXIT_FAILED if any(f.level is Level.FAIL for f in found) else EXIT_OK


def text(found: list[Any], server: str) -> str:
    width = max(len(f.check) for f in found)
    lines = [f"deathwatch preflight: {server}"]
    for f in found:
        lines.append(f"{f.level.value:<5} {f.check:<{width}}  {f.said}")
        if f.fix:
            lines.append(f"{'':<5} {'':<{width}}  fix: {f.fix}")
    counts = {level: sum(1 for f in found if f.level.value == level)
              for level in ("ok", "warn", "fail", "skip")}  # fmt: skip
    lines.append(", ".join(f"{n} {level}" for level, n in counts.items() if n))
    return "\n".join(lines) + "\n"
