"""Two releases of the chart side by side on the real API server (issue #41): every object of
each, cluster-scoped ones included, is its own (release-scoped names), so the second install
is not refused for an object the first one owns; each is uninstalled without touching the
other. A release that would share what another holds (issue #51: a node's table, a host
port, the DeathWatches it serves) is refused at install, naming that release; given its own,
it installs beside it. The two firewalls in force on a real node: tests/deploy/test_helm_lane.py."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from hack.localcluster import controlplane
from hack.render_manifests import CHART, helm_bin

pytestmark = pytest.mark.apiserver
RELEASES = {
    "alpha": ("dw-alpha", ["scope.clusterWide=false", "scope.namespaces={team-alpha}"]),
    "beta": ("dw-beta", ["scope.clusterWide=false", "scope.namespaces={team-beta}",
                         "firewall.enabled=false"]),
}  # fmt: skip


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
        ([], [("firewall.table", alpha), ("host port 9101", alpha), ("host port 9102", alpha),
              ("controller.controllerId", alpha), ("controller.controllerId", beta)]),
        (["controller.controllerId=gamma", "firewall.table=gamma"],
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
               "firewall.metricsPort=9201", "firewall.exits.metricsPort=9202"]  # fmt: skip
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
