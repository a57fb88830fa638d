"""The README's first command, run as a user would (`python3 -m hack.demo`), and what it
may leave behind: for the demo's two lanes (tests/apiserver, tests/deploy)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def leftovers(tmp: Path) -> set[str]:
    """The demo's processes still running (not zombies): each names a path of its own under
    `tmp`, the demo's TMPDIR (its workdir, its cluster's, its node's), so a lane running
    beside it (hack/lanes.py) is not counted."""
    out = subprocess.run(
        ["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return {
        line.split(None, 2)[0]
        for line in out.splitlines()
        if str(tmp) in line and " Z" not in f" {line.split(None, 2)[1]}"
    }


@contextlib.contextmanager
def demo_tmp() -> Iterator[Path]:
    """A TMPDIR for one demo run: short, as its unix sockets' paths must be; removed after
    if the demo left it empty (what it left stays to be read)."""
    tmp = Path(tempfile.mkdtemp(prefix="dw-demo-"))
    try:
        yield tmp
    finally:
        with contextlib.suppress(OSError):
            tmp.rmdir()


def run_demo(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hack.demo", *args],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
