"""deathwatch's alerts (monitoring/deathwatch.rules.yaml, the chart's PrometheusRule) on
Prometheus's own rule engine: promtool checks them and runs their unit tests
(monitoring/tests/), in which each alert fires when it should, stays quiet on a healthy
series and on a flap shorter than its `for:`. Every alert has a test and a runbook section;
and with the `for:`s taken away the flap tests fail (they can)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from hack.render_manifests import CHART, helm

pytestmark = pytest.mark.prometheus
ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "monitoring" / "deathwatch.rules.yaml"
TESTS = ROOT / "monitoring" / "tests" / "deathwatch.test.yaml"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (Debian package prometheus; hack/setup.sh)")
    return subprocess.run(
        ["promtool", *args], capture_output=True, text=True, timeout=120, check=False
    )


def alerts() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r["alert"] for g in groups for r in g["rules"]]


def test_the_rules_are_valid() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_every_alert_fires_stays_quiet_and_ignores_a_short_flap() -> None:
    done = promtool("test", "rules", str(TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_tested_both_ways_and_has_a_runbook_section() -> None:
    tests = yaml.safe_load(TESTS.read_text())["tests"]
    fired = {a["alertname"] for t in tests for a in t["alert_rule_test"] if a.get("exp_alerts")}
    quiet = {a["alertname"] for t in tests for a in t["alert_rule_test"] if not a.get("exp_alerts")}
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    sections = set(re.findall(r"^## (\w+)$", runbook, re.MULTILINE))
    for alert in alerts():
        assert alert in fired, f"{alert}: no test where it fires"
        assert alert in quiet, f"{alert}: no test where it stays quiet"
        assert alert in sections, f"{alert}: no runbook section"
    rules = yaml.safe_load(RULES.read_text())["groups"]
    for rule in (r for g in rules for r in g["rules"]):
        assert rule["annotations"]["runbook_url"].endswith("#" + rule["alert"].lower())


def test_without_their_for_the_flap_tests_fail(tmp_path: Path) -> None:
    """Mutation: the same rules with every `for:` zero. A flap shorter than the `for:` is
    then an alert, and the unit tests must say so."""
    keys = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["for"]
    sets = [f"prometheusRule.for.{k}=0m" for k in keys]
    rendered = helm("template", "deathwatch", str(CHART), "--set", "prometheusRule.enabled=true",
                    *[a for s in sets for a in ("--set", s)],
                    "--show-only", "templates/monitoring/prometheusrule.yaml")  # fmt: skip
    (tmp_path / "deathwatch.rules.yaml").write_text(
        yaml.safe_dump(yaml.safe_load(rendered)["spec"])
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.yaml").write_text(TESTS.read_text())
    done = promtool("test", "rules", str(tmp_path / "tests" / "t.yaml"))
    assert done.returncode != 0
    assert "controller down - one replica left is enough" in done.stdout + done.stderr
