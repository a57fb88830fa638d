"""The `deathwatch` command: one entry point, a subcommand per job (`replay`, `controller`,
`wait`, `explain`, `preflight`).

The node firewall is its own distribution and command, `deathwatch-firewall`: the privileged
agent image carries nothing of this one.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def _version() -> str:
    try:
        return version("deathwatch")
    except PackageNotFoundError:
        return "unknown"


# each command's module. Only the one asked for is imported: a replay's start is part of what
# its user waits for, and the other commands' imports (asyncio, the API client's) were 40 ms
# of it; with no command named (`--help`), every one.
COMMANDS: dict[str, str] = {
    "replay": "deathwatch._replay.command",
    "controller": "deathwatch._operator.process.command",
    "wait": "deathwatch._verdicts.command",
    "explain": "deathwatch._verdicts.command",
    "preflight": "deathwatch._preflight.command",
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of the one `argv` names first."""
    args = list(sys.argv[1:] if argv is None else argv)
    named = COMMANDS.get(args[0]) if args else None
    # installed twice: `deathwatch`, and `kubectl-deathwatch` for `kubectl deathwatch ...`
    plugin = Path(sys.argv[0]).name.startswith("kubectl-")
    parser = argparse.ArgumentParser(
        prog="kubectl deathwatch" if plugin else "deathwatch",
        description="Sandbox death verdicts for Kubernetes (firewall: deathwatch-firewall).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in [named] if named else dict.fromkeys(COMMANDS.values()):
        module = importlib.import_module(name)
        (getattr(module, "add_parsers", None) or module.add_parser)(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(argv)
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
