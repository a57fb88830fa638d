"""The README's first command, run as a user would (`python3 -m hack.demo`), and what it
may leave behind: for the demo's two lanes (tests/apiserver, tests/deploy)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def leftovers() -> set[str]:
    """Our processes still running (not zombies): the demo's and its local cluster's."""
    out = subprocess.run(
        ["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return {
        line.split(None, 2)[0]
        for line in out.splitlines()
        if ("deathwatch-demo-" in line or "deathwatch-cluster-" in line)
        and " Z" not in f" {line.split(None, 2)[1]}"
    }


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hack.demo", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
