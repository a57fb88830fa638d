"""What an operator applies is valid, minimal and as documented: rendered by kustomize,
checked offline against the Kubernetes 1.35 schemas, custom resources against the CRDs'
own schemas, applied with a server-side dry run on the real control plane, and the
controller's RBAC proven least-privilege there."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes import client

from hack.localcluster import controlplane
from tests.kube import wait_for

pytestmark = pytest.mark.apiserver  # kubectl (kustomize), and the control plane for some
ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
K8S_SCHEMA_VERSION = "1.35.0"
SA_USER = "system:serviceaccount:deathwatch-system:deathwatch-controller"


def kustomize(path: Path) -> list[dict[str, Any]]:
    kubectl = controlplane.bin_dir() / "kubectl"
    if not kubectl.exists():
        pytest.skip("kubectl not built: run hack/build-k8s.sh")
    out = subprocess.run(
        [str(kubectl), "kustomize", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


@pytest.mark.parametrize(
    "path", ["", "overlays/cluster", "overlays/namespaced", "overlays/local-node"]
)
def test_every_rendered_object_is_valid_for_kubernetes_1_35(path: str) -> None:
    objs = kustomize(MANIFESTS / path)
    kinds = {o["kind"] for o in objs}
    assert {
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "Deployment",
        "DaemonSet",
        "ConfigMap",
        "Service",
    } <= kinds
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_SCHEMA_VERSION, strict=True)


@pytest.mark.parametrize(
    "path", ["uninstall", "overlays/local-node/uninstall", "overlays/private-registry/uninstall"]
)
def test_the_uninstall_step_is_valid_and_touches_only_the_table(path: str) -> None:
    objs = kustomize(MANIFESTS / path)
    private = path.startswith("overlays/private-registry")
    assert sorted(o["kind"] for o in objs) == ["DaemonSet", "Namespace", *(["Secret"] * private)]
    if private:  # its pull secret, made in the cleanup's namespace and named by its pods
        secret = by_kind(objs, "Secret")
        assert secret["type"] == "kubernetes.io/dockerconfigjson"
        assert secret["metadata"]["namespace"] == "deathwatch-uninstall"
        spec = by_kind(objs, "DaemonSet")["spec"]["template"]["spec"]
        assert spec["imagePullSecrets"] == [{"name": secret["metadata"]["name"]}]
        version = (ROOT / "VERSION").read_text().strip()
        assert {c["image"] for c in (*spec["containers"], *spec["initContainers"])} == {
            f"registry.corp.example/mirror/deathwatch-dev/firewall:{version}"
        }
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_SCHEMA_VERSION, strict=True)
    pod = by_kind(objs, "DaemonSet")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["args"] == ["cleanup", "--table=deathwatch"]  # its own table only
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN"]}
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_local_node_overlay_changes_only_image_names() -> None:
    """Nothing else: not even the pod range, which the agents learn from the Node (ADR 0021)."""
    base, local = kustomize(MANIFESTS), kustomize(MANIFESTS / "overlays" / "local-node")
    assert [(o["kind"], o["metadata"]["name"]) for o in base] == [
        (o["kind"], o["metadata"]["name"]) for o in local
    ]
    changed = [
        (b["kind"], b["metadata"]["name"]) for b, o in zip(base, local, strict=True) if b != o
    ]
    assert changed == [
        ("Deployment", "deathwatch-controller"),
        ("DaemonSet", "deathwatch-firewall"),
    ]
    images = {
        c["image"]
        for o in local
        if o["kind"] in ("Deployment", "DaemonSet")
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"deathwatch.local/controller:dev", "deathwatch.local/firewall:dev"}


def test_namespaced_overlay_binds_only_the_chosen_namespaces() -> None:
    objs = kustomize(MANIFESTS / "overlays" / "namespaced")
    # the controller's reach ends at the chosen namespaces; the firewall's node agent still
    # reads its own node's pods in any namespace (pods list/watch, nothing else); both ask
    # the API who reads their metrics (TokenReview, SubjectAccessReview: cluster-scoped
    # reviews, and all system:auth-delegator grants); the controller reads every release's
    # workloads, and its CRDs by name, for what another release shares with it (ADR 0038:
    # list and get only, whatever namespaces it serves)
    cluster_bindings = [o for o in objs if o["kind"] == "ClusterRoleBinding"]
    assert sorted(b["roleRef"]["name"] for b in cluster_bindings) == [
        "deathwatch-controller-releases",
        "deathwatch-firewall",
        "system:auth-delegator",
    ]
    releases = next(o for o in objs if o["kind"] == "ClusterRole"
                    and o["metadata"]["name"] == "deathwatch-controller-releases")  # fmt: skip
    assert {v for r in releases["rules"] for v in r["verbs"]} == {"list", "get"}
    delegator = next(b for b in cluster_bindings if b["roleRef"]["name"] == "system:auth-delegator")
    assert {s["name"] for s in delegator["subjects"]} == {"deathwatch-controller",
                                                         "deathwatch-firewall"}  # fmt: skip
    bindings = [
        o
        for o in objs
        if o["kind"] == "RoleBinding" and o["roleRef"]["name"] == "deathwatch-controller"
    ]
    assert [b["metadata"]["namespace"] for b in bindings] == ["sandboxes"]
    args = by_kind(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=sandboxes" in args


def test_controller_deployment_is_locked_down_and_probed_as_documented() -> None:
    d = by_kind(kustomize(MANIFESTS), "Deployment", "deathwatch-controller")
    spec = d["spec"]
    assert (spec["replicas"], spec["strategy"]["type"]) == (2, "RollingUpdate")
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pdb = by_kind(kustomize(MANIFESTS), "PodDisruptionBudget", "deathwatch-controller")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"] == spec["selector"]
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = pod["containers"][0]
    sc = c["securityContext"]
    assert (sc["readOnlyRootFilesystem"], sc["allowPrivilegeEscalation"], sc["capabilities"]) == (
        True,
        False,
        {"drop": ["ALL"]},
    )
    # liveness from the heartbeat file, no port a neighbour could starve (issue #51); the
    # health port still answers /healthz for people (ADR 0020); metrics on HTTPS
    assert c["livenessProbe"]["exec"]["command"][:2] == ["sh", "-c"]
    assert "--heartbeat-file=/tmp/heartbeat" in c["args"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 8443, "health": 8081}
    assert "--metrics-address=:8443" in c["args"] and "--health-address=:8081" in c["args"]
    assert "readinessProbe" not in c  # /readyz is for people (see the comment in the manifest)
    assert c["resources"]["requests"]
    assert c["resources"]["limits"]
    text = (MANIFESTS / "base" / "controller" / "deployment.yaml").read_text()
    assert "deliberately NOT a" in text


def test_firewall_daemonset_has_net_admin_only_and_an_exec_readiness_check() -> None:
    ds = by_kind(kustomize(MANIFESTS), "DaemonSet", "deathwatch-firewall")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    c = pod["containers"][0]
    sc = c["securityContext"]
    assert sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert c["readinessProbe"]["exec"]["command"][:2] == ["deathwatch-firewall", "check"]
    assert c["resources"]["limits"]
    volume = next(v for v in pod["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == "deathwatch-firewall"
    # the shipped config is one the agent accepts
    from deathwatch.firewall.config import parse_config

    cm = by_kind(kustomize(MANIFESTS), "ConfigMap", "deathwatch-firewall")
    parse_config(yaml.safe_load(cm["data"]["config.yaml"]))


def test_one_version_for_both_distributions_and_the_shipped_images() -> None:
    """VERSION is the one place: both distributions read it (through links), the manifests'
    image tags must say the same."""
    from importlib.metadata import version

    want = (ROOT / "VERSION").read_text().strip()
    for dist in ("controller", "firewall"):
        link = ROOT / dist / "VERSION"
        assert link.is_symlink() and link.resolve() == (ROOT / "VERSION").resolve()
    assert version("deathwatch") == version("deathwatch-firewall") == want
    images = [
        c["image"]
        for obj in kustomize(MANIFESTS) + kustomize(MANIFESTS / "uninstall")
        if obj["kind"] in ("Deployment", "DaemonSet")
        for c in obj["spec"]["template"]["spec"].get("initContainers", [])
        + obj["spec"]["template"]["spec"]["containers"]
    ]
    assert sorted(set(images)) == [
        f"ghcr.io/deathwatch-dev/controller:{want}",
        f"ghcr.io/deathwatch-dev/firewall:{want}",
    ]


# --- on the real control plane ----------------------------------------------------------------


def test_server_side_dry_run_of_the_whole_base_and_the_examples(
    control_plane: controlplane.ControlPlane,
) -> None:
    for ns in ("deathwatch-system", "sandboxes"):
        control_plane.kubectl_run("create", "namespace", ns, check=False)
    # pods are admitted only once their namespace's default ServiceAccount exists
    wait_for(
        lambda: (
            control_plane.kubectl_run(
                "get", "serviceaccount", "default", "-n", "sandboxes", check=False
            ).returncode
            == 0
        ),
        what="sandboxes/default",
    )
    for path in (MANIFESTS, MANIFESTS / "overlays" / "namespaced"):
        result = control_plane.kubectl_run(
            "apply",
            "--server-side",
            "--dry-run=server",
            "--force-conflicts",
            "-k",
            str(path),
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "(server dry run)" in result.stdout
    examples = control_plane.kubectl_run(
        "apply", "--server-side", "--dry-run=server", "-f", str(MANIFESTS / "examples"), check=False
    )
    assert examples.returncode == 0, examples.stderr


def _allowed(
    api: client.ApiClient,
    verb: str,
    resource: str,
    group: str = "",
    namespace: str | None = "sandboxes",
    subresource: str | None = None,
    name: str | None = None,
    user: str | None = None,
) -> bool:
    review = client.AuthorizationV1Api(api).create_subject_access_review(
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user or SA_USER,
                "groups": [
                    "system:serviceaccounts",
                    "system:serviceaccounts:deathwatch-system",
                    "system:authenticated",
                ],
                "resourceAttributes": {
                    k: v
                    for k, v in {
                        "verb": verb,
                        "resource": resource,
                        "group": group,
                        "namespace": namespace,
                        "subresource": subresource,
                        "name": name,
                    }.items()
                    if v is not None
                },
            },
        },
        _request_timeout=30,
    )
    return bool(review.status.allowed)


def test_firewall_rbac_reads_pods_and_nodes_and_keeps_its_coverage_leases_only(
    control_plane: controlplane.ControlPlane, api: client.ApiClient
) -> None:
    control_plane.kubectl_run("create", "namespace", "deathwatch-system", check=False)
    control_plane.kubectl_run("apply", "-f", str(MANIFESTS / "base" / "rbac"))
    user = "system:serviceaccount:deathwatch-system:deathwatch-firewall"
    lease = ("leases", "coordination.k8s.io", "deathwatch-system")
    for verb, resource, group, namespace in (
        ("list", "pods", "", None),
        ("watch", "pods", "", None),
        # every host's own addresses in the pod ranges (overlay tunnels): read only
        ("get", "nodes", "", None),
        ("list", "nodes", "", None),
        ("watch", "nodes", "", None),
        ("get", *lease),
        ("create", *lease),
        ("update", *lease),
        # who may read its metrics (system:auth-delegator)
        ("create", "tokenreviews", "authentication.k8s.io", None),
        ("create", "subjectaccessreviews", "authorization.k8s.io", None),
    ):
        assert _allowed(api, verb, resource, group, namespace, user=user), (verb, resource)
    for verb, resource, group, namespace in (
        ("get", "pods", "", "sandboxes"),
        ("patch", "pods", "", "sandboxes"),
        ("delete", "pods", "", "sandboxes"),
        ("delete", *lease),
        ("list", *lease),
        ("create", "leases", "coordination.k8s.io", "kube-node-lease"),
        ("get", "secrets", "", "deathwatch-system"),
        ("patch", "nodes", "", None),
        ("update", "nodes", "", None),
        ("delete", "nodes", "", None),
        ("create", "nodes", "", None),
        ("patch", "nodes", "", "status"),
        ("get", "configmaps", "", "deathwatch-system"),
    ):
        assert not _allowed(api, verb, resource, group, namespace, user=user), (verb, resource)


def test_controller_rbac_allows_its_job_and_refuses_everything_else(
    control_plane: controlplane.ControlPlane, api: client.ApiClient
) -> None:
    control_plane.kubectl_run("create", "namespace", "deathwatch-system", check=False)
    control_plane.kubectl_run("apply", "-f", str(MANIFESTS / "base" / "rbac"))
    needed = [
        ("get", "pods", ""),
        ("list", "pods", ""),
        ("watch", "pods", ""),
        ("create", "events", ""),
        ("get", "deathwatches", "deathwatch.dev"),
        ("list", "deathwatches", "deathwatch.dev"),
        ("watch", "deathwatches", "deathwatch.dev"),
        ("get", "sandboxverdicts", "deathwatch.dev"),
        ("list", "sandboxverdicts", "deathwatch.dev"),
        ("watch", "sandboxverdicts", "deathwatch.dev"),
        ("create", "sandboxverdicts", "deathwatch.dev"),
        ("delete", "sandboxverdicts", "deathwatch.dev"),
    ]
    for verb, resource, group in needed:
        assert _allowed(api, verb, resource, group), (verb, resource)
    # who may read its metrics: asked of the API (system:auth-delegator, cluster-wide)
    assert _allowed(api, "create", "tokenreviews", "authentication.k8s.io", None)
    assert _allowed(api, "create", "subjectaccessreviews", "authorization.k8s.io", None)
    assert _allowed(api, "update", "sandboxverdicts", "deathwatch.dev", subresource="status")
    assert _allowed(api, "update", "deathwatches", "deathwatch.dev", subresource="status")
    # a shard applies its part of a DeathWatch's status: granted whatever the shard count, so
    # no reshard's roll refuses an old shard (ADR 0026)
    assert _allowed(api, "patch", "deathwatches", "deathwatch.dev", subresource="status")
    assert _allowed(
        api, "get", "daemonsets", "apps", "deathwatch-system", "status", "deathwatch-firewall"
    )
    refused = [
        ("create", "pods", "", None),
        ("update", "pods", "", None),
        ("patch", "pods", "", None),
        ("delete", "pods", "", None),
        ("deletecollection", "pods", "", None),
        ("create", "pods", "", "exec"),
        ("get", "pods", "", "exec"),
        ("patch", "pods", "", "status"),
        ("create", "pods", "", "eviction"),
        ("get", "secrets", "", None),
        ("list", "secrets", "", None),
        ("get", "configmaps", "", None),
        ("update", "sandboxverdicts", "deathwatch.dev", None),
        ("update", "deathwatches", "deathwatch.dev", None),
        ("patch", "sandboxverdicts", "deathwatch.dev", "status"),
        ("delete", "deathwatches", "deathwatch.dev", None),
        ("patch", "events", "", None),
        ("list", "nodes", "", None),
    ]
    for verb, resource, group, sub in refused:
        assert not _allowed(api, verb, resource, group, subresource=sub), (verb, resource, sub)
    # the DaemonSet status read is for the firewall's own DaemonSet only
    assert not _allowed(api, "get", "daemonsets", "apps", "deathwatch-system", "status", "other")
    assert not _allowed(
        api, "get", "daemonsets", "apps", "kube-system", "status", "deathwatch-firewall"
    )
    # leader election: its one Lease, in its own namespace, and nothing else
    lease = ("leases", "coordination.k8s.io", "deathwatch-system")
    for verb in ("get", "update", "list", "watch"):
        assert _allowed(api, verb, *lease, None, "deathwatch-controller")
        if verb not in ("list", "watch"):  # the namespace's Leases are read whole (below)
            assert not _allowed(api, verb, *lease, None, "kube-scheduler")
        assert not _allowed(api, verb, "leases", "coordination.k8s.io", "kube-system", None,
                            "deathwatch-controller")  # fmt: skip
    assert _allowed(api, "create", *lease)
    assert not _allowed(api, "delete", *lease, None, "deathwatch-controller")
    assert _allowed(api, "list", *lease)  # the firewall agents' coverage Leases
    assert _allowed(api, "watch", *lease)  # the exits Leases (--node-exits), one per node
    assert not _allowed(api, "watch", "leases", "coordination.k8s.io", "kube-system")
    assert not _allowed(api, "list", "leases", "coordination.k8s.io", "kube-system")
    assert not _allowed(api, "create", "leases", "coordination.k8s.io", "kube-system")
