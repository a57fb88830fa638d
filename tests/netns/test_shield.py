"""Shielded on real parts: two firewall agents on real nftables (one network namespace per
node), publishing their coverage Leases under the shipped RBAC to the real control plane,
and the controller turning one node's sandboxes Shielded=False within two resyncs of that
node's agent stopping. The pure join: tests/unit/test_shield.py."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from deathwatch.firewall.coverage import lease_name
from hack.localcluster import controlplane
from hack.localcluster.netnode import netns_available
from tests.controller_env import Env, ready_status
from tests.firewall_node import FirewallNode
from tests.kube import wait_for

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {"podCIDRs": ["10.244.0.0/16"], "agentPorts": [49983], "resyncSeconds": 4}


@pytest.fixture
def agents(
    env: Env, control_plane: controlplane.ControlPlane, tmp_path: Path
) -> Iterator[dict[str, FirewallNode]]:
    reason = netns_available()
    if reason:
        pytest.skip(reason)
    control_plane.kubectl_run("apply", "-f", str(ROOT / "manifests/base/rbac/firewall.yaml"))
    token = client.CoreV1Api(env.api).create_namespaced_service_account_token(
        "deathwatch-firewall", "deathwatch-system", {"spec": {"expirationSeconds": 3600}},
        _request_timeout=30,
    ).status.token  # fmt: skip
    (tmp_path / "fw.token").write_text(token)
    config = tmp_path / "fw.json"
    config.write_text(json.dumps({**CONFIG, "sandboxSelector": f"app=sandbox,run={env.ns}"}))
    nodes = {
        n: FirewallNode(
            n,
            tmp_path,
            config,
            control_plane.server,
            tmp_path / "fw.token",
            control_plane.certs / "ca.crt",
        )
        for n in ("node-1", "node-2")
    }
    try:
        yield nodes
    finally:
        for n in nodes.values():
            n.destroy()
            print(f"--- agent {n.name}:\n{n.log.read_text()[-1500:]}")
        coordination = client.CoordinationV1Api(env.api)
        for name in nodes:
            with contextlib.suppress(client.ApiException):
                coordination.delete_namespaced_lease(
                    lease_name(name), "deathwatch-system", _request_timeout=10
                )


def shielded(env: Env, pod: str) -> dict[str, Any] | None:
    sv = env.sv(pod) or {}
    return next(
        (c for c in (sv.get("status") or {}).get("conditions", []) if c["type"] == "Shielded"),
        None,
    )


@pytest.mark.apiserver
@pytest.mark.netns
def test_a_stopped_agent_unshields_its_nodes_sandboxes_within_two_resyncs(
    env: Env, agents: dict[str, FirewallNode]
) -> None:
    for a in agents.values():
        a.start()
    flags = ["--firewall-daemonset", "deathwatch-system/deathwatch-firewall",
             "--coverage-interval", "0.5"]  # fmt: skip
    env.start_controller(flags)
    env.deathwatch()
    pods = {}
    for name, node in (("on-1", "node-1"), ("on-2", "node-2"), ("on-3", "node-3")):
        s = env.script(name, node=node, labels={"app": "sandbox", "run": env.ns})
        env.create(s)
        env.kubelet.status(env.ns, s.name, ready_status(s))
        pods[name] = s
    for name in pods:
        env.wait_state(name, "Alive")

    def status_of(pod: str) -> tuple[str, str] | None:
        c = shielded(env, pod)
        return (c["status"], c["reason"]) if c else None

    wait_for(lambda: status_of("on-1") == ("True", "RuleInForce"), what="on-1 shielded")
    wait_for(lambda: status_of("on-2") == ("True", "RuleInForce"), what="on-2 shielded")
    wait_for(lambda: status_of("on-3") == ("False", "NoAgent"), what="on-3 not shielded")
    # the agents guard their node's sandboxes inbound, learned from the API
    wait_for(lambda: "10.244.0.10" in agents["node-1"].sandbox_set(), what="node-1's sandbox set")
    on2_since = shielded(env, "on-2")["lastTransitionTime"]  # type: ignore[index]

    stopped = time.monotonic()
    agents["node-1"].stop()  # SIGTERM: the table stays, the Lease is no longer renewed
    wait_for(lambda: status_of("on-1") == ("False", "AgentStale"), timeout=20, what="on-1 stale")
    took = time.monotonic() - stopped
    resync = float(CONFIG["resyncSeconds"])  # type: ignore[arg-type]
    print(f"Shielded=False {took:.2f}s after the agent stopped (resync {resync:.0f}s)")
    assert took <= 2 * resync, f"Shielded=False {took:.1f}s after the agent stopped"
    assert status_of("on-2") == ("True", "RuleInForce")
    assert shielded(env, "on-2")["lastTransitionTime"] == on2_since  # type: ignore[index]
    dw = wait_for(lambda: (d := env.dw()).get("status", {}).get("uncoveredNodes") == [
        "node-1", "node-3"] and d, what="DeathWatch uncoveredNodes")  # fmt: skip
    table = env.cp.kubectl_run("get", "dw", "-n", env.ns).stdout
    assert '["node-1","node-3"]' in table.replace(" ", ""), table
    # one Event per spell, for each unshielded sandbox
    for pod in ("on-1", "on-3"):
        events = wait_for(lambda p=pod: env.events(p, "SandboxUnshielded"), what=f"{pod} Event")  # type: ignore[misc]
        assert len(events) == 1, events
    assert env.events("on-2", "SandboxUnshielded") == []
    assert env.controller is not None
    controller = env.controller  # the page is rendered at most once a second (ADR 0020)
    wait_for(lambda: controller.metric("deathwatch_sandboxes_shielded", status="False") == 2,
             what="two sandboxes counted unshielded")  # fmt: skip

    # the agent back: shielded again, the node no longer listed
    agents["node-1"].start()
    wait_for(lambda: status_of("on-1") == ("True", "RuleInForce"), what="on-1 shielded again")
    wait_for(lambda: env.dw().get("status", {}).get("uncoveredNodes") == ["node-3"],
             what="only node-3 uncovered")  # fmt: skip
    assert dw is not None

    # the controller killed and started again: the spell goes on, not a new one
    since = {p: shielded(env, p)["lastTransitionTime"] for p in pods}  # type: ignore[index]
    env.controller.stop(signal.SIGKILL)
    restarted = env.start_controller(flags)
    wait_for(lambda: restarted.metric("deathwatch_sandboxes_shielded", status="True") == 2
             and restarted.metric("deathwatch_sandboxes_shielded", status="False") == 1,
             what="the restarted controller judged every shield")  # fmt: skip
    assert {p: shielded(env, p)["lastTransitionTime"] for p in pods} == since  # type: ignore[index]
    assert [len(env.events(p, "SandboxUnshielded")) for p in ("on-1", "on-2", "on-3")] == [1, 0, 1]
