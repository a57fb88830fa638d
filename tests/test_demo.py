"""The README's first command does what it says: runs, judges every sandbox as expected,
exits 0 and leaves nothing running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import _binaries_or_skip

pytestmark = pytest.mark.apiserver
ROOT = Path(__file__).resolve().parent.parent


def _ours() -> set[str]:
    out = subprocess.run(
        ["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True, check=True
    ).stdout
    return {
        line.split(None, 2)[0]
        for line in out.splitlines()
        if "deathwatch-demo-" in line and " Z" not in f" {line.split(None, 2)[1]}"
    }


def test_demo_runs_to_the_expected_verdicts_and_cleans_up() -> None:
    _binaries_or_skip()
    result = subprocess.run(
        [sys.executable, "-m", "hack.demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "all 12 verdicts as expected" in result.stdout
    assert "SandboxDead" in result.stdout
    assert "ProbeBlockedByFirewall" in result.stdout
    assert _ours() == set()
