"""Two releases of the chart side by side on the real API server (issue #41): every object of
each, cluster-scoped ones included, is its own (release-scoped names), so the second install
is not refused for an object the first one owns; each is uninstalled without touching the
other. A platform runs a second controller for other namespaces this way (its firewall off:
one firewall owns each node's table)."""

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
