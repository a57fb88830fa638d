"""`deathwatch preflight` on the real API server: what it reads, what it says, its exit codes,
and a narrow role's reads skipped with why. The judgements in detail: tests/unit/test_preflight.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from hack.localcluster import controlplane
from hack.localcluster.controller_process import service_account_token
from tests.kube import fresh_namespace

pytestmark = pytest.mark.apiserver


def preflight(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deathwatch._cli", "preflight", *args],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


@pytest.fixture
def seeded(api: client.ApiClient) -> Iterator[str]:
    """A namespace with a pod whose liveness probe is on the agent port, a pod outside the
    nodes' ranges (under a Kata RuntimeClass), a DeathWatch selecting everything; two nodes, one
    without a podCIDR; kube-proxy's ConfigMap (IPVS) and a Calico DaemonSet (scheduled
    nowhere)."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    custom = client.CustomObjectsApi(api)
    ns = f"preflight-{time.monotonic_ns() % 10**8}"
    fresh_namespace(api, ns)
    nodes = {f"{ns}-a": ["10.250.0.0/24"], f"{ns}-b": []}
    for name, cidrs in nodes.items():
        core.create_node({"metadata": {"name": name}, "spec": {"podCIDRs": cidrs} if cidrs else {}},
                         _request_timeout=30)  # fmt: skip
    runtime_class = f"{ns}-kata"
    client.NodeV1Api(api).create_runtime_class(
        {"metadata": {"name": runtime_class}, "handler": "kata-qemu"}, _request_timeout=30
    )
    probe = {"tcpSocket": {"port": 49983}}
    for name, extra, spec in (
        ("live", {"livenessProbe": probe}, {}),
        ("outside", {}, {"runtimeClassName": runtime_class}),
    ):
        core.create_namespaced_pod(ns, {"metadata": {"name": name, "labels": {"app": "sandbox"}},
            "spec": {"containers": [{"name": "c", "image": "busybox", **extra}], **spec}},
            _request_timeout=30)  # fmt: skip
    core.patch_namespaced_pod_status("outside", ns, {"status": {"podIP": "192.168.77.7",
                                     "podIPs": [{"ip": "192.168.77.7"}]}}, _request_timeout=30)  # fmt: skip
    custom.create_namespaced_custom_object("deathwatch.dev", "v1alpha1", ns, "deathwatches",
        {"apiVersion": "deathwatch.dev/v1alpha1", "kind": "DeathWatch",
         "metadata": {"name": "all"}, "spec": {}}, _request_timeout=30)  # fmt: skip
    config = {"metadata": {"name": "kube-proxy"}, "data": {"config.conf": "mode: ipvs\n"}}
    core.create_namespaced_config_map("kube-system", config, _request_timeout=30)
    labels = {"k8s-app": "calico-node"}
    apps.create_namespaced_daemon_set("kube-system", {"metadata": {"name": "calico-node"},
        "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels},
                 "spec": {"nodeSelector": {"nowhere": "true"},
                          "containers": [{"name": "c", "image": "busybox"}]}}}},
        _request_timeout=30)  # fmt: skip
    try:
        yield ns
    finally:
        apps.delete_namespaced_daemon_set("calico-node", "kube-system", _request_timeout=30)
        core.delete_namespaced_config_map("kube-proxy", "kube-system", _request_timeout=30)
        for name in nodes:
            core.delete_node(name, _request_timeout=30)
        core.delete_namespace(ns, _request_timeout=30)
        client.NodeV1Api(api).delete_runtime_class(runtime_class, _request_timeout=30)


def test_preflight_reads_a_live_cluster_and_names_each_fix(
    control_plane: controlplane.ControlPlane, api: client.ApiClient, seeded: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    ns = seeded
    kc = str(control_plane.kubeconfig)
    done = preflight("--kubeconfig", kc, "-o", "json")
    assert done.returncode == 1, done.stderr  # a liveness probe the firewall would refuse
    found: dict[str, Any] = {f["check"]: f for f in json.loads(done.stdout)["findings"]}
    assert found["kubernetes"]["level"] == "ok" and "v1.35" in found["kubernetes"]["said"]
    assert "1.33 to 1.37" in found["kubernetes"]["said"]
    ranges = found["pod-ranges"]
    assert ranges["level"] == "warn" and f"{ns}-b" in ranges["said"], ranges
    assert f"{ns}/outside (192.168.77.7)" in ranges["said"] and "10.250.0.0/24" in ranges["said"]
    assert found["probes"]["level"] == "fail"
    assert f"{ns}/live (livenessProbe on 49983)" in found["probes"]["said"]
    assert found["selectors"]["level"] == "warn"
    assert f"{ns}/all 2 of 2" in found["selectors"]["said"]
    assert found["kube-proxy"]["level"] == "ok" and "IPVS" in found["kube-proxy"]["said"]
    assert found["cni"]["level"] == "warn" and "Calico" in found["cni"]["said"]
    runtimes = found["runtimes"]
    assert runtimes["level"] == "warn", runtimes
    assert f"{ns}-kata (kata-qemu: Kata Containers, reasoned, 1 pod(s))" in runtimes["said"]
    text = preflight("--kubeconfig", kc)
    assert text.returncode == 1 and text.stdout.startswith("deathwatch preflight: https://")
    assert "fail  probes" in text.stdout and "fix: give them exec probes" in text.stdout
    # a role that may read nothing but /version: every other check skipped, saying why
    core = client.CoreV1Api(api)
    core.create_namespaced_service_account(ns, {"metadata": {"name": "narrow"}},
                                           _request_timeout=30)  # fmt: skip
    narrow = tmp_path / "narrow.kubeconfig"
    narrow.write_text(controlplane.kubeconfig(control_plane.server, control_plane.certs / "ca.crt",
                      None, None, token=service_account_token(api, ns, "narrow"), user="narrow"))  # fmt: skip
    skipped = preflight("--kubeconfig", str(narrow), "-o", "json")
    assert skipped.returncode == 0, skipped.stderr
    levels = {f["check"]: (f["level"], f["said"]) for f in json.loads(skipped.stdout)["findings"]}
    assert levels["kubernetes"][0] == "ok"
    assert levels["pod-ranges"][0] == "skip" and "cannot read nodes: 403" in levels["pod-ranges"][1]
    assert (
        levels["runtimes"][0] == "skip"
        and "cannot read runtimeclasses: 403" in levels["runtimes"][1]
    )
    # nowhere to ask: one line, exit 3
    nowhere = tmp_path / "nowhere.kubeconfig"
    nowhere.write_text(controlplane.kubeconfig("https://127.0.0.1:1", control_plane.certs / "ca.crt",
                       None, None, token="t"))  # noqa: S106  # fmt: skip
    down = preflight("--kubeconfig", str(nowhere))
    assert down.returncode == 3 and down.stderr.count("\n") == 1, down.stderr
    assert "cannot reach the API server at https://127.0.0.1:1" in down.stderr
