"""deathwatch's alerts (monitoring/deathwatch.rules.yaml, the chart's PrometheusRule) on
Prometheus's own rule engine: promtool checks them and runs their unit tests
(monitoring/tests/), in which each alert fires when it should, stays quiet on a healthy
series and on a flap shorter than its `for:`. Every alert has a test and a runbook section;
and with the `for:`s taken away the flap tests fail (they can).

The shapes the chart installs (monitoring/tests/shapes/): three shards, two releases on one
Prometheus, a namespaced scope; each suite runs against the rules the chart renders for that
shape, and fails against the rules before they were scoped per release and per shard."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.render_manifests import CHART, helm, helm_bin

pytestmark = pytest.mark.prometheus
ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "monitoring" / "deathwatch.rules.yaml"
TESTS = ROOT / "monitoring" / "tests" / "deathwatch.test.yaml"
SHAPES = ROOT / "monitoring" / "tests" / "shapes"


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


def rendered_rules(release: str, namespace: str, *sets: str) -> dict[str, Any]:
    """The rule groups of the PrometheusRule the chart renders for this release."""
    args = [a for s in ("prometheusRule.enabled=true", *sets) for a in ("--set", s)]
    out = helm("template", release, str(CHART), "-n", namespace, *args,
               "--show-only", "templates/monitoring/prometheusrule.yaml")  # fmt: skip
    spec: dict[str, Any] = yaml.safe_load(out)["spec"]
    return spec


# each suite, and the releases whose rules it loads: (file name, release, namespace, values)
SHAPE_RULES: dict[str, list[tuple[str, str, str, tuple[str, ...]]]] = {
    "shards.test.yaml": [("deathwatch.rules.yaml", "deathwatch", "deathwatch-system",
                          ("controller.shards=3",))],
    "two-releases.test.yaml": [("production.rules.yaml", "deathwatch", "deathwatch-system", ()),
                               ("staging.rules.yaml", "staging", "staging", ())],
    "namespaced.test.yaml": [("deathwatch.rules.yaml", "deathwatch", "deathwatch-system",
                              ("scope.clusterWide=false", "scope.namespaces={team-a,team-b}"))],
}  # fmt: skip


@pytest.mark.parametrize("suite", sorted(SHAPE_RULES))
def test_in_every_shape_the_chart_installs_each_alert_fires_and_stays_quiet(
    suite: str, tmp_path: Path
) -> None:
    for name, release, namespace, sets in SHAPE_RULES[suite]:
        (tmp_path / name).write_text(yaml.safe_dump(rendered_rules(release, namespace, *sets)))
    (tmp_path / suite).write_text((SHAPES / suite).read_text())
    done = promtool("test", "rules", str(tmp_path / suite))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_shape_suite_is_run() -> None:
    assert {p.name for p in SHAPES.glob("*.test.yaml")} == set(SHAPE_RULES)


def test_every_expression_picks_its_release_by_exact_matchers() -> None:
    """No series is taken from anyone but this release: every selector names the job and the
    namespace exactly (a regex job matched staging-deathwatch-controller-metrics too)."""
    rules = rendered_rules("staging", "staging")
    selectors = [s for g in rules["groups"] for r in g["rules"]
                 for s in re.findall(r"[a-z_]+\{[^}]*\}", r["expr"])]  # fmt: skip
    assert selectors
    for selector in selectors:
        assert 'job="staging-deathwatch-' in selector and 'namespace="staging"' in selector, (
            selector
        )


def alert_names(rules: dict[str, Any]) -> set[str]:
    return {r["alert"] for g in rules["groups"] for r in g["rules"]}


def test_a_part_left_out_leaves_out_its_alerts_and_disabling_one_still_names_any_alert() -> None:
    every = alert_names(rendered_rules("deathwatch", "deathwatch-system"))
    exits = {"DeathwatchNodeExitsDeaf", "DeathwatchNodeExitDisputed"}
    no_exits = alert_names(rendered_rules("deathwatch", "deathwatch-system",
                                          "firewall.exits.enabled=false"))  # fmt: skip
    assert no_exits == every - exits
    no_firewall = alert_names(rendered_rules("deathwatch", "deathwatch-system",
                                             "firewall.enabled=false"))  # fmt: skip
    assert not any("Firewall" in a for a in no_firewall)
    assert "DeathwatchUncoveredNode" not in no_firewall and not exits & no_firewall
    # disabling an alert of a part that is off is still disabling one of the chart's alerts
    rendered_rules("deathwatch", "deathwatch-system", "firewall.exits.enabled=false",
                   "prometheusRule.disabled.DeathwatchNodeExitsDeaf=true")  # fmt: skip


def test_a_cleanup_release_renders_no_rules_or_monitors() -> None:
    out = helm("template", "deathwatch-cleanup", str(CHART), "-n", "deathwatch-system",
               "--set", "cleanup=true", "--set", "prometheusRule.enabled=true",
               "--set", "metrics.serviceMonitor.enabled=true")  # fmt: skip
    kinds = {d["kind"] for d in yaml.safe_load_all(out) if d}
    assert kinds.isdisjoint({"PrometheusRule", "ServiceMonitor", "PodMonitor"})


def test_the_regex_job_values_are_refused_naming_what_replaced_them() -> None:
    done = subprocess.run(
        [str(helm_bin()), "template", "x", str(CHART), "--set", "prometheusRule.enabled=true",
         "--set", "prometheusRule.controllerJob=.*deathwatch.*"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "prometheusRule.controllerJob: replaced by prometheusRule.selectors" in done.stderr
