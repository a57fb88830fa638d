"""The local control plane is real: CRD schemas, CEL rules, watches, selectors, RBAC."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from hack.localcluster import controlplane
from tests.conftest import _binaries_or_skip
from tests.kube import pod_body, wait_for

pytestmark = pytest.mark.apiserver


def test_crds_are_established_with_printer_columns(
    control_plane: controlplane.ControlPlane, namespace: str
) -> None:
    out = (
        control_plane.kubectl_run("get", "dw,sv", "-n", namespace).stdout
        + control_plane.kubectl_run("api-resources", "--api-group=deathwatch.dev").stdout
    )
    assert "deathwatches" in out
    assert "sandboxverdicts" in out
    control_plane.kubectl_run(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input="apiVersion: deathwatch.dev/v1alpha1\nkind: DeathWatch\nmetadata: {name: sandboxes}\nspec: {podSelector: {matchLabels: {app: sandbox}}}\n",
    )
    table = control_plane.kubectl_run("get", "dw", "-n", namespace).stdout.splitlines()[0].split()
    assert table == [
        "NAME", "TRACKED", "ALIVE", "SUSPECT", "DEAD", "FLAPS", "FIREWALL", "UNCOVERED", "AGE"
    ]  # fmt: skip
    dw = control_plane.kubectl_run(
        "get", "dw", "sandboxes", "-n", namespace, "-o", "jsonpath={.spec}"
    ).stdout
    # defaults filled in by the schema
    assert '"policy":"auto"' in dw
    assert '"verdictRetention":"1h"' in dw


def test_an_invalid_deathwatch_is_rejected_naming_each_field(
    control_plane: controlplane.ControlPlane, namespace: str
) -> None:
    bad = """
apiVersion: deathwatch.dev/v1alpha1
kind: DeathWatch
metadata: {name: bad}
spec:
  policy: "No Such"
  execProbe: {windowMultiplier: 0}
  agentPorts: [70000]
  verdictRetention: forever
  podSelector: {matchExpressions: [{key: app, operator: In}]}
