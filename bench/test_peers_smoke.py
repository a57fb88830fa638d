"""bench/peers.py end to end, small: it builds what it needs, runs every peer on one real API
server, and each one that has a signal sees every death (the numbers are bench's business,
not a test's; this proves the command works from a clone). A bench's check, kept out of CI
(53 s of it, #60): `python3 -m pytest bench` before a bench run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.apiserver


@pytest.mark.timeout(900)
def test_peers_bench_runs_every_tool_and_each_sees_every_death(tmp_path: Path) -> None:
    if shutil.which("go") is None:
        pytest.skip("no Go to build the peers (hack/build-peers.sh)")
    out = tmp_path / "peers.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.peers", "--pods", "40", "--seconds", "5", "--json", str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])},
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = json.loads(out.read_text())["runs"]
    assert run["pods"] == 40 and run["deaths"] == 10
    tools = run["tools"]
    assert set(tools) == {
        "deathwatch",
        "agent-sandbox",
        "kopf-naive",
        "kopf-noop",
        "kube-state-metrics",
    }
    for name, result in tools.items():
        if name != "kopf-noop":
            assert result["seen"] == 10, (name, result)
        assert result["rss_at_n_mib"] > 0 and result["cpu_s_load"] >= 0
    dw = tools["deathwatch"]
    assert set(dw["rss_at_n_per_process_mib"]) == {"dw-a", "dw-b"}  # leader + hot standby
    # every death: its Dead status and its Event (the audit log, by ServiceAccount)
    assert dw["writes"]["load sandboxverdicts/status"] >= 10
    assert dw["writes"]["load events"] == 10
    assert tools["kopf-noop"]["writes"] == {"setup": 0, "load": 0}
    assert "| deathwatch |" in proc.stdout
