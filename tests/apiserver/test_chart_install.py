"""Two releases of the chart side by side on the real API server (issue #41): every object of
each, cluster-scoped ones included, is its own (release-scoped names), so the second install
is not refused for an object the first one owns; each is uninstalled without touching the
other. A release that would share what another holds (issue #51: a node's table, a host
port, the DeathWatches it serves) is refused at install, naming that release; given its own,
it installs beside it. The CRDs (applied here by kubectl, as the control plane's fixture does)
go to one release: taken only when handed over as the refusal says, refused to a second,
kept on uninstall (ADR 0032). The two firewalls in force on a real node:
tests/deploy/test_helm_lane.py."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from hack.localcluster import controlplane
from hack.render_manifests import CHART, helm_bin

pytestmark = pytest.mark.apiserver
# the cluster's CRDs are the fixture's (kubectl apply): no release takes them
RELEASES = {
    "alpha": ("dw-alpha", ["scope.clusterWide=false", "scope.namespaces={team-alpha}",
                           "crds.enabled=false"]),
    "beta": ("dw-beta", ["scope.clusterWide=false", "scope.namespaces={team-beta}",
                         "firewall.enabled=false", "crds.enabled=false"]),
}  # fmt: skip
CRDS = ("deathwatches.deathwatch.dev", "sandboxverdicts.deathwatch.dev")


def helm(cp: controlplane.ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm_bin()), "--kubeconfig", str(cp.kubeconfig), *args],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


@pytest.fixture
def installed(control_plane: controlplane.ControlPlane) -> Iterator[dict[str, Any]]:
    if not helm_bin().exists():
        pytest.skip("helm not built: run hack/build-helm.sh")
    for ns in ("team-alpha", "team-beta"):
        control_plane.kubectl_run("create", "namespace", ns, check=False)
    done = {}
    try:
        for name, (ns, sets) in RELEASES.items():
            args = [a for s in sets for a in ("--set", s)]
            done[name] = helm(control_plane, "install", name, str(CHART), "-n", ns,
                              "--create-namespace", *args)  # fmt: skip
        yield done
    finally:
        for name, (ns, _) in RELEASES.items():
            helm(control_plane, "uninstall", name, "-n", ns, "--wait", "--timeout=2m")


def test_two_releases_install_side_by_side_and_uninstall_apart(
    control_plane: controlplane.ControlPlane, installed: dict[str, Any]
) -> None:
    cp = control_plane
    for name, done in installed.items():
        assert done.returncode == 0, (name, done.stderr)
    listed = {r["name"]: r["status"] for ns, _ in RELEASES.values()
              for r in json.loads(helm(cp, "list", "-n", ns, "-o", "json").stdout)}  # fmt: skip
    assert listed == {"alpha": "deployed", "beta": "deployed"}
    roles = cp.kubectl_run("get", "clusterroles", "-o", "name").stdout.split()
    for release in ("alpha", "beta"):
        assert f"clusterrole.rbac.authorization.k8s.io/{release}-deathwatch-controller" in roles
    deploys = cp.kubectl_run("get", "deployments", "-A", "-o", "name").stdout.split()
    assert "deployment.apps/alpha-deathwatch-controller" in deploys
    assert "deployment.apps/beta-deathwatch-controller" in deploys
    policies = cp.kubectl_run("get", "validatingadmissionpolicies", "-o", "name").stdout.split()
    assert (
        "validatingadmissionpolicy.admissionregistration.k8s.io/alpha-deathwatch-firewall-coverage"
        in policies
    )
    assert not [p for p in policies if "beta-" in p]  # its firewall is off
    gone = helm(cp, "uninstall", "beta", "-n", "dw-beta", "--wait", "--timeout=2m")
    assert gone.returncode == 0, gone.stderr
    roles = cp.kubectl_run("get", "clusterroles", "-o", "name").stdout.split()
    assert "clusterrole.rbac.authorization.k8s.io/alpha-deathwatch-controller" in roles
    assert not [r for r in roles if "beta-deathwatch" in r]


def test_a_release_that_would_share_what_another_holds_is_refused_naming_it(
    control_plane: controlplane.ControlPlane, installed: dict[str, Any]
) -> None:
    """alpha serves team-alpha and holds table inet deathwatch and host ports 9101/9102 on
    every node. gamma, cluster-wide, is refused until it has its own controller id, table and
    ports; then it installs beside alpha."""
    cp = control_plane
    assert installed["alpha"].returncode == 0, installed["alpha"].stderr
    alpha, beta = "release alpha (namespace dw-alpha", "release beta (namespace dw-beta"
    steps = [
        (["crds.enabled=false"], [("firewall.table", alpha), ("host port 9101", alpha), ("host port 9102", alpha),
              ("controller.controllerId", alpha), ("controller.controllerId", beta)]),
        (["controller.controllerId=gamma", "firewall.table=gamma", "crds.enabled=false"],
         [("host port 9101", alpha), ("host port 9102", alpha)]),
    ]  # fmt: skip
    try:
        for sets, problems in steps:
            args = [a for s in sets for a in ("--set", s)]
            refused = helm(cp, "install", "gamma", str(CHART), "-n", "dw-gamma",
                           "--create-namespace", *args)  # fmt: skip
            assert refused.returncode != 0, sets
            said = [line for line in refused.stderr.splitlines() if line.startswith("  - ")]
            assert len(said) == len(problems), refused.stderr  # every one at once, each once
            for problem, whom in problems:
                assert any(problem in line and whom in line for line in said), refused.stderr
        own = ["controller.controllerId=gamma", "firewall.table=gamma",
               "firewall.metricsPort=9201", "firewall.exits.metricsPort=9202",
               "crds.enabled=false"]  # fmt: skip
        done = helm(cp, "install", "gamma", str(CHART), "-n", "dw-gamma", "--create-namespace",
                    *[a for s in own for a in ("--set", s)])  # fmt: skip
        assert done.returncode == 0, done.stderr
        ds = json.loads(cp.kubectl_run("get", "daemonset", "-n", "dw-gamma",
                                       "gamma-deathwatch-firewall", "-o", "json").stdout)  # fmt: skip
        assert ds["metadata"]["annotations"]["deathwatch.dev/table"] == "gamma"
        args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--table=gamma" in args
        # an upgrade of gamma is no collision with itself
        again = helm(cp, "upgrade", "gamma", str(CHART), "-n", "dw-gamma",
                     *[a for s in own for a in ("--set", s)])  # fmt: skip
        assert again.returncode == 0, again.stderr
    finally:
        helm(cp, "uninstall", "gamma", "-n", "dw-gamma", "--wait", "--timeout=2m")


def test_the_crds_go_to_one_release_as_the_refusal_says_and_stay_on_uninstall(
    control_plane: controlplane.ControlPlane,
) -> None:
    """The fixture applied the CRDs with kubectl. A release with crds.enabled (the default) is
    refused, saying how to hand them over; handed over by the refusal's own commands, it takes
    them; a second release taking them too is refused, naming the first; the first's
    uninstall leaves them and every DeathWatch (crds.keep)."""
    cp = control_plane
    if not helm_bin().exists():
        pytest.skip("helm not built: run hack/build-helm.sh")
    own = ["scope.clusterWide=false", "scope.namespaces={team-delta}", "firewall.enabled=false"]
    args = [a for s in own for a in ("--set", s)]
    cp.kubectl_run("create", "namespace", "team-delta", check=False)
    try:
        refused = helm(cp, "install", "delta", str(CHART), "-n", "dw-delta", "--create-namespace",
                       "--set", "controller.controllerId=delta", *args)  # fmt: skip
        assert refused.returncode != 0
        said = [line for line in refused.stderr.splitlines() if line.startswith("  - ")]
        assert "crds.enabled: this release would take CRDs it does not own" in refused.stderr
        assert [crd for crd in CRDS if any(f"CRD {crd} was applied without Helm" in s
                                           for s in said)] == list(CRDS), refused.stderr  # fmt: skip
        for line in said:  # the refusal's commands, as an operator would paste them
            for command in line.split("hand it to this release first: ", 1)[1].split(" && "):
                assert command.startswith("kubectl "), command
                cp.kubectl_run(*command.split()[1:])
        done = helm(cp, "install", "delta", str(CHART), "-n", "dw-delta", "--create-namespace",
                    "--set", "controller.controllerId=delta", *args)  # fmt: skip
        assert done.returncode == 0, done.stderr
        for crd in CRDS:
            meta = json.loads(cp.kubectl_run("get", "crd", crd, "-o", "json").stdout)["metadata"]
            assert meta["annotations"]["meta.helm.sh/release-name"] == "delta", meta
            assert meta["annotations"]["helm.sh/resource-policy"] == "keep", meta
        again = helm(cp, "install", "epsilon", str(CHART), "-n", "dw-epsilon",
                     "--create-namespace", "--set", "controller.controllerId=epsilon", "--set",
                     "scope.clusterWide=false", "--set", "scope.namespaces={team-epsilon}",
                     "--set", "firewall.enabled=false")  # fmt: skip
        assert again.returncode != 0
        for crd in CRDS:
            assert f"CRD {crd} is installed by release delta (namespace dw-delta)" in again.stderr
        cp.kubectl_run("apply", "-f", "-", input=json.dumps({
            "apiVersion": "deathwatch.dev/v1alpha1", "kind": "DeathWatch",
            "metadata": {"name": "kept", "namespace": "team-delta"}, "spec": {}}))  # fmt: skip
        gone = helm(cp, "uninstall", "delta", "-n", "dw-delta", "--wait", "--timeout=2m")
        assert gone.returncode == 0, gone.stderr
        assert "kept" in cp.kubectl_run("get", "deathwatches", "-n", "team-delta",
                                        "-o", "name").stdout  # fmt: skip
    finally:
        helm(cp, "uninstall", "delta", "-n", "dw-delta", "--wait", "--timeout=2m")
        cp.kubectl_run("delete", "deathwatches.deathwatch.dev", "kept", "-n", "team-delta",
                       "--ignore-not-found", check=False)  # fmt: skip
        for crd in CRDS:  # as the fixture applied them: no release's
            cp.kubectl_run("annotate", "crd", crd, "meta.helm.sh/release-name-",
                           "meta.helm.sh/release-namespace-", "helm.sh/resource-policy-",
                           check=False)  # fmt: skip
            cp.kubectl_run("label", "crd", crd, "app.kubernetes.io/managed-by-", check=False)
