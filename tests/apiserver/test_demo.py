"""The README's demo where no node can run (`hack/demo.sh --scripted`, on the real control
plane): runs, judges every sandbox as expected, exits 0 and leaves nothing running. The demo
with a real node: tests/deploy/test_demo.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import _binaries_or_skip
from tests.demo_driver import demo_tmp, leftovers, run_demo

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.apiserver
def test_the_scripted_demo_runs_where_no_node_can() -> None:
    _binaries_or_skip()
    with demo_tmp() as tmp:
        result = run_demo(tmp, "--scripted")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "all 12 verdicts as expected" in result.stdout
        assert "SandboxDead" in result.stdout
        assert "ProbeBlockedByFirewall" in result.stdout
        assert leftovers(tmp) == set()
