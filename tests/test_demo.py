"""The README's first command does what it says: runs, judges every sandbox as expected,
exits 0 and leaves nothing running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hack.localcluster import cluster
from tests.conftest import _binaries_or_skip

ROOT = Path(__file__).resolve().parent.parent


def _ours() -> set[str]:
    out = subprocess.run(
        ["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True, check=True
    ).stdout
    return {
        line.split(None, 2)[0]
        for line in out.splitlines()
        if ("deathwatch-demo-" in line or "deathwatch-cluster-" in line)
        and " Z" not in f" {line.split(None, 2)[1]}"
    }


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hack.demo", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.deploy
def test_the_demo_installs_deathwatch_and_judges_real_sandboxes() -> None:
    """As root with a node: images, manifests, a real cluster; nothing left running after."""
    reason = cluster.available()
    if reason:
        pytest.skip(reason)
    _binaries_or_skip("kubelet", "kube-scheduler", "kube-proxy")
    result = _demo()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    out = result.stdout
    assert "both rolled out" in out
    assert "all 9 verdicts as expected" in out
    assert "SandboxDead" in out
    assert "ProbeBlockedByFirewall" in out
    assert ":49983 refused" in out  # the firewall, shown from the host
    assert "firewall coverage 1/1" in out
    assert _ours() == set()


@pytest.mark.apiserver
def test_the_scripted_demo_runs_where_no_node_can() -> None:
    _binaries_or_skip()
    result = _demo("--scripted")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "all 12 verdicts as expected" in result.stdout
    assert "SandboxDead" in result.stdout
    assert "ProbeBlockedByFirewall" in result.stdout
    assert _ours() == set()
