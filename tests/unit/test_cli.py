"""The `deathwatch` command's entry point: each command's parser, and only the one asked for
imported (a replay's start is part of what its user waits for: docs/performance.md)."""

from __future__ import annotations

import subprocess
import sys

from deathwatch._cli import COMMANDS, build_parser

LOADED = (
    "import sys; from deathwatch._cli import build_parser; build_parser({argv!r}); "
    "print(sorted(m for m in sys.modules if m.startswith('deathwatch._') "
    "and m.endswith('.command')))"
)


def _commands_imported(argv: list[str]) -> str:
    done = subprocess.run([sys.executable, "-c", LOADED.format(argv=argv)],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return done.stdout.strip()


def test_a_command_imports_its_own_module_only() -> None:
    assert _commands_imported(["replay", "recording.json"]) == "['deathwatch._replay.command']"
    assert _commands_imported(["wait", "--for", "Dead"]) == "['deathwatch._verdicts.command']"


def test_with_no_command_named_every_one_is_offered() -> None:
    assert _commands_imported(["--help"]).count("command") == 4
    usage = build_parser([]).format_help()
    assert all(name in usage for name in COMMANDS)
    # a command misspelt is told with every choice
    done = subprocess.run([sys.executable, "-m", "deathwatch._cli", "replya"],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2 and "choose from 'replay', 'controller'" in done.stderr
