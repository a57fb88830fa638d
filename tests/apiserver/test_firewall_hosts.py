"""The firewall agent's Node watch on the real API server, under the agent's own
ServiceAccount and the shipped RBAC: a node joining reaches its set of host addresses
within seconds, a node leaving takes its address with it, and the agent may not touch a
node. The learning itself, in process: tests/unit/test_firewall_hosts.py."""

from __future__ import annotations

import socket
import threading
from ipaddress import ip_address
from pathlib import Path

import pytest
from kubernetes import client

from deathwatch.firewall.config import parse_config
from deathwatch.firewall.hosts import Hosts, NodeAddresses, host_addresses
from deathwatch.firewall.kubeapi import ApiError, KubeApi, NoAnswer
from hack.localcluster import controlplane
from hack.localcluster.controller_process import service_account_token
from tests.kube import wait_for

pytestmark = pytest.mark.apiserver
ROOT = Path(__file__).resolve().parents[2]
CONFIG = parse_config({"podCIDRs": ["10.244.0.0/16", "fd00:10:244::/56"], "agentPorts": [49983]})


@pytest.fixture
def firewall_token(
    control_plane: controlplane.ControlPlane, api: client.ApiClient, tmp_path: Path
) -> Path:
    """The firewall agent's ServiceAccount and ClusterRole, as the chart ships them."""
    control_plane.kubectl_run("create", "namespace", "deathwatch-system", check=False)
    control_plane.kubectl_run(
        "apply", "-f", str(ROOT / "manifests" / "base" / "rbac" / "firewall.yaml")
    )
    path = tmp_path / "token"
    path.write_text(service_account_token(api, "deathwatch-system", "deathwatch-firewall"))
    return path


def test_a_node_joining_reaches_the_agents_set_within_seconds(
    control_plane: controlplane.ControlPlane, api: client.ApiClient, firewall_token: Path
) -> None:
    core = client.CoreV1Api(api)
    kube = KubeApi(control_plane.server, firewall_token, control_plane.certs / "ca.crt")
    stop, wakes = threading.Event(), threading.Event()
    watch = NodeAddresses(kube, wakes.set, lambda: None, stop)
    watch.start()
    try:
        wait_for(lambda: watch.snapshot() is not None, timeout=20, what="nodes listed")
        name = f"joins-{id(watch) % 10**6}"
        core.create_node({"metadata": {"name": name, "annotations": {
            "projectcalico.org/IPv4VXLANTunnelAddr": "10.244.77.1"}}}, _request_timeout=10)  # fmt: skip

        def learned() -> Hosts | None:
            nodes = watch.snapshot() or []
            hosts = host_addresses(nodes, CONFIG)
            return hosts if ip_address("10.244.77.1") in hosts.addresses else None

        wait_for(learned, timeout=5, what="the new node's tunnel address")
        core.delete_node(name, _request_timeout=10)
        wait_for(lambda: ip_address("10.244.77.1") not in host_addresses(watch.snapshot() or [], CONFIG).addresses,
                 timeout=5, what="the node gone, its address with it")  # fmt: skip
        # read only: the agent may not touch a node
        with pytest.raises(ApiError) as refused:
            kube.call("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": {"x": "y"}}})
        assert refused.value.status == 403
    finally:
        stop.set()


def test_the_agents_calls_keep_one_connection_per_thread_and_make_it_again_when_cut(
    control_plane: controlplane.ControlPlane, firewall_token: Path
) -> None:
    """An exits write is one round trip on a kept connection (ADR 0028), each thread its own;
    a connection cut under it (an API server restarting, an idle timeout) is made again."""
    kube = KubeApi(control_plane.server, firewall_token, control_plane.certs / "ca.crt")
    kube.call("GET", "/api/v1/nodes")
    first = kube._kept.connection
    kube.get("/api/v1/nodes", {"limit": 1})
    assert kube._kept.connection is first and first.sock is not None
    theirs: list[object] = []

    def from_another_thread() -> None:
        kube.call("GET", "/api/v1/nodes")
        theirs.append(kube._kept.connection)

    other = threading.Thread(target=from_another_thread)
    other.start()
    other.join(30)
    assert theirs and theirs[0] is not first
    first.sock.shutdown(socket.SHUT_RDWR)
    assert kube.call("GET", "/api/v1/nodes")["kind"] == "NodeList"
    again = kube._kept.connection
    assert again is not first and again.sock is not None
    with pytest.raises(ApiError) as refused:  # a refusal keeps the connection
        kube.call("PATCH", "/api/v1/nodes/none", {"metadata": {"labels": {"x": "y"}}})
    assert refused.value.status == 403 and kube._kept.connection is again
    # nothing listens: NoAnswer, named, never a hang
    gone = KubeApi(f"https://127.0.0.1:{controlplane.free_port()}", firewall_token, None, timeout=2)
    with pytest.raises(NoAnswer) as unreachable:
        gone.call("GET", "/api/v1/nodes")
    assert "GET /api/v1/nodes" in str(unreachable.value)
