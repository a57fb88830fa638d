"""The performance page's table and chart (docs/performance.md) come from the committed bench run
(bench/results/peers.json), and a file that is not one is a one-line error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import latency_chart
from hack.browser import ink

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "peers.json"
CHART = ROOT / "docs" / "images" / "latency.png"


def _performance_section() -> str:
    return (ROOT / "docs" / "performance.md").read_text()


def test_the_performance_page_quotes_the_committed_run_table_and_ratios() -> None:
    section = _performance_section()
    assert latency_chart.markdown(latency_chart.load(RESULTS)) in section
    assert "(images/latency.png)" in section
    assert section.count("| N | tool |") == 1, "one table, not a stack of runs"


def test_the_committed_run_has_every_death_seen_by_both_tools() -> None:
    results = latency_chart.load(RESULTS)
    assert [r["pods"] for r in results["runs"]] == [1000, 10000]
    for run in results["runs"]:
        for tool in ("deathwatch", "agent-sandbox"):
            assert run["tools"][tool]["seen"] == run["deaths"] > 0, (run["pods"], tool)


def test_the_chart_is_drawn_from_the_run(tmp_path: Path) -> None:
    out = tmp_path / "latency.png"
    assert latency_chart.main([str(RESULTS), str(out)]) == 0
    for picture in (out, CHART):
        inked, colours = ink(picture)
        assert inked > 0.02 and colours >= 4, (picture, inked, colours)


def _valid() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(RESULTS.read_text())
    return data


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{", "not JSON"),
        ("[]", "the top level is not an object"),
        ("{}", "no 'runs'"),
        (json.dumps({"runs": [{"pods": "many", "tools": {}}]}), "runs[0].pods: expected a number"),
        (json.dumps({"runs": [{"pods": 10, "tools": {}}]}), "runs[0].tools: missing or empty"),
    ],
)
def test_a_file_that_is_not_a_peers_result_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, says: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert latency_chart.main([str(bad), str(tmp_path / "out.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and str(bad) in err, err
    assert not (tmp_path / "out.png").exists()


def test_a_tool_without_a_quantile_names_the_field(tmp_path: Path) -> None:
    data = _valid()
    del data["runs"][1]["tools"]["deathwatch"]["latency_ms"]["p99"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    run = subprocess.run(
        [sys.executable, "-m", "bench.latency_chart", str(bad), str(tmp_path / "out.png")],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip().endswith(
        "runs[1].tools.deathwatch.latency_ms.p99: expected a number, got None"
    ), run.stderr
    assert "Traceback" not in run.stderr and run.stderr.count("\n") == 1


def test_a_missing_file_and_an_unwritable_output_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert latency_chart.main([str(tmp_path / "none.json"), str(tmp_path / "o.png")]) == 2
    assert "No such file or directory" in capsys.readouterr().err
    assert latency_chart.main([str(RESULTS), str(tmp_path / "no" / "dir" / "o.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "o.png" in err, err