"""
    result = control_plane.kubectl_run("apply", "-n", namespace, "-f", "-", input=bad, check=False)
    assert result.returncode != 0
    for expected in (
        'spec.policy: Invalid value: "No Such"',
        "spec.execProbe.windowMultiplier: Invalid value: 0",
        "spec.agentPorts[0]: Invalid value: 70000",
        'spec.verdictRetention: Invalid value: "forever"',
        "expected a Go duration such as 1h, 90m or 1h30m",  # the format, the bound, the value
        "of at most 8760h, got forever",
        "spec.podSelector.matchExpressions[].values: operator In needs 1 to 64 values (key app)",
    ):
        assert expected in result.stderr, expected
    assert "conversion error" not in result.stderr


def test_a_dead_verdict_cannot_be_taken_back(
    control_plane: controlplane.ControlPlane, namespace: str
) -> None:
    kubectl = control_plane.kubectl_run
    kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input="apiVersion: deathwatch.dev/v1alpha1\nkind: SandboxVerdict\nmetadata: {name: sbx}\nspec: {deathWatch: dw}\n",
    )
    kubectl(
        "patch",
        "sv",
        "sbx",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status":{"state":"Dead","podUID":"u1","cause":"OOMKilled"}}',
    )
    back = kubectl(
        "patch",
        "sv",
        "sbx",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status":{"state":"Alive"}}',
        check=False,
    )
    assert back.returncode != 0
    assert "a Dead verdict is never taken back" in back.stderr
    # a new pod of the same name may replace it
    kubectl(
        "patch",
        "sv",
        "sbx",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status":{"state":"Alive","podUID":"u2"}}',
    )
    table = kubectl("get", "sv", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "STATE", "POLICY", "CAUSE", "AGE"]
    assert table[1].split()[:2] == ["sbx", "Alive"]


def test_label_selector_list_and_watch_resuming_from_a_resource_version(
    api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    for name, app in (("a1", "sandbox"), ("a2", "sandbox"), ("b1", "other")):
        core.create_namespaced_pod(namespace, pod_body(name, {"app": app}), _request_timeout=30)
    listed = core.list_namespaced_pod(namespace, label_selector="app=sandbox", _request_timeout=30)
    assert sorted(p.metadata.name for p in listed.items) == ["a1", "a2"]
    rv = listed.metadata.resource_version
    # changes after the list: one matching, one not
    core.patch_namespaced_pod(
        "a1", namespace, {"metadata": {"labels": {"touched": "yes"}}}, _request_timeout=30
    )
    core.patch_namespaced_pod(
        "b1", namespace, {"metadata": {"labels": {"touched": "yes"}}}, _request_timeout=30
    )
    core.create_namespaced_pod(namespace, pod_body("a3", {"app": "sandbox"}), _request_timeout=30)
    seen: list[tuple[str, str]] = []
    w = watch.Watch()
    for event in w.stream(
        core.list_namespaced_pod,
        namespace,
        label_selector="app=sandbox",
        resource_version=rv,
        timeout_seconds=10,
        _request_timeout=30,
    ):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == 2:
            w.stop()
    # only what happened after rv, only what matches
    assert seen == [("MODIFIED", "a1"), ("ADDED", "a3")]


def test_a_token_from_token_request_is_refused_what_its_role_does_not_grant(
    control_plane: controlplane.ControlPlane, api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(
        namespace, {"metadata": {"name": "reader"}}, _request_timeout=30
    )
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
        _request_timeout=30,
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
        _request_timeout=30,
    )
    token = core.create_namespaced_service_account_token(
        "reader", namespace, {"spec": {"expirationSeconds": 600}}, _request_timeout=30
    ).status.token
    cfg = client.Configuration()
    cfg.host = control_plane.server
    cfg.ssl_ca_cert = str(control_plane.certs / "ca.crt")
    cfg.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(cfg) as as_reader:
        reader = client.CoreV1Api(as_reader)
        wait_for(
            lambda: reader.list_namespaced_pod(namespace, _request_timeout=10) is not None,
            what="RBAC to allow the reader",
            ignore=(client.ApiException,),
        )
        refused: dict[str, Any] = {}
        calls: dict[str, Callable[[], Any]] = {
            "list secrets": lambda: reader.list_namespaced_secret(namespace, _request_timeout=10),
            "create pods": lambda: reader.create_namespaced_pod(
                namespace, pod_body("x"), _request_timeout=10
            ),
            "list pods elsewhere": lambda: reader.list_namespaced_pod(
                "kube-system", _request_timeout=10
            ),
        }
        for what, call in calls.items():
            with pytest.raises(client.ApiException) as info:
                call()
            refused[what] = info.value.status
        assert refused == {"list secrets": 403, "create pods": 403, "list pods elsewhere": 403}


def test_apiserver_restart_keeps_data_and_expires_old_watches_with_410(
    control_plane: controlplane.ControlPlane, api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "kept"}, "data": {"k": "v"}}, _request_timeout=30
    )
    old_rv = core.list_namespaced_config_map(
        namespace, _request_timeout=30
    ).metadata.resource_version
    core.patch_namespaced_config_map("kept", namespace, {"data": {"k": "w"}}, _request_timeout=30)
    control_plane.stop_apiserver()
    assert not controlplane.port_open(control_plane.apiserver_port)
    with pytest.raises(Exception):  # noqa: B017 - any connection error
        core.read_namespaced_config_map("kept", namespace, _request_timeout=2)
    started = time.monotonic()
    control_plane.start_apiserver()
    assert time.monotonic() - started < 30
    assert core.read_namespaced_config_map("kept", namespace, _request_timeout=30).data == {
        "k": "w"
    }
    # the new apiserver's watch cache starts at the current revision: a watch resumed from
    # before the restart is told to relist (what every controller must handle)
    with pytest.raises(client.ApiException) as info:
        for _ in watch.Watch().stream(
            core.list_namespaced_config_map,
            namespace,
            resource_version=old_rv,
            timeout_seconds=5,
            _request_timeout=30,
        ):
            pass
    assert info.value.status == 410
    assert "too old resource version" in str(info.value.reason) + str(info.value.body)


def test_start_under_15s_and_teardown_leaves_nothing() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="deathwatch-cp-"))
    cp = controlplane.ControlPlane(workdir)
    started = time.monotonic()
    cp.start()
    took = time.monotonic() - started
    pids = [p.popen.pid for p in cp.processes.values() if p.popen is not None]
    ports = [cp.etcd_port, cp.etcd_peer_port, cp.apiserver_port]
    assert all(controlplane.port_open(p) for p in (cp.etcd_port, cp.apiserver_port))
    cp.destroy()
    assert took < 15, f"control plane took {took:.1f}s to start"
    assert not workdir.exists()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"process {pid} left behind"
    for port in ports:
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still open"


def test_down_stops_in_order_and_fast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hack/control-plane.sh down` stops the controller-manager and the apiserver while
    etcd still answers: all at once, the apiserver retried its dead etcd until killed (15 s)."""
    _binaries_or_skip()
    monkeypatch.setattr(controlplane, "STATE", tmp_path / "control-plane.json")
    assert controlplane.cli_up() == 0
    pids = list(json.loads((tmp_path / "control-plane.json").read_text())["pids"].values())
    started = time.monotonic()
    assert controlplane.cli_down() == 0
    took = time.monotonic() - started
    assert not any(controlplane.alive(pid) for pid in pids)
    print(f"control plane down in {took:.1f}s")
    assert took < 5, f"down took {took:.1f}s"
    capsys.readouterr()


def test_a_start_failure_shows_each_components_log(tmp_path: Path) -> None:
    cp = controlplane.ControlPlane(tmp_path / "cp")
    cp.apiserver_args = lambda: [str(cp.binaries / "kube-apiserver"), "--no-such-flag"]  # type: ignore[method-assign]
    with pytest.raises(controlplane.StartError) as info:
        cp.start(timeout=20)
    text = str(info.value)
    assert "kube-apiserver did not become ready" in text
    assert "--- kube-apiserver (last lines of" in text
    assert "unknown flag: --no-such-flag" in text
    cp.destroy()
