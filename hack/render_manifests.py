"""The chart is the one source of every install manifest; this renders the others from it.

    python3 -m hack.render_manifests           # write them
    python3 -m hack.render_manifests --check   # exit 1, naming each file that is stale

From charts/deathwatch, with real Helm (hack/build-helm.sh):
- manifests/base/**: `helm template` with the default values, one file per template (without
  the two labels only a Helm release may claim: HELM_ONLY_LABELS), the CRDs a file each
  (their source: charts/deathwatch/files/crds). `kubectl kustomize manifests/overlays/cluster` is then the
  chart's default render plus the Namespace (tests/helm/test_chart.py compares them object by object);
- manifests/uninstall/cleanup-daemonset.yaml: the chart with `cleanup=true`;
- monitoring/deathwatch.rules.yaml: the alerting rules of the PrometheusRule, as a plain rules
  file for a Prometheus without the Operator (promtool tests: monitoring/tests/, whose
  expected runbook links are set to the chart's here).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import yaml

from hack.localcluster import controlplane

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "deathwatch"
BASE = ROOT / "manifests" / "base"
NAMESPACE = "deathwatch-system"
HEADER = (
    "# Generated from charts/deathwatch by hack/render_manifests.py: edit the chart, not this.\n"
)


def helm_bin() -> Path:
    versions = dict(
        line.split("=", 1)
        for line in (ROOT / "hack" / "versions.env").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    return controlplane.cache_dir() / "helm" / versions["HELM_VERSION"] / "bin" / "helm"


def helm(*args: str) -> str:
    binary = helm_bin()
    if not binary.exists():
        subprocess.run([str(ROOT / "hack" / "build-helm.sh")], check=True, timeout=3600)
    done = subprocess.run(
        [str(binary), *args], capture_output=True, text=True, check=False, timeout=120
    )
    if done.returncode != 0:
        raise SystemExit(f"helm {' '.join(args[:2])}: {done.stderr.strip()}")
    return done.stdout


# Kubernetes' recommended labels that say Helm installed the object: true of a release, not of
# the kustomize manifests rendered from the chart
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")


def without_helm_labels(text: str) -> str:
    said = tuple(f"{label}: " for label in HELM_ONLY_LABELS)
    return "\n".join(line for line in text.split("\n") if not line.lstrip().startswith(said))


def by_template(rendered: str) -> dict[str, str]:
    """`helm template` output, split into its templates' documents (path below templates/)."""
    files: dict[str, list[str]] = {}
    for doc in without_helm_labels(rendered).split("\n---\n"):
        lines = doc.strip("\n").splitlines()
        source = next((line for line in lines if line.startswith("# Source: ")), None)
        if source is None:
            continue
        path = source.split("/templates/", 1)[1]
        body = "\n".join(line for line in lines if line not in (source, "---")).strip()
        files.setdefault(path, []).append(body + "\n")
    return {path: HEADER + "---\n".join(docs) for path, docs in files.items()}


def rendered() -> dict[Path, str]:
    out: dict[Path, str] = {}
    for path, text in by_template(
        helm("template", "deathwatch", str(CHART), "-n", NAMESPACE, "--skip-tests")
    ).items():
        if path == "crds/crds.yaml":  # a file per CRD, as kubectl users apply them
            for doc in text.removeprefix(HEADER).split("---\n"):
                name = yaml.safe_load(doc)["metadata"]["name"]
                out[BASE / "crds" / f"{name}.yaml"] = HEADER + doc
        else:
            out[BASE / path] = text
    cleanup = by_template(
        helm(
            "template",
            "deathwatch",  # the release's name: the kustomize names are FULLNAME's (deathwatch)
            str(CHART),
            "-n",
            "deathwatch-uninstall",
            "--set",
            "cleanup=true",
        )
    )
    out[ROOT / "manifests" / "uninstall" / "cleanup-daemonset.yaml"] = cleanup["cleanup.yaml"]
    rule = yaml.safe_load(
        helm(
            "template",
            "deathwatch",
            str(CHART),
            "-n",
            NAMESPACE,
            "--set",
            "prometheusRule.enabled=true",
            "--show-only",
            "templates/monitoring/prometheusrule.yaml",
        )
    )
    out[ROOT / "monitoring" / "deathwatch.rules.yaml"] = (
        HEADER + "# The alerts of the chart's PrometheusRule (default values), for a Prometheus\n"
        "# without the Operator: rule_files: [deathwatch.rules.yaml]. Runbook: docs/runbook.md\n"
        + yaml.safe_dump(rule["spec"], sort_keys=False, width=100)
    )
    # the rules' unit tests expect each alert's runbook link as the chart renders it (the
    # runbook of the chart's version): the same link, written where the tests expect it
    runbook = rule["spec"]["groups"][0]["rules"][0]["annotations"]["runbook_url"].split("#")[0]
    tests = ROOT / "monitoring" / "tests" / "deathwatch.test.yaml"
    out[tests] = re.sub(r"https://github\.com/deathwatch-dev/deathwatch/blob/[^/]+/docs/runbook\.md",
                        runbook, tests.read_text())  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="only say which files are stale")
    args = parser.parse_args(argv)
    files = rendered()
    stale = [p for p, text in files.items() if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"stale: {p.relative_to(ROOT)} (run python3 -m hack.render_manifests)")
        return 1 if stale else 0
    for p in stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(files[p])
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
