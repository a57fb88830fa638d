"""The `deathwatch` command: one entry point, a subcommand per job (`replay`, `controller`,
`wait`, `explain`, `preflight`).

The node firewall is its own distribution and command, `deathwatch-firewall`: the privileged
agent image carries nothing of this one.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def _version() -> str:
    try:
        return version("deathwatch")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    from deathwatch._operator import command as controller_command
    from deathwatch._preflight import command as preflight_command
    from deathwatch._replay import command as replay_command
    from deathwatch._verdicts import command as verdicts_command

    # installed twice: `deathwatch`, and `kubectl-deathwatch` for `kubectl deathwatch ...`
    plugin = Path(sys.argv[0]).name.startswith("kubectl-")
    parser = argparse.ArgumentParser(
        prog="kubectl deathwatch" if plugin else "deathwatch",
        description="Sandbox death verdicts for Kubernetes (firewall: deathwatch-firewall).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    replay_command.add_parser(sub)
    controller_command.add_parser(sub)
    verdicts_command.add_parsers(sub)
    preflight_command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `deathwatch replay ... | head`: the reader left; that is not an error of ours
        sys.stderr.close()
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
