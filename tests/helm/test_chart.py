"""The Helm chart (charts/deathwatch) on real Helm (hack/build-helm.sh): lint, values checked
by their schema with the field named, versions from VERSION, the generated manifests up to
date, and the one-source-of-truth rule: rendered with default values the chart is exactly
`kubectl kustomize manifests/overlays/cluster`, object by object, but for the Namespace
(Helm creates the release namespace itself); namespaced, it is exactly overlays/namespaced."""

from __future__ import annotations

import base64
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack import chart_readme
from hack.localcluster import controlplane
from hack.render_manifests import (
    CHART,
    HELM_ONLY_LABELS,
    NAMESPACE,
    helm,
    helm_bin,
    main,
    without_helm_labels,
)

pytestmark = pytest.mark.helm
ROOT = Path(__file__).resolve().parents[2]
Key = tuple[str, str, str]


def objects(text: str) -> dict[Key, Any]:
    out: dict[Key, Any] = {}
    for doc in yaml.safe_load_all(text):
        if doc:
            meta = doc["metadata"]
            key = (doc["kind"], meta.get("namespace", ""), meta["name"])
            assert key not in out, f"{key} twice"
            out[key] = doc
    return out


def kustomize(overlay: str) -> dict[Key, Any]:
    kubectl = controlplane.bin_dir() / "kubectl"
    if not kubectl.exists():
        pytest.skip("kubectl not built: run hack/build-k8s.sh")
    done = subprocess.run([str(kubectl), "kustomize", str(ROOT / "manifests" / "overlays" / overlay)],
                          capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    return objects(done.stdout)


def template(*sets: str) -> dict[Key, Any]:
    args = [a for s in sets for a in ("--set", s)]
    return objects(without_helm_labels(
        helm("template", "deathwatch", str(CHART), "-n", NAMESPACE, "--skip-tests", *args)
    ))  # fmt: skip


def test_helm_is_the_pinned_one() -> None:
    version = helm("version", "--template", "{{.Version}}")
    assert (
        version == (ROOT / "hack" / "versions.env").read_text().split("HELM_VERSION=")[1].split()[0]
    )
    assert str(helm_bin()).startswith(str(controlplane.cache_dir()))


def test_the_chart_is_versioned_as_the_repository() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = (ROOT / "VERSION").read_text().strip()
    assert (chart["version"], chart["appVersion"]) == (version, version)


@pytest.mark.parametrize(
    "sets",
    [
        [],
        [
            "prometheusRule.enabled=true",
            "metrics.serviceMonitor.enabled=true",
            "metrics.podMonitor.enabled=true",
            "dashboard.enabled=true",
        ],
        ["scope.clusterWide=false", "scope.namespaces={a,b}"],
        ["cleanup=true"],
    ],
)
def test_helm_lint_passes_strict(sets: list[str]) -> None:
    helm("lint", "--strict", str(CHART), *[a for s in sets for a in ("--set", s)])


def test_the_generated_manifests_are_up_to_date() -> None:
    assert main(["--check"]) == 0, "run python3 -m hack.render_manifests"


def test_the_default_render_is_the_cluster_overlay_object_by_object() -> None:
    chart, kustomized = template(), kustomize("cluster")
    namespace = ("Namespace", "", NAMESPACE)
    assert namespace in kustomized and namespace not in chart
    del kustomized[namespace]
    assert sorted(chart) == sorted(kustomized)
    for key, obj in chart.items():
        assert obj == kustomized[key], key


def test_the_namespaced_scope_is_the_namespaced_overlay() -> None:
    chart = template("scope.clusterWide=false", "scope.namespaces={sandboxes}")
    kustomized = kustomize("namespaced")
    del kustomized[("Namespace", "", NAMESPACE)]
    assert sorted(chart) == sorted(kustomized)
    for key, obj in chart.items():
        assert obj == kustomized[key], key
    args = chart[("Deployment", NAMESPACE, "deathwatch-controller")]["spec"]["template"]["spec"][
        "containers"][0]["args"]  # fmt: skip
    assert "--namespace=sandboxes" in args
    assert ("ClusterRoleBinding", "", "deathwatch-controller") not in chart


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["controller.replicas=two"], "at '/controller/replicas': got string, want integer"),
        (["firewall.agentPorts={70000}"], "at '/firewall/agentPorts/0': maximum"),
        (["controller.replica=2"], "additional properties 'replica' not allowed"),
        (["controller.logLevel=loud"], "at '/controller/logLevel'"),
        (["scope.clusterWide=false"], "scope.namespaces: name at least one namespace"),
        (["controller.image.digest=latest"], "at '/controller/image/digest'"),
        (
            ["metrics.readers[0].kind=ServiceAccount", "metrics.readers[0].name=prometheus"],
            "metrics.readers: a ServiceAccount needs its namespace",
        ),
        (
            ["metrics.readers[0].kind=Robot", "metrics.readers[0].name=x"],
            "at '/metrics/readers/0/kind'",
        ),
        (["networkPolicy.apiServer.cidrs={10.0.0.1}"], "at '/networkPolicy/apiServer/cidrs/0'"),
        (["controller.ports.health=0"], "at '/controller/ports/health'"),
        (["firewall.exits.runtimeStream=docker"], "at '/firewall/exits/runtimeStream'"),
        (
            ["firewall.exits.runtimeSocket=/opt/containerd.sock"],
            "firewall.exits.runtimeSocket: /opt/containerd.sock is not under "
            "firewall.exits.runtimeDir (/run)",
        ),
        (
            ["firewall.exits.runtimeDir=/var/snap/microk8s/common/run"],
            "firewall.exits.runtimeSocket: empty finds the known sockets under /run",
        ),
        (["firewall.exits.runtimeDir=/run/"], "at '/firewall/exits/runtimeDir'"),
        # a probe's timing is a value; its check is the chart's (never an open port)
        (["controller.livenessProbe.httpGet.port=8081"], "additional properties 'httpGet'"),
        (["controller.shardEpoch=soon"], "at '/controller/shardEpoch'"),
        (
            ["metrics.serviceMonitor.enabled=true", "metrics.tls.generated.renewDays=365"],
            "metrics.tls.generated.renewDays: 365 is not below days (365)",
        ),
    ],
)
def test_a_bad_value_is_refused_naming_its_field(sets: list[str], message: str) -> None:
    done = subprocess.run(
        [str(helm_bin()), "template", "x", str(CHART), *[a for s in sets for a in ("--set", s)]],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_values_reach_the_objects() -> None:
    rendered = template(
        "controller.image.repository=registry.example.com/dw/controller",
        "controller.image.digest=sha256:" + "a" * 64, "controller.replicas=3",
        "controller.leaderElection.leaseDurationSeconds=20", "controller.nodeSelector.pool=system",
        "firewall.podCIDRs={10.0.0.0/16,fd00::/48}", "firewall.agentPorts={49983,49984}",
        "firewall.inbound=false", "firewall.allowedSources={192.0.2.10/32}",
        "firewall.tolerations=null", "controller.controllerId=blue",
    )  # fmt: skip
    deployment = rendered[("Deployment", NAMESPACE, "deathwatch-controller")]["spec"]
    container = deployment["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example.com/dw/controller@sha256:" + "a" * 64
    assert deployment["replicas"] == 3 and "--lease-duration=20" in container["args"]
    assert deployment["template"]["spec"]["nodeSelector"] == {
        "kubernetes.io/os": "linux",
        "pool": "system",
    }
    config = yaml.safe_load(
        rendered[("ConfigMap", NAMESPACE, "deathwatch-firewall")]["data"]["config.yaml"]
    )
    assert config == {
        "podCIDRs": ["10.0.0.0/16", "fd00::/48"], "agentPorts": [49983, 49984], "resyncSeconds": 10,
        "inbound": False, "allowedSources": ["192.0.2.10/32"],
        "hostPodCIDROffsets": [0, 1], "mode": "enforce", "enforceNodeSelector": "",
        # the pods of this release's DeathWatches are the sandboxes it guards (ADR 0037)
        "sandboxSelector": "", "controllerId": "blue",
    }  # fmt: skip
    assert (
        "tolerations"
        not in rendered[("DaemonSet", NAMESPACE, "deathwatch-firewall")]["spec"]["template"]["spec"]
    )


def test_remove_table_on_uninstall_is_opt_in_with_just_the_rbac_it_needs() -> None:
    """Off: the agent never reads its DaemonSet, and may not. On: told its DaemonSet's name,
    allowed to get, list and watch that one; nothing to delete."""

    def agent(rendered: dict[Key, Any]) -> tuple[list[str], list[dict[str, Any]]]:
        ds = rendered[("DaemonSet", NAMESPACE, "deathwatch-firewall")]
        role = rendered[("Role", NAMESPACE, "deathwatch-firewall-coverage")]
        return ds["spec"]["template"]["spec"]["containers"][0]["args"], role["rules"]

    args, rules = agent(template())
    assert not [a for a in args if "uninstall" in a]
    assert [r["resources"] for r in rules] == [["leases"]] and "delete" not in rules[0]["verbs"]
    args, rules = agent(template("firewall.removeTableOnUninstall=true"))
    assert "--remove-on-uninstall=deathwatch-firewall" in args
    assert {"apiGroups": ["apps"], "resources": ["daemonsets"],
            "resourceNames": ["deathwatch-firewall"], "verbs": ["get", "list", "watch"]} in rules  # fmt: skip
    assert not [r for r in rules if "delete" in r["verbs"]]


def test_monitoring_is_opt_in_and_complete() -> None:
    assert not any(k[0] in ("ServiceMonitor", "PodMonitor", "PrometheusRule") for k in template())
    rendered = template("prometheusRule.enabled=true", "metrics.serviceMonitor.enabled=true",
                        "metrics.podMonitor.enabled=true", "dashboard.enabled=true",
                        "metrics.serviceMonitor.labels.release=kube-prometheus")  # fmt: skip
    monitor = rendered[("ServiceMonitor", NAMESPACE, "deathwatch")]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    # both components name their port `metrics`; the firewall's exits container its own
    endpoints = monitor["spec"]["endpoints"]
    assert [(e["port"], e["scheme"]) for e in endpoints] == [("metrics", "https"),
                                                             ("exits-metrics", "https")]  # fmt: skip
    # #59: the scraper's token from its Secret, no file of the Prometheus's own (a Prometheus
    # that forbids monitors file access refuses bearerTokenFile)
    for endpoint in endpoints:
        assert "bearerTokenFile" not in endpoint
        assert endpoint["authorization"] == {"type": "Bearer", "credentials": {
            "name": "deathwatch-metrics-scraper-token", "key": "token"}}  # fmt: skip
    alone = template("metrics.serviceMonitor.enabled=true")
    assert ("Secret", NAMESPACE, "deathwatch-metrics-scraper-token") in alone
    assert ("ClusterRoleBinding", "", "deathwatch-metrics-scraper") in alone
    pods = rendered[("PodMonitor", NAMESPACE, "deathwatch")]
    for endpoint in pods["spec"]["podMetricsEndpoints"]:
        assert (
            endpoint["authorization"]["credentials"]["name"] == "deathwatch-metrics-scraper-token"
        )
    assert [e["port"] for e in pods["spec"]["podMetricsEndpoints"]] == ["metrics", "exits-metrics"]
    quiet = template("metrics.podMonitor.enabled=true", "firewall.exits.enabled=false")
    assert [e["port"] for e in quiet[("PodMonitor", NAMESPACE, "deathwatch")]["spec"]
            ["podMetricsEndpoints"]] == ["metrics"]  # fmt: skip
    assert rendered[("Secret", NAMESPACE, "deathwatch-metrics-scraper-token")]["type"] == (
        "kubernetes.io/service-account-token"
    )
    rule = rendered[("PrometheusRule", NAMESPACE, "deathwatch")]
    plain = yaml.safe_load((ROOT / "monitoring" / "deathwatch.rules.yaml").read_text())
    assert rule["spec"] == plain  # the plain rules file is the PrometheusRule's, exactly
    dashboard = rendered[("ConfigMap", NAMESPACE, "deathwatch-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert yaml.safe_load(dashboard["data"]["deathwatch.json"])["uid"] == "deathwatch"


def test_who_reads_the_metrics_and_how_they_are_served() -> None:
    """ADR 0020: both components ask the API server about every token (auth-delegator), the
    reader role names the two URLs, the readers given are bound to it; cert-manager's
    certificate replaces the self-signed ones when asked for."""
    rendered = template("metrics.readers[0].kind=ServiceAccount",
                        "metrics.readers[0].name=prometheus-k8s",
                        "metrics.readers[0].namespace=monitoring")  # fmt: skip
    role = rendered[("ClusterRole", "", "deathwatch-metrics-reader")]
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    binding = rendered[("ClusterRoleBinding", "", "deathwatch-metrics-reader")]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}
    ]
    delegator = rendered[("ClusterRoleBinding", "", "deathwatch-auth-delegator")]
    assert delegator["roleRef"]["name"] == "system:auth-delegator"
    assert {s["name"] for s in delegator["subjects"]} == {"deathwatch-controller",
                                                          "deathwatch-firewall"}  # fmt: skip
    assert ("Certificate", NAMESPACE, "deathwatch-metrics") not in rendered
    tls = template("metrics.tls.certManager.enabled=true")
    assert tls[("Certificate", NAMESPACE, "deathwatch-metrics")]["spec"]["issuerRef"] == {
        "kind": "Issuer", "name": "deathwatch-metrics"}  # fmt: skip
    assert ("Issuer", NAMESPACE, "deathwatch-metrics") in tls
    for kind, name in (
        ("Deployment", "deathwatch-controller"),
        ("DaemonSet", "deathwatch-firewall"),
    ):
        pod = tls[(kind, NAMESPACE, name)]["spec"]["template"]["spec"]
        assert "--metrics-cert-dir=/etc/deathwatch/tls" in pod["containers"][0]["args"]
        assert {"name": "metrics-tls", "secret": {"secretName": "deathwatch-metrics-tls"}} in pod[
            "volumes"
        ]
    issued = template("metrics.tls.certManager.enabled=true",
                      "metrics.tls.certManager.issuerRef.kind=ClusterIssuer",
                      "metrics.tls.certManager.issuerRef.name=corp-ca")  # fmt: skip
    assert ("Issuer", NAMESPACE, "deathwatch-metrics") not in issued
    assert issued[("Certificate", NAMESPACE, "deathwatch-metrics")]["spec"]["issuerRef"] == {
        "kind": "ClusterIssuer", "name": "corp-ca"}  # fmt: skip


def test_without_cert_manager_the_monitors_verify_the_charts_own_ca() -> None:
    """#59 item 6: a ServiceMonitor or PodMonitor without cert-manager trusts a CA the chart
    makes (a Secret both components mount), by the name the certificate carries; without a
    monitor nothing is made and each process signs its own; off, the monitors skip verifying.
    The lane proves it on a real Prometheus (test_helm_lane.py)."""
    assert not any(k[0] == "Secret" and k[2] == "deathwatch-metrics-tls" for k in template())
    for monitor in ("serviceMonitor", "podMonitor"):
        rendered = template(f"metrics.{monitor}.enabled=true")
        secret = rendered[("Secret", NAMESPACE, "deathwatch-metrics-tls")]
        assert secret["type"] == "kubernetes.io/tls"
        ca, cert = (base64.b64decode(secret["data"][k]) for k in ("ca.crt", "tls.crt"))
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "ca.crt").write_bytes(ca)
            (Path(tmp) / "tls.crt").write_bytes(cert)
            verified = subprocess.run(["openssl", "verify", "-CAfile", "ca.crt", "tls.crt"],
                                      cwd=tmp, capture_output=True, text=True, check=False)  # fmt: skip
            assert verified.returncode == 0, verified.stderr
            names = subprocess.run(["openssl", "x509", "-in", "tls.crt", "-noout", "-ext",
                                    "subjectAltName"], cwd=tmp, capture_output=True, text=True,
                                   check=True).stdout  # fmt: skip
        kind = "ServiceMonitor" if monitor == "serviceMonitor" else "PodMonitor"
        spec = rendered[(kind, NAMESPACE, "deathwatch")]["spec"]
        for endpoint in spec.get("endpoints") or spec["podMetricsEndpoints"]:
            tls = endpoint["tlsConfig"]
            assert tls["ca"] == {"secret": {"name": "deathwatch-metrics-tls", "key": "ca.crt"}}
            assert f"DNS:{tls['serverName']}" in names, (tls, names)
            assert "insecureSkipVerify" not in tls
        for kind, name in (("Deployment", "deathwatch-controller"),
                           ("DaemonSet", "deathwatch-firewall")):  # fmt: skip
            pod = rendered[(kind, NAMESPACE, name)]["spec"]["template"]["spec"]
            for container in pod["containers"]:
                assert "--metrics-cert-dir=/etc/deathwatch/tls" in container["args"], container
    skipping = template(
        "metrics.serviceMonitor.enabled=true", "metrics.tls.generated.enabled=false"
    )
    assert ("Secret", NAMESPACE, "deathwatch-metrics-tls") not in skipping
    for endpoint in skipping[("ServiceMonitor", NAMESPACE, "deathwatch")]["spec"]["endpoints"]:
        assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}


