"""The `deathwatch` command: one entry point, a subcommand per job."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    from controller.operator import command as controller_command
    from controller.replay import command as replay_command
    from firewall import cli as firewall_cli

    parser = argparse.ArgumentParser(
        prog="deathwatch",
        description="Sandbox death verdicts for Kubernetes, and the node firewall guarding them.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    replay_command.add_parser(sub)
    controller_command.add_parser(sub)
    firewall_cli.add_parser(sub)
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
