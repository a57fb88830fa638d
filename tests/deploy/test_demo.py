"""The README's first command does what it says: runs, judges every sandbox as expected,
exits 0 and leaves nothing running."""

from __future__ import annotations

from pathlib import Path

import pytest

from hack.localcluster import cluster
from tests.conftest import _binaries_or_skip
from tests.demo_driver import demo_tmp, leftovers, run_demo

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.deploy
def test_the_demo_installs_deathwatch_and_judges_real_sandboxes() -> None:
    """As root with a node: images, manifests, a real cluster; nothing left running after."""
    reason = cluster.available()
    if reason:
        pytest.skip(reason)
    _binaries_or_skip("kubelet", "kube-scheduler", "kube-proxy")
    with demo_tmp() as tmp:
        result = run_demo(tmp)
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
        out = result.stdout
        assert "both rolled out" in out
        assert "all 9 verdicts as expected" in out
        assert "SandboxDead" in out
        assert "ProbeBlockedByFirewall" in out
        assert ":49983 refused" in out  # the firewall, shown from the host
        assert "firewall coverage 1/1" in out
        assert leftovers(tmp) == set()
