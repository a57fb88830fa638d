"""Coverage that only its own node can write (issue #41, ADR 0027), on the real API server.

The firewall agents' RBAC and the ValidatingAdmissionPolicy exactly as the chart renders
them (what kustomize's base holds too). An agent's token is what its Pod gets: a
ServiceAccount token bound to a pod on a node, which the API server turns into a request
that names that node (`authentication.kubernetes.io/node-name`). With a token bound to a
pod on node-a: its own Lease is created and renewed; node-b's Lease, a Lease on node-a's
name claiming node-b, the controller's Lease, and any write with a token bound to no pod
are refused, each with the policy's message."""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from hack.localcluster import controlplane
from hack.localcluster.fakenodes import node_body
from hack.render_manifests import CHART, NAMESPACE, helm, without_helm_labels
from tests.kube import wait_for

pytestmark = pytest.mark.apiserver
AGENT = "deathwatch-firewall"
EXITS = "deathwatch-exits"  # the exits Lease (#42): the same agent, the same node
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
TEMPLATES = ("templates/rbac/firewall.yaml", "templates/firewall/coverage-policy.yaml")


def call(cp: controlplane.ControlPlane, token: str, method: str, path: str,
         body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:  # fmt: skip
    context = ssl.create_default_context(cafile=str(cp.certs / "ca.crt"))
    request = urllib.request.Request(  # noqa: S310 - the local API server
        cp.server + path, method=method, data=json.dumps(body).encode() if body else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as resp:  # noqa: S310
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def lease(name: str, node: str) -> dict[str, Any]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": NAMESPACE,
                     "labels": {"app.kubernetes.io/component": "firewall-coverage"},
                     "annotations": {"deathwatch.dev/node": node}},
        "spec": {"holderIdentity": f"{AGENT}-x", "leaseDurationSeconds": 15, "renewTime": now},
    }  # fmt: skip


@pytest.fixture(scope="module")
def tokens(control_plane: controlplane.ControlPlane, api: client.ApiClient) -> Iterator[dict[str, str]]:  # fmt: skip
    """The agent's token bound to a pod on node-a, and one bound to nothing."""
    cp = control_plane
    cp.kubectl_run("create", "namespace", NAMESPACE, check=False)
    rendered = helm("template", "deathwatch", str(CHART), "-n", NAMESPACE,
                    *(a for t in TEMPLATES for a in ("--show-only", t)))  # fmt: skip
    cp.kubectl_run("apply", "-f", "-", input=without_helm_labels(rendered))
    core = client.CoreV1Api(api)
    for i, name in enumerate(("policy-node-a", "policy-node-b")):
        with contextlib.suppress(client.ApiException):  # 409: made by an earlier run
            core.create_node(node_body(name, 40 + i, "4", "8Gi"), _request_timeout=30)
    pod = core.create_namespaced_pod(NAMESPACE, {
        "metadata": {"name": "agent-on-a"},
        "spec": {"nodeName": "policy-node-a", "serviceAccountName": AGENT,
                 "containers": [{"name": "agent", "image": "deathwatch/firewall:test"}]},
    }, _request_timeout=30)  # fmt: skip

    def token(bound: dict[str, Any] | None) -> str:
        spec: dict[str, Any] = {"expirationSeconds": 3600}
        if bound:
            spec["boundObjectRef"] = bound
        made = core.create_namespaced_service_account_token(AGENT, NAMESPACE, {"spec": spec},
                                                            _request_timeout=30)  # fmt: skip
        return str(made.status.token)

    # the API server admits the policy asynchronously: wait until it refuses an unbound token
    unbound = token(None)
    wait_for(lambda: call(cp, unbound, "POST", LEASES, lease("policy-probe", "x"))[0] == 403,
             timeout=30, what="the coverage policy in force")  # fmt: skip
    yield {
        "a": token({"kind": "Pod", "apiVersion": "v1", "name": "agent-on-a",
                    "uid": pod.metadata.uid}),
        "unbound": unbound,
    }  # fmt: skip
    core.delete_namespaced_pod("agent-on-a", NAMESPACE, grace_period_seconds=0,
                               _request_timeout=30)  # fmt: skip
    for name in ("policy-node-a", "policy-node-b"):
        core.delete_node(name, _request_timeout=30)
    # the session's control plane is shared: the netns lane's agents use unbound tokens
    for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
        cp.kubectl_run("delete", kind, f"{AGENT}-coverage", "--ignore-not-found")