def test_network_policies_admit_the_scrapers_and_reach_only_the_api_server() -> None:
    rendered = template()
    for component, port in (("controller", 8443), ("firewall", 9101)):
        policy = rendered[("NetworkPolicy", NAMESPACE, f"deathwatch-{component}")]["spec"]
        assert policy["policyTypes"] == ["Ingress", "Egress"]
        (ingress,) = policy["ingress"]
        assert ingress["ports"] == [{"port": port, "protocol": "TCP"}]
        (selector,) = ingress["from"]
        assert selector["namespaceSelector"]["matchExpressions"][0]["values"] == ["monitoring"]
        api, *dns = policy["egress"]
        assert api == {"ports": [{"port": 443, "protocol": "TCP"},
                                 {"port": 6443, "protocol": "TCP"}]}  # fmt: skip
        # the controller looks names up (a sink by hostname), at the cluster's DNS only
        assert dns == ([{"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                                 "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                         "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}]
                       if component == "controller" else [])  # fmt: skip
    narrowed = template("networkPolicy.apiServer.cidrs={192.0.2.10/32}",
                        "networkPolicy.metricsFrom={observability}")  # fmt: skip
    policy = narrowed[("NetworkPolicy", NAMESPACE, "deathwatch-controller")]["spec"]
    assert policy["egress"][0]["to"] == [{"ipBlock": {"cidr": "192.0.2.10/32"}}]
    assert policy["ingress"][0]["from"][0]["namespaceSelector"]["matchExpressions"][0][
        "values"] == ["observability"]  # fmt: skip
    assert not [k for k in template("networkPolicy.enabled=false") if k[0] == "NetworkPolicy"]
    local = template("networkPolicy.dns.namespaceSelector=null",
                     "networkPolicy.dns.podSelector=null", "networkPolicy.dns.cidrs={10.88.0.1/32}")  # fmt: skip
    policy = local[("NetworkPolicy", NAMESPACE, "deathwatch-controller")]["spec"]
    assert policy["egress"][1]["to"] == [{"ipBlock": {"cidr": "10.88.0.1/32"}}]
    off = template("networkPolicy.dns.enabled=false")
    assert len(off[("NetworkPolicy", NAMESPACE, "deathwatch-controller")]["spec"]["egress"]) == 1


def test_the_chart_packages_for_an_oci_registry(tmp_path: Path) -> None:
    helm("package", str(CHART), "--destination", str(tmp_path))
    version = (ROOT / "VERSION").read_text().strip()
    package = tmp_path / f"deathwatch-{version}.tgz"
    with tarfile.open(package) as tar:
        names = tar.getnames()
    assert "deathwatch/files/crds/deathwatches.deathwatch.dev.yaml" in names
    assert not [n for n in names if n.startswith("deathwatch/crds/")]  # templates: upgraded
    assert "deathwatch/values.schema.json" in names and "deathwatch/files/dashboard.json" in names
    assert (
        objects(helm("template", "deathwatch", str(package), "-n", NAMESPACE))
        == template_without_crds()
    )


def template_without_crds() -> dict[Key, Any]:
    return objects(helm("template", "deathwatch", str(CHART), "-n", NAMESPACE))


def test_every_object_carries_the_recommended_labels_and_selectors_never_change() -> None:
    """Kubernetes' recommended labels on every object and pod a release makes; selectors by
    name and component only (immutable: every release of the chart selects the same way)."""
    rendered = objects(helm("template", "dw-a", str(CHART), "-n", NAMESPACE))
    for key, obj in rendered.items():
        labels = obj["metadata"].get("labels") or {}
        assert labels.get("app.kubernetes.io/instance") == "dw-a", key
        assert labels.get("app.kubernetes.io/part-of") == "deathwatch", key
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", key
        assert labels.get("helm.sh/chart", "").startswith("deathwatch-"), key
        assert labels.get("app.kubernetes.io/version"), key
        spec: dict[str, Any] = obj.get("spec") or {}
        selector: dict[str, Any] = spec.get("selector") or {}
        if obj["kind"] in ("Deployment", "DaemonSet", "PodDisruptionBudget", "Service"):
            keys = set(selector.get("matchLabels") or selector)
            assert keys == {"app.kubernetes.io/name", "app.kubernetes.io/component"}, key
        pod = (spec.get("template") or {}).get("metadata")
        if pod:
            assert pod["labels"]["app.kubernetes.io/instance"] == "dw-a", key
    # the kustomize manifests claim no Helm release
    for path in (ROOT / "manifests").rglob("*.yaml"):
        assert not any(label in path.read_text() for label in HELM_ONLY_LABELS), path


def test_conventions_of_a_chart_platform_teams_expect() -> None:
    """Accepted as a subchart (global), behind a private registry (imagePullSecrets), with
    the pod settings other charts have; two writers refused by the schema; kubeVersion."""
    custom = template("global.registry=example", "imagePullSecrets[0].name=regcred",
                      "controller.priorityClassName=platform-critical",
                      "controller.podLabels.team=sandboxes", "firewall.podLabels.team=sandboxes",
                      "controller.extraArgs={--log-level=debug}",
                      "firewall.extraArgs={--resync-jitter=0}",
                      "controller.serviceAccount.annotations.example\\.com/role=reader",
                      "firewall.serviceAccount.annotations.example\\.com/role=agent")  # fmt: skip
    deploy = custom[("Deployment", NAMESPACE, "deathwatch-controller")]["spec"]["template"]
    agent = custom[("DaemonSet", NAMESPACE, "deathwatch-firewall")]["spec"]["template"]
    for pod in (deploy, agent):
        assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
        assert pod["metadata"]["labels"]["team"] == "sandboxes"
    assert deploy["spec"]["priorityClassName"] == "platform-critical"
    assert deploy["spec"]["containers"][0]["args"][-1] == "--log-level=debug"
    assert agent["spec"]["containers"][0]["args"][-1] == "--resync-jitter=0"
    for name, role in (("deathwatch-controller", "reader"), ("deathwatch-firewall", "agent")):
        sa = custom[("ServiceAccount", NAMESPACE, name)]
        assert sa["metadata"]["annotations"] == {"example.com/role": role}
    cleanup = template("cleanup=true", "imagePullSecrets[0].name=regcred")
    [ds] = [o for k, o in cleanup.items() if k[0] == "DaemonSet"]
    assert ds["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    with pytest.raises(SystemExit, match=r"/controller/replicas.*maximum: got 2, want 1"):
        template("controller.leaderElection.enabled=false")
    assert template("controller.leaderElection.enabled=false", "controller.replicas=1")
    with pytest.raises(SystemExit, match=r"requires kubeVersion: >=1.33.0-0"):
        helm("template", "deathwatch", str(CHART), "--kube-version", "1.32.0")
    assert helm("template", "deathwatch", str(CHART), "--kube-version", "1.37.2")
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.33.0-0"


def test_name_overrides_rename_every_object_and_every_reference_to_one() -> None:
    """fullnameOverride renames every object and every reference to one (RBAC subjects and
    roleRefs, the Lease the controller elects on, the DaemonSet it reads, Secrets, Services,
    the alerts' jobs); nameOverride the product label in every selector. Nothing named
    deathwatch-... is left but the agent's program and its config's path."""
    sets = ("fullnameOverride=platform-dw", "nameOverride=sandbox-watch",
            "firewall.removeTableOnUninstall=true", "prometheusRule.enabled=true",
            "metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true",
            "metrics.tls.certManager.enabled=true", "dashboard.enabled=true")  # fmt: skip
    rendered = template(*sets)
    for (kind, _, name), obj in rendered.items():
        if kind != "CustomResourceDefinition":
            assert name == "platform-dw" or name.startswith("platform-dw-"), (kind, name)
        labels = obj["metadata"].get("labels") or {}
        assert labels.get("app.kubernetes.io/name", "sandbox-watch") == "sandbox-watch", name
    text = yaml.safe_dump_all(list(rendered.values()))
    left = set(re.findall(r"(?<![\w./-])deathwatch-[a-z.-]+", text)) - {NAMESPACE}  # -n's
    assert left == {"deathwatch-firewall"}, (
        left
    )  # the program: command [deathwatch-firewall, check]
    deploy = rendered[("Deployment", NAMESPACE, "platform-dw-controller")]["spec"]["template"]
    args = deploy["spec"]["containers"][0]["args"]
    assert "--lease-name=platform-dw-controller" in args
    assert f"--firewall-daemonset={NAMESPACE}/platform-dw-firewall" in args
    assert deploy["spec"]["serviceAccountName"] == "platform-dw-controller"
    election = rendered[("Role", NAMESPACE, "platform-dw-controller-leader-election")]
    names = next(r["resourceNames"] for r in election["rules"] if r.get("resourceNames"))
    assert names[0] == "platform-dw-controller"
    assert all(n.startswith("platform-dw-controller-shard-") for n in names[1:])
    rules = rendered[("PrometheusRule", NAMESPACE, "platform-dw")]["spec"]["groups"]
    exprs = " ".join(r["expr"] for g in rules for r in g["rules"])
    assert (
        'job="platform-dw-controller-metrics"' in exprs
        and 'job="platform-dw-firewall-metrics"' in exprs
    )
    with pytest.raises(SystemExit, match="fullnameOverride"):
        template("fullnameOverride=" + "x" * 41)


def test_delivery_sinks_become_the_controllers_config_secrets_and_egress() -> None:
    """The sinks file the chart renders is one the controller's own parser accepts; each
    sink's Secret is mounted where the file says; the NetworkPolicy lets the controller reach
    the sinks; a change of the sinks rolls the controller; bad sinks are refused by the schema."""
    from deathwatch._operator.delivery import config as delivery_config

    sinks = ("delivery.clusterName=prod-eu-1", "delivery.sinks[0].name=billing",
             "delivery.sinks[0].url=https://billing.internal/hooks",
             "delivery.sinks[0].secretName=billing-hook", "delivery.sinks[0].states={Dead,Gone}",
             "delivery.sinks[1].name=pool", "delivery.sinks[1].url=http://pool.platform.svc:8080/",
             "delivery.sinks[1].secretName=pool-hook", "delivery.sinks[1].allowInsecure=true",
             "delivery.sinks[1].mode=binary", "delivery.egress[0].cidr=10.20.0.0/16",
             "delivery.egress[0].ports={443,8080}")  # fmt: skip
    rendered = template(*sinks)
    text = rendered[("ConfigMap", NAMESPACE, "deathwatch-delivery")]["data"]["sinks.yaml"]
    parsed = delivery_config.parse(yaml.safe_load(text))
    assert parsed.cluster == "prod-eu-1"
    assert [(s.name, str(s.secret_dir), s.mode) for s in parsed.sinks] == [
        ("billing", "/etc/deathwatch/delivery/billing", "structured"),
        ("pool", "/etc/deathwatch/delivery/pool", "binary"),
    ]
    deploy = rendered[("Deployment", NAMESPACE, "deathwatch-controller")]["spec"]["template"]
    container = deploy["spec"]["containers"][0]
    assert "--delivery-config=/etc/deathwatch/delivery-config/sinks.yaml" in container["args"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["sink-billing"] == "/etc/deathwatch/delivery/billing"
    volumes = {v["name"]: v for v in deploy["spec"]["volumes"]}
    assert volumes["sink-pool"]["secret"] == {"secretName": "pool-hook"}
    assert deploy["metadata"]["annotations"]["deathwatch.dev/delivery-config"]
    other = template(*sinks[:-3], "delivery.sinks[1].mode=structured")
    roll = other[("Deployment", NAMESPACE, "deathwatch-controller")]["spec"]["template"]
    assert roll["metadata"]["annotations"] != deploy["metadata"]["annotations"]
    policy = rendered[("NetworkPolicy", NAMESPACE, "deathwatch-controller")]["spec"]["egress"]
    assert {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}],
            "ports": [{"port": 443, "protocol": "TCP"}, {"port": 8080, "protocol": "TCP"}]} in policy  # fmt: skip
    assert ("ConfigMap", NAMESPACE, "deathwatch-delivery") not in template()
    for bad, said in (
        (("delivery.sinks[0].name=b", "delivery.sinks[0].url=https://b",
          "delivery.sinks[0].secretName=s"), "clusterName"),
        (("delivery.clusterName=c", "delivery.sinks[0].name=b", "delivery.sinks[0].url=http://b",
          "delivery.sinks[0].secretName=s"), "allowInsecure"),
        (("delivery.clusterName=c", "delivery.sinks[0].name=B", "delivery.sinks[0].url=https://b",
          "delivery.sinks[0].secretName=s"), "/delivery/sinks/0/name"),
        (("delivery.clusterName=c", "delivery.sinks[0].name=b", "delivery.sinks[0].url=https://b",
          "delivery.sinks[0].secretName=s", "delivery.sinks[0].timeoutSeconds=90"), "timeoutSeconds"),
    ):  # fmt: skip
        with pytest.raises(SystemExit, match=said):
            template(*bad)


def test_three_shards_are_three_pairs_each_on_its_own_lease_and_disruption_budget() -> None:
    rendered = template("controller.shards=3")
    deployments = {k[2]: o for k, o in rendered.items() if k[0] == "Deployment"
                   and "controller" in k[2]}  # fmt: skip
    assert sorted(deployments) == [f"deathwatch-controller-shard-{i}" for i in range(3)]
    selectors = set()
    for i in range(3):
        d = deployments[f"deathwatch-controller-shard-{i}"]["spec"]
        args = d["template"]["spec"]["containers"][0]["args"]
        assert {"--shards=3", f"--shard={i}", "--shard-epoch=pod:$(POD_NAMESPACE)/$(POD_NAME)",
                "--lease-name=deathwatch-controller",
                f"--lease-owner=deathwatch-controller-shard-{i}"} <= set(args)  # fmt: skip
        assert d["replicas"] == 2 and d["template"]["metadata"]["labels"][
            "deathwatch.dev/shard"
        ] == str(i)
        selectors.add(tuple(sorted(d["selector"]["matchLabels"].items())))
        pdb = rendered[("PodDisruptionBudget", NAMESPACE, f"deathwatch-controller-shard-{i}")]
        assert pdb["spec"]["selector"] == d["selector"] and pdb["spec"]["minAvailable"] == 1
    assert len(selectors) == 3  # no Deployment adopts another shard's pods
    role = rendered[("Role", NAMESPACE, "deathwatch-controller-leader-election")]
    every = ["deathwatch-controller", *(f"deathwatch-controller-shard-{i}" for i in range(64))]
    named = [(r["resources"], r["resourceNames"]) for r in role["rules"] if r.get("resourceNames")]
    # its Lease, and the Deployment that owns it (deleted with it), under any shard count
    assert named == [(["leases"], every), (["deployments"], every)]
    cluster_role = rendered[("ClusterRole", "", "deathwatch-controller")]
    status_verbs = next(r["verbs"] for r in cluster_role["rules"]
                        if r["resources"] == ["deathwatches/status"])  # fmt: skip
    assert status_verbs == ["get", "update", "patch"]  # each shard applies its part
    one = template()
    assert ("Deployment", NAMESPACE, "deathwatch-controller") in one  # one shard: as ever
    # ADR 0026: the controller's RBAC is the same whatever the shard count, so no reshard's
    # roll (1 -> 3 -> 2 -> 1) takes from a running shard what it still needs
    for count in ("1", "2", "3", "64"):
        other = template(f"controller.shards={count}")
        for kind, name in (("Role", "deathwatch-controller-leader-election"),
                           ("ClusterRole", "deathwatch-controller")):  # fmt: skip
            ns = NAMESPACE if kind == "Role" else ""
            assert other[(kind, ns, name)]["rules"] == rendered[(kind, ns, name)]["rules"], count
    with pytest.raises(SystemExit, match="shards"):
        template("controller.shards=65")


def test_every_value_is_documented_inline_and_in_the_charts_readme() -> None:
    """Each value (or its section) has a `# --` comment in values.yaml; the chart's README
    table is rendered from them and up to date."""
    text = (CHART / "values.yaml").read_text()
    said = {path for path, _ in chart_readme.documented(text)}

    def leaves(node: Any, prefix: str = "") -> list[str]:
        if isinstance(node, dict) and node:
            return [p for k, v in node.items() for p in leaves(v, f"{prefix}.{k}" if prefix else k)]
        return [prefix]

    missing = [p for p in leaves(yaml.safe_load(text))
               if not any(p == d or p.startswith(d + ".") for d in said)]  # fmt: skip
    assert missing == [], f"undocumented values: {missing}"
    assert chart_readme.main(["--check"]) == 0, "python3 -m hack.chart_readme"
    readme = (CHART / "README.md").read_text()
    assert "| `firewall.podCIDRs` | `[]` |" in readme


# --- the chart's conventions (issue #41) ----------------------------------------------------


def release(name: str, namespace: str, *sets: str) -> dict[Key, Any]:
    args = [a for s in sets for a in ("--set", s)]
    return objects(helm("template", name, str(CHART), "-n", namespace, *args))


def test_two_releases_share_no_name_and_a_release_named_deathwatch_keeps_its_names() -> None:
    a = release("deathwatch", "dw-a", "scope.clusterWide=false", "scope.namespaces={team-a}")
    b = release("platform", "dw-b", "scope.clusterWide=false", "scope.namespaces={team-b}",
                "firewall.enabled=false", "crds.enabled=false")  # the CRDs are a's  # fmt: skip
    assert ("Deployment", "dw-a", "deathwatch-controller") in a  # the kustomize names
    assert ("Deployment", "dw-b", "platform-deathwatch-controller") in b
    cluster_scoped_a = {(k, n) for k, ns, n in a if not ns}
    cluster_scoped_b = {(k, n) for k, ns, n in b if not ns}
    assert cluster_scoped_a and cluster_scoped_b and not cluster_scoped_a & cluster_scoped_b
    roles = [o for (k, _, _), o in b.items() if k in ("ClusterRoleBinding", "RoleBinding")]
    for binding in roles:  # every grant of B names B's own objects
        role = binding["roleRef"]["name"]
        assert role.startswith("platform-deathwatch") or role.startswith("system:"), binding
        for subject in binding.get("subjects", []):
            if subject["kind"] == "ServiceAccount":
                assert subject["name"].startswith("platform-deathwatch"), subject
    election = b[("Role", "dw-b", "platform-deathwatch-controller-leader-election")]
    assert "platform-deathwatch-controller" in election["rules"][1]["resourceNames"]
    staging = release("deathwatch-staging", "dw-s")
    assert ("DaemonSet", "dw-s", "deathwatch-staging-firewall") in staging


def test_service_accounts_security_contexts_labels_spread_and_the_os_selector() -> None:
    rendered = template(
        "controller.serviceAccount.create=false", "controller.serviceAccount.name=platform-sa",
        "firewall.serviceAccount.name=fw-sa", "commonLabels.team=sandbox-platform",
        "controller.podSecurityContext.runAsUser=1001",
        "controller.topologySpreadConstraints[0].maxSkew=2",
        "controller.topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
        "controller.topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule",
        "firewall.nodeSelector.pool=sandboxes",
    )  # fmt: skip
    accounts = {n for (k, _, n) in rendered if k == "ServiceAccount"}
    assert "platform-sa" not in accounts and "fw-sa" in accounts  # made only when asked
    deploy = rendered[("Deployment", NAMESPACE, "deathwatch-controller")]["spec"]["template"][
        "spec"
    ]
    assert deploy["serviceAccountName"] == "platform-sa"
    assert deploy["securityContext"]["runAsUser"] == 1001
    assert deploy["securityContext"]["runAsNonRoot"] is True  # the rest of the default kept
    assert deploy["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    assert deploy["nodeSelector"] == {"kubernetes.io/os": "linux"}
    ds = rendered[("DaemonSet", NAMESPACE, "deathwatch-firewall")]["spec"]["template"]["spec"]
    assert ds["serviceAccountName"] == "fw-sa"
    assert ds["nodeSelector"] == {"kubernetes.io/os": "linux", "pool": "sandboxes"}
    assert ds["containers"][0]["securityContext"]["capabilities"]["add"] == ["NET_ADMIN"]
    for (kind, _, name), obj in rendered.items():
        if kind != "CustomResourceDefinition":
            assert obj["metadata"]["labels"]["team"] == "sandbox-platform", (kind, name)
    for (kind, _, _), obj in rendered.items():  # every grant names the accounts in use
        for subject in obj.get("subjects", []) if kind.endswith("Binding") else []:
            if subject["kind"] == "ServiceAccount" and "controller" in obj["metadata"]["name"]:
                assert subject["name"] == "platform-sa", obj["metadata"]["name"]
    policy = rendered[("ValidatingAdmissionPolicy", "", "deathwatch-firewall-coverage")]
    assert (
        f"system:serviceaccount:{NAMESPACE}:fw-sa"
        in policy["spec"]["matchConditions"][0]["expression"]
    )


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("firewall.podCIDRs={banana}", "/firewall/podCIDRs/0"),
        ("firewall.podCIDRs={10.244.0.0/33}", "/firewall/podCIDRs/0"),
        ("firewall.allowedSources={gateway}", "/firewall/allowedSources/0"),
        ("firewall.agentPorts={70000}", "/firewall/agentPorts/0"),
        ("firewall.agentPorts=[]", "/firewall/agentPorts"),
        ("firewall.hostAddresses.extra={10.0.0.300}", "/firewall/hostAddresses/extra/0"),
        ("firewall.mode=warn", "/firewall/mode"),
        ("firewall.updateStrategy.rollingUpdate.maxSurge=1", "/firewall/updateStrategy/rollingUpdate/maxSurge"),
        ("firewall.updateStrategy.rollingUpdate.maxUnavailable=0", "/firewall/updateStrategy/rollingUpdate/maxUnavailable"),
        ("controller.serviceAccount.name=Not_A_Name", "/controller/serviceAccount/name"),
    ],
)  # fmt: skip
def test_a_bad_address_port_or_strategy_fails_naming_its_field(value: str, field: str) -> None:
    with pytest.raises(SystemExit, match=re.escape(f"at '{field}'")):
        template(value)


def notes(name: str, namespace: str, *sets: str, tmp: Path) -> str:
    """NOTES.txt as `helm install` prints it (helm template renders no NOTES: here it is
    rendered into a ConfigMap of a copy of the chart)."""
    import shutil

    copy = tmp / "chart"
    shutil.copytree(CHART, copy)
    text = (copy / "templates" / "NOTES.txt").read_text()
    (copy / "templates" / "_notes.tpl").write_text(
        '{{- define "notes" -}}\n' + text + "{{- end }}\n"
    )
    (copy / "templates" / "notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data:\n  notes: {{ include "notes" . | toJson }}\n'
    )
    args = [a for s in sets for a in ("--set", s)]
    out = helm(
        "template", name, str(copy), "-n", namespace, "--show-only", "templates/notes.yaml", *args
    )
    shutil.rmtree(copy)
    return str(yaml.safe_load(out)["data"]["notes"])


def test_the_notes_say_what_this_release_installed(tmp_path: Path) -> None:
    sharded = notes("dw", "sandbox-system", "controller.shards=3", "firewall.mode=audit",
                    "firewall.image.repository=registry.example.com/fw",
                    "imagePullSecrets[0].name=regcred", tmp=tmp_path)  # fmt: skip
    for i in range(3):
        assert f"deployment/dw-deathwatch-controller-shard-{i}" in sharded
    assert "deployment/dw-deathwatch-controller\n" not in sharded
    assert "daemonset/dw-deathwatch-firewall" in sharded and "AUDITS" in sharded
    # the off switch runs in the release's namespace (labelled privileged), with its image
    assert ("helm install dw-cleanup CHART --version VERSION -n sandbox-system --set cleanup=true "
            "--set firewall.table=deathwatch --set firewall.image.registry=ghcr.io "
            "--set firewall.image.repository=registry.example.com/fw "
            "--set firewall.image.tag=0.1.0") in sharded  # fmt: skip
    assert "imagePullSecrets[0].name=regcred" in sharded and "--create-namespace" not in sharded
    # every pull secret, each at its own index (issue #53: one index for all kept the last)
    two = notes("dw", "sandbox-system", "imagePullSecrets[0].name=a", "imagePullSecrets[1].name=b",
                tmp=tmp_path)  # fmt: skip
    assert "'imagePullSecrets[0].name=a' --set 'imagePullSecrets[1].name=b'" in two
    one_step = notes("deathwatch", NAMESPACE, "firewall.removeTableOnUninstall=true", tmp=tmp_path)
    assert "deployment/deathwatch-controller\n" in one_step and "one step" in one_step
    assert "cleanup=true" not in one_step
    none = notes("deathwatch", NAMESPACE, "firewall.enabled=false", "scope.clusterWide=false",
                 "scope.namespaces={a,b}", tmp=tmp_path)  # fmt: skip
    assert "daemonset" not in none and "No firewall" in none and "in a, b" in none
    # #59: the emergency path's step 1 (firewall.enabled=false) keeps step 2's command, and
    # behind a mirror the cleanup pulls from the mirror, with every pull secret
    assert "helm install deathwatch-cleanup CHART" in none and "cleanup=true" in none
    mirrored = notes("deathwatch", NAMESPACE, "firewall.enabled=false",
                     "global.imageRegistry=registry.corp.example/mirror",
                     "global.imagePullSecrets[0].name=corp", "imagePullSecrets[0].name=own",
                     "firewall.image.digest=sha256:" + "a" * 64, tmp=tmp_path)  # fmt: skip
    for said in ("--set global.imageRegistry=registry.corp.example/mirror",
                 "'global.imagePullSecrets[0].name=corp'", "'imagePullSecrets[0].name=own'",
                 "--set firewall.image.digest=sha256:" + "a" * 64):  # fmt: skip
        assert said in mirrored, (said, mirrored)
    # the CRDs are the chart's: upgraded with it, kept on uninstall (crds.keep)
    assert "Helm never upgrades CRDs" not in none and "upgrades the CRDs with the release" in none


def test_the_exits_container_holds_the_socket_alone_and_the_controller_reads_its_leases() -> None:
    """ADR 0028: the runtime's socket in the exits container only (no capability); the agent
    keeps NET_ADMIN and no socket; the controller watches the exits Leases; the admission
    policy admits each node's exits Lease. Off: none of it."""
    rendered = template("firewall.exits.runtimeSocket=/var/run/crio/crio.sock",
                        "firewall.exits.oomWaitMilliseconds=100",
                        "firewall.exits.runtimeStream=cri")  # fmt: skip
    ds = rendered[("DaemonSet", NAMESPACE, "deathwatch-firewall")]["spec"]["template"]["spec"]
    agent, exits = ds["containers"]
    assert (agent["name"], exits["name"]) == ("agent", "exits")
    assert exits["args"][:7] == ["exits", "--runtime-socket=/var/run/crio/crio.sock",
                                 "--host-root=/host", "--runtime-stream=cri", "--oom-wait=0.1",
                                 "--cgroup-root=/host/cgroup",
                                 "--lease-prefix=deathwatch-exits"]  # fmt: skip
    # the host's cgroup tree, read-only (recursively where the runtime can), for OOM counts
    assert {"name": "cgroup", "mountPath": "/host/cgroup", "readOnly": True,
            "recursiveReadOnly": "IfPossible"} in exits["volumeMounts"]  # fmt: skip
    assert all(m["name"] != "cgroup" for m in agent["volumeMounts"])
    assert exits["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert exits["securityContext"]["readOnlyRootFilesystem"] is True
    # the socket's directory, never the socket: a missing one never keeps the pod (and the
    # firewall in it) from starting (ADR 0031)
    assert {"name": "runtime", "mountPath": "/host/run", "readOnly": True} in exits["volumeMounts"]
    assert all(m["name"] != "runtime" for m in agent["volumeMounts"])
    assert "NET_ADMIN" not in str(exits) and agent["securityContext"]["capabilities"]["add"] == [
        "NET_ADMIN"
    ]
    (runtime,) = [v for v in ds["volumes"] if v["name"] == "runtime"]
    assert runtime["hostPath"] == {"path": "/run", "type": "Directory"}
    (cgroup,) = [v for v in ds["volumes"] if v["name"] == "cgroup"]
    assert cgroup["hostPath"] == {"path": "/sys/fs/cgroup", "type": "Directory"}
    unmounted = template("firewall.exits.cgroupRoot=")[
        ("DaemonSet", NAMESPACE, "deathwatch-firewall")]["spec"]["template"]["spec"]  # fmt: skip
    assert "cgroup" not in str(unmounted["containers"][1]) + str(unmounted["volumes"])
    # a deaf exits container never makes the agent's pod unready (ADR 0031)
    assert "readinessProbe" not in exits and "livenessProbe" in exits
    default = template()[("DaemonSet", NAMESPACE, "deathwatch-firewall")]["spec"]["template"]
    assert default["spec"]["containers"][1]["args"][1:3] == [
        "--runtime-socket=",
        "--host-root=/host",
    ]
    controller = rendered[("Deployment", NAMESPACE, "deathwatch-controller")]
    assert (
        f"--node-exits={NAMESPACE}"
        in controller["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    role = rendered[("Role", NAMESPACE, "deathwatch-controller-leader-election")]
    assert "watch" in role["rules"][0]["verbs"]
    policy = rendered[("ValidatingAdmissionPolicy", "", "deathwatch-firewall-coverage")]
    assert "variables.exits" in str(policy["spec"]["validations"])
    off = template("firewall.exits.enabled=false")
    ds = off[("DaemonSet", NAMESPACE, "deathwatch-firewall")]["spec"]["template"]["spec"]
    assert [c["name"] for c in ds["containers"]] == ["agent"]
    assert all(v["name"] not in ("runtime", "cgroup") for v in ds["volumes"])
    args = off[("Deployment", NAMESPACE, "deathwatch-controller")]["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert not any(a.startswith("--node-exits") for a in args)
    assert (
        "watch"
        not in off[("Role", NAMESPACE, "deathwatch-controller-leader-election")]["rules"][0][
            "verbs"
        ]
    )
    assert "variables.exits" not in str(
        off[("ValidatingAdmissionPolicy", "", "deathwatch-firewall-coverage")]
    )


def test_every_liveness_probe_reads_its_processs_heartbeat_file_not_a_port() -> None:
    """Issue #51: a port's probe could be starved by a neighbour on the kubelet's address.
    Each container's exec probe is deathwatch._kube.ports.HEARTBEAT_PROBE for the file its
    process is told to write, within that process's stall bound."""
    from deathwatch._kube.ports import HEARTBEAT_PROBE

    rendered = template()
    bounds = {"controller": 30, "agent": 300, "exits": 60}
    seen = set()
    for (kind, _, _), obj in rendered.items():
        if kind not in ("Deployment", "DaemonSet"):
            continue
        for c in obj["spec"]["template"]["spec"]["containers"]:
            if c["name"] not in bounds:
                continue
            (flag,) = [a for a in c["args"] if a.startswith("--heartbeat-file=")]
            path = flag.split("=", 1)[1]
            command = c["livenessProbe"]["exec"]["command"]
            assert command == [
                "sh",
                "-c",
                HEARTBEAT_PROBE.format(path=path, seconds=bounds[c["name"]]),
            ]
            seen.add(c["name"])
    assert seen == set(bounds)


def test_the_conventions_an_umbrella_chart_and_a_monitoring_stack_expect(tmp_path: Path) -> None:
    """#53, as cert-manager's and kube-prometheus-stack's charts do: `enabled` and any
    `global` a parent sets are accepted; global.imageRegistry and global.imagePullSecrets are
    read (the global registry replaces each image's own); namespaceOverride places every namespaced object;
    revisionHistoryLimit, the PDB's minAvailable, the monitors' relabelings, extraObjects with
    templates expanded; the alerts' additional labels, one disabled, a runbook of one's own."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "enabled": True,
        "global": {"imageRegistry": "mirror.example.com/k8s", "imagePullSecrets": [{"name": "parent"}],
                   "storageClass": "whatever a parent shares"},
        "imagePullSecrets": [{"name": "own"}],
        "namespaceOverride": "platform",
        "controller": {"revisionHistoryLimit": 3, "podDisruptionBudget": {"minAvailable": "50%"},
                       "livenessProbe": {"periodSeconds": 20, "failureThreshold": 6}},
        "firewall": {"image": {"registry": "agents.example.com"}, "revisionHistoryLimit": 4},
        "metrics": {"serviceMonitor": {"enabled": True, "relabelings": [{"targetLabel": "team", "replacement": "sre"}],
                                       "metricRelabelings": [{"action": "drop", "regex": "go_.*", "sourceLabels": ["__name__"]}]}},
        "prometheusRule": {"enabled": True, "additionalRuleLabels": {"team": "sre", "severity": "page"},
                           "disabled": {"DeathwatchFirewallWouldRefuse": True},
                           "runbookUrl": "https://wiki.example.com/deathwatch"},
        "extraObjects": [{"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": "{{ .Release.Name }}-extra", "namespace": "platform"},
                          "data": {"release": "{{ .Release.Name }}"}}],
    }))  # fmt: skip
    rendered = objects(without_helm_labels(helm(
        "template", "deathwatch", str(CHART), "-n", NAMESPACE, "-f", str(values))))  # fmt: skip
    namespaces = {ns for _, ns, _ in rendered if ns}
    assert namespaces == {"platform"}, namespaces
    deployment = rendered[("Deployment", "platform", "deathwatch-controller")]["spec"]
    daemonset = rendered[("DaemonSet", "platform", "deathwatch-firewall")]["spec"]
    assert (deployment["revisionHistoryLimit"], daemonset["revisionHistoryLimit"]) == (3, 4)
    probe = deployment["template"]["spec"]["containers"][0]["livenessProbe"]
    assert (probe["periodSeconds"], probe["failureThreshold"]) == (20, 6)
    assert "heartbeat" in str(probe["exec"]["command"])  # the check stays the chart's
    # global.imageRegistry replaces each image's registry, its own included (#59: Bitnami's
    # and kube-prometheus-stack's convention; a prefix made mirror/ghcr.io/...)
    for spec, image in ((deployment, "mirror.example.com/k8s/deathwatch-dev/controller:"),
                        (daemonset, "mirror.example.com/k8s/deathwatch-dev/firewall:")):  # fmt: skip
        pod = spec["template"]["spec"]
        assert all(c["image"].startswith(image) for c in pod["containers"]), pod["containers"]
        assert pod["imagePullSecrets"] == [{"name": "own"}, {"name": "parent"}]
    pdb = rendered[("PodDisruptionBudget", "platform", "deathwatch-controller")]["spec"]
    assert pdb["minAvailable"] == "50%"
    monitor = rendered[("ServiceMonitor", "platform", "deathwatch")]["spec"]["endpoints"][0]
    assert monitor["relabelings"] == [{"targetLabel": "team", "replacement": "sre"}]
    assert monitor["metricRelabelings"][0]["action"] == "drop"
    extra = rendered[("ConfigMap", "platform", "deathwatch-extra")]
    assert extra["data"] == {"release": "deathwatch"}
    rules = [r for g in rendered[("PrometheusRule", "platform", "deathwatch")]["spec"]["groups"]
             for r in g["rules"]]  # fmt: skip
    names = {r["alert"] for r in rules}
    assert "DeathwatchFirewallWouldRefuse" not in names and "DeathwatchControllerDown" in names
    assert len(names) == 27
    for rule in rules:  # the team added to every alert; an alert's own severity kept
        assert rule["labels"]["team"] == "sre" and rule["labels"]["severity"] != "page", rule
        assert rule["annotations"]["runbook_url"].startswith("https://wiki.example.com/deathwatch#")
    default = template("prometheusRule.enabled=true")
    runbook = default[("PrometheusRule", NAMESPACE, "deathwatch")]["spec"]["groups"][0]["rules"][0]
    version = (ROOT / "VERSION").read_text().strip()
    assert runbook["annotations"]["runbook_url"].startswith(
        f"https://github.com/deathwatch-dev/deathwatch/blob/v{version}/docs/runbook.md#"
    )
    done = subprocess.run(
        [str(helm_bin()), "template", "x", str(CHART), "--set", "prometheusRule.enabled=true",
         "--set", "prometheusRule.disabled.DeathwatchNope=true"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "prometheusRule.disabled: DeathwatchNope is not one of the chart's alerts" in done.stderr


def test_an_umbrella_chart_turns_it_on_and_off_and_shares_its_globals(tmp_path: Path) -> None:
    """#53: a parent chart lists this one with `condition: deathwatch.enabled` and sets
    `global`: the strict schema accepts both (before, `enabled` was an unknown key and the
    parent's render failed), off renders nothing of it, on renders it with the parent's
    registry."""
    parent = tmp_path / "platform"
    (parent / "charts").mkdir(parents=True)
    (parent / "Chart.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v2", "name": "platform", "version": "1.0.0",
        "dependencies": [{"name": "deathwatch", "version": ">=0.0.0-0",
                          "repository": f"file://{CHART}", "condition": "deathwatch.enabled"}],
    }))  # fmt: skip
    (parent / "values.yaml").write_text(yaml.safe_dump({
        "global": {"imageRegistry": "mirror.example.com", "team": "platform"},
        "deathwatch": {"enabled": True},
    }))  # fmt: skip
    helm("dependency", "build", str(parent))
    on = objects(helm("template", "platform", str(parent), "-n", NAMESPACE))
    images = {c["image"] for (kind, _, _), o in on.items() if kind in ("Deployment", "DaemonSet")
              for c in o["spec"]["template"]["spec"]["containers"]}  # fmt: skip
    assert images and all(i.startswith("mirror.example.com/deathwatch-dev/") for i in images), (
        images
    )
    off = objects(helm("template", "platform", str(parent), "-n", NAMESPACE,
                       "--set", "deathwatch.enabled=false"))  # fmt: skip
    assert off == {}


def test_the_crds_are_templates_kept_on_uninstall_unless_told_and_equal_to_their_source() -> None:
    """ADR 0032: each `helm upgrade` applies the chart's CRDs (templates, not crds/), with
    helm.sh/resource-policy: keep unless crds.keep=false; crds.enabled=false renders none (a
    second release); their spec is files/crds/'s, the one source of the kustomize CRDs too."""
    crds = {k: o for k, o in template().items() if k[0] == "CustomResourceDefinition"}
    assert {n for _, _, n in crds} == {
        "deathwatches.deathwatch.dev",
        "sandboxverdicts.deathwatch.dev",
    }
    for (_, _, name), crd in crds.items():
        source = yaml.safe_load((CHART / "files" / "crds" / f"{name}.yaml").read_text())
        assert crd["spec"] == source["spec"], name
        # which release applied it (ADR 0038: another release applying them too is said)
        assert crd["metadata"]["annotations"] == {
            "helm.sh/resource-policy": "keep", "argocd.argoproj.io/sync-wave": "-1",
            "deathwatch.dev/release": f"{NAMESPACE}/deathwatch"}, name  # fmt: skip
    loose = template("crds.keep=false")
    assert all(o["metadata"]["annotations"] == {"argocd.argoproj.io/sync-wave": "-1",
                                                "deathwatch.dev/release": f"{NAMESPACE}/deathwatch"}
               for k, o in loose.items() if k[0] == "CustomResourceDefinition")  # fmt: skip
    assert not [k for k in template("crds.enabled=false") if k[0] == "CustomResourceDefinition"]
    assert not [k for k in template("cleanup=true") if k[0] == "CustomResourceDefinition"]


def test_helm_test_waits_for_a_verdict_of_its_own_where_the_controller_serves() -> None:
    """`helm test`: a DeathWatch selecting only the test's pod, which waits (`deathwatch wait`)
    for its own verdict; in a namespace the controller serves, with its controller id; none
    with helmTest.enabled=false. The Helm lane runs it on the real node."""

    def hooks(*sets: str) -> dict[Key, Any]:
        args = [a for s in sets for a in ("--set", s)]
        return objects(helm("template", "deathwatch", str(CHART), "-n", NAMESPACE,
                            "--show-only", "templates/tests/verdict.yaml", *args))  # fmt: skip

    found = hooks()
    assert {k[0] for k in found} == {"ServiceAccount", "Role", "RoleBinding", "DeathWatch", "Pod"}
    pod = found[("Pod", NAMESPACE, "deathwatch-test")]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    watch = found[("DeathWatch", NAMESPACE, "deathwatch-test")]
    assert watch["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    [container] = pod["spec"]["containers"]
    assert container["command"][:2] == ["deathwatch", "wait"]
    assert container["args"] == [f"{NAMESPACE}/deathwatch-test"]
    scoped = hooks("scope.clusterWide=false", "scope.namespaces={team-a,team-b}",
                   "controller.controllerId=blue")  # fmt: skip
    assert {ns for _, ns, _ in scoped} == {"team-a"}
    annotations = scoped[("DeathWatch", "team-a", "deathwatch-test")]["metadata"]["annotations"]
    assert annotations["deathwatch.dev/controller-id"] == "blue"
    assert not [k for k in objects(helm("template", "deathwatch", str(CHART), "-n", NAMESPACE,
                                        "--set", "helmTest.enabled=false"))
                if k[2] == "deathwatch-test"]  # fmt: skip


def test_the_crds_come_first_under_argo_cd_and_the_test_hook_stays_out_of_a_skip_tests_render() -> (
    None
):
    """docs/gitops.md: the CRDs in sync wave -1 (the DeathWatches of the same sync need their
    kind); `helm template --skip-tests` renders no test hook (Argo CD ignores it anyway)."""
    rendered = template()
    crds = [o for (kind, _, _), o in rendered.items() if kind == "CustomResourceDefinition"]
    assert len(crds) == 2
    for crd in crds:
        assert crd["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"] == "-1"

    def hooks(text: str) -> list[str]:
        return [o["kind"] for o in objects(text).values()
                if (o["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"]  # fmt: skip

    # helmTest.enabled: the test's pod, DeathWatch and RBAC
    assert "Pod" in hooks(helm("template", "deathwatch", str(CHART), "-n", NAMESPACE))
    assert hooks(helm("template", "deathwatch", str(CHART), "-n", NAMESPACE, "--skip-tests")) == []


def test_argo_cd_keeps_the_metrics_ca_it_synced_first() -> None:
    """docs/gitops.md: with the Application's values the chart makes the metrics CA (a new one
    at every `helm template`), and the Application ignores that Secret's data and respects
    it at sync, so a sync never swaps the CA its Prometheus trusts (ADR 0043)."""
    page = (ROOT / "docs" / "gitops.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", page, re.DOTALL)
    [app] = [d for b in blocks for d in yaml.safe_load_all(b) if d and d["kind"] == "Application"]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(app["spec"]["source"]["helm"]["valuesObject"], f)
        f.flush()
        rendered = objects(helm("template", app["spec"]["source"]["helm"]["releaseName"],
                                str(CHART), "-n", app["spec"]["destination"]["namespace"],
                                "--skip-tests", "-f", f.name))  # fmt: skip
    made = [
        name for kind, _, name in rendered if kind == "Secret" and name.endswith("-metrics-tls")
    ]
    ignored = [(d["kind"], d["name"], d["jsonPointers"]) for d in app["spec"]["ignoreDifferences"]]
    assert [("Secret", name, ["/data"]) for name in made] == ignored, (made, ignored)
    assert "RespectIgnoreDifferences=true" in app["spec"]["syncPolicy"]["syncOptions"]


def test_the_runtime_collision_checks_get_their_identities_and_only_read_access() -> None:
    """ADR 0038: each controller knows its Deployment (--lease-owner) and, where its release
    applies the CRDs, its NAMESPACE/RELEASE; each agent its DaemonSet. The grants for the
    check are reads: list (the controller: Deployments and DaemonSets; the agents:
    DaemonSets) and get of the two CRDs by name."""
    rendered = template()
    deployment = rendered[("Deployment", NAMESPACE, "deathwatch-controller")]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--crds-release={NAMESPACE}/deathwatch" in args
    assert "--lease-owner=deathwatch-controller" in args
    off = template("crds.enabled=false")[("Deployment", NAMESPACE, "deathwatch-controller")]
    assert not [a for a in off["spec"]["template"]["spec"]["containers"][0]["args"]
                if a.startswith("--crds-release")]  # fmt: skip
    agent = rendered[("DaemonSet", NAMESPACE, "deathwatch-firewall")]["spec"]["template"]["spec"]
    assert "--daemonset=deathwatch-firewall" in agent["containers"][0]["args"]
    releases = rendered[("ClusterRole", "", "deathwatch-controller-releases")]["rules"]
    assert {v for r in releases for v in r["verbs"]} <= {"list", "get"}
    crds = next(r for r in releases if r["apiGroups"] == ["apiextensions.k8s.io"])
    assert crds["resourceNames"] and crds["verbs"] == ["get"]
    firewall = rendered[("ClusterRole", "", "deathwatch-firewall")]["rules"]
    assert {v for r in firewall for v in r["verbs"]} <= {"get", "list", "watch"}
    assert any(r["resources"] == ["daemonsets"] for r in firewall)
    assert any(r["resources"] == ["deathwatches"] for r in firewall)
