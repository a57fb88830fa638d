"""bench/firewall_bench.py end to end, small: it builds its two nodes, measures every arm and
every rule refuses what it must (the numbers are the bench's business, not a test's; this
proves the command works from a clone and its arms are the tables they claim to be)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hack.localcluster.netnode import netns_available

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.netns


@pytest.mark.timeout(600)
def test_the_firewall_bench_measures_every_arm_and_every_refusal() -> None:
    reason = netns_available()
    if reason:
        pytest.skip(reason)
    proc = subprocess.run(
        [sys.executable, "-m", "bench.firewall_bench", "--json", "--node-conntrack",
         "--connects", "30", "--rounds", "2", "--refusals", "30"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])},
        capture_output=True, text=True, timeout=540, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert {k: v["outcomes"] for k, v in result["refusal"].items()} == {
        "output": {"refused": 30},
        "inbound": {"refused": 30},
    }
    arms = [k for k in result if k.startswith("pod_to_pod")]
    assert sorted(arms) == [
        "pod_to_pod", "pod_to_pod_hooks_without_rules", "pod_to_pod_judging_only_ct_state_new",
        "pod_to_pod_judging_only_syn", "pod_to_pod_source_first",
    ]  # fmt: skip
    for arm in arms:
        for where in ("same_node", "other_node"):
            assert result[arm][where]["connects_each"] == 60, (arm, where)
    assert result["node_conntrack"] is True
    assert result["host_addresses_taken_out"] == 200