@pytest.mark.parametrize("prefix", [AGENT, EXITS])
def test_an_agent_writes_its_own_nodes_coverage(
    control_plane: controlplane.ControlPlane, tokens: dict[str, str], prefix: str
) -> None:
    cp, token = control_plane, tokens["a"]
    name = f"{prefix}.policy-node-a"
    code, made = call(cp, token, "POST", LEASES, lease(name, "policy-node-a"))
    assert code == 201, made
    renewed = {**lease(name, "policy-node-a")}
    renewed["metadata"]["resourceVersion"] = made["metadata"]["resourceVersion"]
    code, body = call(cp, token, "PUT", f"{LEASES}/{name}", renewed)
    assert code == 200, body


@pytest.mark.parametrize(
    ("what", "method", "name", "node", "said"),
    [
        ("another node's Lease", "POST", f"{AGENT}.policy-node-b", "policy-node-b",
         f"may write only the Leases of its node, {AGENT}.policy-node-a and "
         f"{EXITS}.policy-node-a, not {AGENT}.policy-node-b"),
        ("another node's exits Lease", "POST", f"{EXITS}.policy-node-b", "policy-node-b",
         f"not {EXITS}.policy-node-b"),
        ("its own Lease claiming another node", "POST", f"{AGENT}.policy-node-a",
         "policy-node-b", "may speak for that node only (annotation deathwatch.dev/node)"),
        ("its own exits Lease claiming another node", "POST", f"{EXITS}.policy-node-a",
         "policy-node-b", "may speak for that node only (annotation deathwatch.dev/node)"),
        ("the controller's Lease", "PUT", "deathwatch-controller", "policy-node-a",
         f"may write only the Leases of its node, {AGENT}.policy-node-a and "
         f"{EXITS}.policy-node-a, not deathwatch-controller"),
        ("its own Lease, deleted", "DELETE", f"{AGENT}.policy-node-a", "policy-node-a", ""),
    ],
)  # fmt: skip
def test_an_agent_token_is_refused_everything_else(
    control_plane: controlplane.ControlPlane, api: client.ApiClient, tokens: dict[str, str],
    what: str, method: str, name: str, node: str, said: str,
) -> None:  # fmt: skip
    cp, token = control_plane, tokens["a"]
    leases = client.CoordinationV1Api(api)
    with contextlib.suppress(client.ApiException):  # the objects to write over
        leases.create_namespaced_lease(NAMESPACE, lease(name, node), _request_timeout=10)
    current = leases.read_namespaced_lease(name, NAMESPACE, _request_timeout=10)
    body = lease(name, node)
    body["metadata"]["resourceVersion"] = current.metadata.resource_version
    path = LEASES if method == "POST" else f"{LEASES}/{name}"
    if method == "POST":
        leases.delete_namespaced_lease(name, NAMESPACE, _request_timeout=10)
        body["metadata"].pop("resourceVersion")
    code, answer = call(cp, token, method, path, None if method == "DELETE" else body)
    assert code == 403, (what, code, answer)
    assert said in answer["message"], (what, answer["message"])


def test_a_token_bound_to_no_pod_writes_no_coverage(
    control_plane: controlplane.ControlPlane, tokens: dict[str, str]
) -> None:
    code, answer = call(control_plane, tokens["unbound"], "POST", LEASES,
                        lease(f"{AGENT}.policy-node-a-2", "policy-node-a"))  # fmt: skip
    assert code == 403, answer
    assert "this request's token names none" in answer["message"], answer
