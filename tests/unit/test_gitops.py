"""docs/gitops.md as written (#59): its Argo CD health checks run in a Lua 5.1 interpreter
(Argo CD's gopher-lua is Lua 5.1) on the conditions the controller itself writes, and its
Application's and HelmRelease's values pass the chart's schema, at the chart's version."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import yaml
from lupa import lua51

from deathwatch._operator.reporting.deathwatch_status import FirewallReading, deathwatch_conditions

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "gitops.md"
CHART = ROOT / "charts" / "deathwatch"
NOW = datetime(2026, 12, 6, tzinfo=UTC)


def documents() -> list[dict[str, Any]]:
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.DOTALL)
    return [d for block in blocks for d in yaml.safe_load_all(block) if d]


def the(kind: str) -> dict[str, Any]:
    (found,) = [d for d in documents() if d["kind"] == kind]
    return found


def health(kind: str, obj: dict[str, Any]) -> tuple[str, str]:
    """What Argo CD would say: the script of argocd-cm run with `obj` as its global."""
    script = the("ConfigMap")["data"][f"resource.customizations.health.deathwatch.dev_{kind}"]
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    said = lua.execute(script)
    return str(said["status"]), str(said["message"])


def deathwatch(**status: Any) -> dict[str, Any]:
    """A DeathWatch with the conditions the controller's own status builder writes."""
    conditions = deathwatch_conditions([], NOW, stale_after=90, **status)
    return {"apiVersion": "deathwatch.dev/v1alpha1", "kind": "DeathWatch",
            "metadata": {"name": "sandboxes"},
            "status": {"conditions": msgspec.to_builtins(conditions)}}  # fmt: skip


def test_a_deathwatch_is_healthy_degraded_or_progressing_as_its_own_conditions_say() -> None:
    covered = FirewallReading("deathwatch-system/deathwatch-firewall", desired=3, ready=3)
    assert health("DeathWatch", deathwatch(invalid=None, fresh=True, firewall=covered))[0] == (
        "Healthy"
    )
    refused = health("DeathWatch", deathwatch(invalid="spec.agentPorts[0]: 0 is not a port",
                                               fresh=True, firewall=covered))  # fmt: skip
    assert refused == ("Degraded", "spec.agentPorts[0]: 0 is not a port")
    uncovered = FirewallReading("deathwatch-system/deathwatch-firewall", desired=3, ready=2)
    status, message = health("DeathWatch", deathwatch(invalid=None, fresh=True,
                                                       firewall=uncovered))  # fmt: skip
    assert status == "Degraded" and "2/3 nodes" in message
    stale = health("DeathWatch", deathwatch(invalid=None, fresh=False, firewall=covered))
    assert stale[0] == "Progressing" and "bookmark" in stale[1]
    # no firewall at all is not a fault: FirewallCovered Unknown NotConfigured
    alone = deathwatch(invalid=None, fresh=True, firewall=FirewallReading(None))
    assert health("DeathWatch", alone)[0] == "Healthy"
    assert health("DeathWatch", {"kind": "DeathWatch", "metadata": {}})[0] == "Progressing"
    assert health("DeathWatch", {"status": {"conditions": []}})[0] == "Progressing"
    # another release shares what this one holds (ADR 0038): degraded, naming it; checked
    # and clear: healthy
    clash = "table inet deathwatch on every node is the firewall's of release staging"
    shared = health("DeathWatch", deathwatch(invalid=None, fresh=True, firewall=covered,
                                             conflicts=[clash]))  # fmt: skip
    assert shared == ("Degraded", clash)
    clear = deathwatch(invalid=None, fresh=True, firewall=covered, conflicts=[])
    conditions = {c["type"]: c for c in clear["status"]["conditions"]}
    assert (conditions["ReleaseConflict"]["status"], conditions["ReleaseConflict"]["reason"]) == (
        "False", "NoCollision")  # fmt: skip
    assert health("DeathWatch", clear)[0] == "Healthy"


def test_a_verdict_is_healthy_whatever_it_says_and_says_it() -> None:
    dead = {"status": {"state": "Dead", "cause": "OOMKilled"}}
    assert health("SandboxVerdict", dead) == ("Healthy", "Dead (OOMKilled)")
    assert health("SandboxVerdict", {"status": {"state": "Alive"}}) == ("Healthy", "Alive")
    assert health("SandboxVerdict", {"metadata": {}}) == ("Healthy", "no verdict yet")


def test_the_examples_values_pass_the_charts_schema_at_the_charts_version() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    app = the("Application")["spec"]
    release = the("HelmRelease")["spec"]
    for values in (app["source"]["helm"]["valuesObject"], release["values"]):
        jsonschema.Draft7Validator(schema).validate(values)
    assert app["source"]["chart"] == release["chart"]["spec"]["chart"] == "deathwatch"
    assert app["source"]["targetRevision"] == release["chart"]["spec"]["version"] == version
    home = the("HelmRepository")["spec"]["url"].removeprefix("oci://")
    assert app["source"]["repoURL"] == home
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert home == f"{values['controller']['image']['registry']}/deathwatch-dev/charts"
    # the namespace Argo CD makes, and Flux's, are labelled for the firewall agent
    privileged = {"pod-security.kubernetes.io/enforce": "privileged"}
    assert app["syncPolicy"]["managedNamespaceMetadata"]["labels"] == privileged
    assert the("Namespace")["metadata"]["labels"] == privileged
