"""Shielded: each sandbox's verdict says whether its node's firewall is current and covers it.

The pure join (shield.py) and the one format both sides of the coverage Lease agree on, then
the whole path on the real control plane: two firewall agents on real nftables (one network
namespace per node), publishing their Leases under the shipped RBAC, and the controller
turning one node's sandboxes Shielded=False within two resyncs of that node's agent stopping.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from deathwatch._operator.resources import ConditionStatus
from deathwatch._operator.shield import (
    SELECTOR,
    NodeCoverage,
    ShieldReason,
    Sighting,
    judge,
    read_lease,
    sight,
)
from deathwatch.firewall.config import parse_config
from deathwatch.firewall.coverage import LABELS, NodeState, lease_body, lease_name
from deathwatch.firewall.hosts import Hosts
from hack.localcluster import controlplane
from hack.localcluster.netnode import netns_available
from tests.controller_env import Env, ready_status
from tests.kube import wait_for

ROOT = Path(__file__).resolve().parent.parent
CONFIG = {"podCIDRs": ["10.244.0.0/16"], "agentPorts": [49983], "resyncSeconds": 4}
NOW = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)


def claim(**changes: Any) -> NodeCoverage:
    config = parse_config(CONFIG)
    body = lease_body("node-a", "fw-a", "deathwatch-system",
                      NodeState(config, config.digest(), True, 2), NOW)  # fmt: skip
    read = read_lease(body)
    assert read is not None
    return NodeCoverage(**{**{f: getattr(read, f) for f in read.__slots__}, **changes})


def test_the_agents_lease_reads_back_as_the_controller_expects() -> None:
    config = parse_config({**CONFIG, "podCIDRs": ["10.244.0.0/16", "fd00:10:244::/56"]})
    body = lease_body("node-a", "fw-a", "deathwatch-system",
                      NodeState(config, "invalid", False, None), NOW)  # fmt: skip
    assert body["metadata"]["name"] == lease_name("node-a") == "deathwatch-firewall.node-a"
    key, value = SELECTOR.split("=")
    assert LABELS[key] == value  # the controller's list finds what the agents write
    read = read_lease(body)
    assert read == NodeCoverage(
        node="node-a",
        holder="fw-a",
        renew_time="2026-11-30T12:00:00.123456Z",
        renewed_at=NOW,
        valid_for=6.0,  # 1.5 resyncs
        config=config.digest(),
        config_file="invalid",
        rule_in_force=False,
        pod_cidrs=config.pod_cidrs,
        agent_ports=frozenset({49983}),
        inbound=True,
    )
    assert read_lease({"metadata": {"name": "someone-elses-lease"}}) is None
    assert len(lease_name("n" * 300)) <= 253


def test_judge_names_why_a_sandbox_is_not_shielded() -> None:
    good, seen = claim(), Sighting("t", seen_at=100.0, age_then=1.0)

    def reason(
        coverage: NodeCoverage | None = good,
        now: float = 101.0,
        ips: tuple[str, ...] = ("10.244.1.2",),
        ports: tuple[int, ...] = (49983,),
        node: str | None = "node-a",
        observed: bool = True,
    ) -> tuple[ConditionStatus, str]:
        s = judge(node, ips, ports, coverage, seen if coverage else None, now, observed)
        return s.status, s.reason

    t, f, u = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN
    assert reason() == (t, ShieldReason.IN_FORCE)
    assert reason(now=105.0) == (t, ShieldReason.IN_FORCE)  # 1 + 5 s old: valid for 6
    assert reason(now=105.5) == (f, ShieldReason.AGENT_STALE)
    assert reason(coverage=None) == (f, ShieldReason.NO_AGENT)
    assert reason(claim(rule_in_force=False)) == (f, ShieldReason.RULE_MISSING)
    assert reason(claim(config_file="invalid")) == (f, ShieldReason.CONFIG_MISMATCH)
    assert reason(ips=("10.9.0.1",)) == (f, ShieldReason.CONFIG_MISMATCH)
    assert reason(ports=(49983, 8000)) == (f, ShieldReason.CONFIG_MISMATCH)
    assert reason(node=None) == (u, ShieldReason.NOT_SCHEDULED)
    assert reason(observed=False) == (u, ShieldReason.NOT_OBSERVED)
    assert reason(claim(hosts_unknown="node-b")) == (f, ShieldReason.HOSTS_UNKNOWN)
    assert reason(claim(hosts_unknown="*")) == (f, ShieldReason.HOSTS_UNKNOWN)
    # with inbound off, the hosts of other nodes are their own output rules' business
    assert reason(claim(hosts_unknown="node-b", inbound=False)) == (t, ShieldReason.IN_FORCE)


def test_hosts_the_agent_cannot_tell_from_pods_are_said_on_its_lease() -> None:
    config = parse_config(CONFIG)

    def unknown(hosts: Hosts, inbound: bool = True) -> str:
        c = parse_config({**CONFIG, "inbound": inbound})
        body = lease_body("node-a", "fw-a", "deathwatch-system",
                          NodeState(c, c.digest(), True, 2, hosts), NOW)  # fmt: skip
        read = read_lease(body)
        assert read is not None
        return read.hosts_unknown

    assert unknown(Hosts((), ())) == ""  # every node's hosts known
    assert unknown(Hosts((), ("node-b", "node-c"))) == "node-b,node-c"
    assert unknown(Hosts((), None)) == "*"  # the nodes were never listed
    assert unknown(Hosts((), tuple(f"n{i:02}" for i in range(25)))).endswith(",n19,+5")
    assert unknown(Hosts((), None), inbound=False) == ""
    shield = judge("node-a", ("10.244.1.2",), (49983,), claim(hosts_unknown="node-b,node-c"),
                   Sighting("t", 100.0, 1.0), 101.0, True)  # fmt: skip
    assert "nodes node-b, node-c" in shield.message
    assert config.inbound


def test_staleness_is_timed_on_our_clock_not_the_agents() -> None:
    c = claim()
    # an agent clock 1 h ahead or behind: the age at first sight is capped, never trusted
    ahead = sight(None, claim(renewed_at=NOW + timedelta(hours=1)), NOW, 50.0, cap=6.0)
    behind = sight(None, claim(renewed_at=NOW - timedelta(hours=1)), NOW, 50.0, cap=6.0)
    assert (ahead.age_then, behind.age_then) == (0.0, 6.0)
    # the same renewal seen again keeps its first sighting; a new one starts over
    first = sight(None, c, NOW, 50.0, cap=6.0)
    assert sight(first, c, NOW + timedelta(seconds=3), 53.0, cap=6.0) is first
    renewed = sight(first, claim(renew_time="later", renewed_at=NOW + timedelta(seconds=4)),
                    NOW + timedelta(seconds=4), 54.0, cap=6.0)  # fmt: skip
    assert (renewed.seen_at, renewed.age_then) == (54.0, 0.0)


# --- on the real control plane, with real agents --------------------------------------------


class FirewallNode:
    """A node's network namespace and its firewall agent, running in this machine's network
    namespace (so it reaches the API on 127.0.0.1) with nft acting in the node's."""

    def __init__(self, name: str, tmp: Path, config: Path, api: str, token: Path, ca: Path) -> None:
        self.name, self.netns = name, f"dw-{name}-{uuid.uuid4().hex[:6]}"
        self.log = tmp / f"agent-{name}.log"
        self.nft = tmp / f"nft-{name}"
        self.nft.write_text(f'#!/bin/sh\nexec ip netns exec {self.netns} nft "$@"\n')
        self.nft.chmod(0o755)
        self.args = [
            sys.executable, "-m", "deathwatch.firewall.cli", "agent", "--config", str(config),
            "--node-name", name, "--identity", f"fw-{name}", "--namespace", "deathwatch-system",
            "--kube-api", api, "--kube-token-file", str(token), "--kube-ca-file", str(ca),
            "--nft", str(self.nft), "--metrics-port", "0",
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        subprocess.run(["ip", "netns", "add", self.netns], check=True, timeout=30)

    def start(self) -> None:
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                self.args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )  # fmt: skip

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(15)

    def sandbox_set(self) -> str:
        return subprocess.run(
            ["ip", "netns", "exec", self.netns, "nft", "list", "set", "inet", "deathwatch",
             "sandbox_v4"], capture_output=True, text=True, timeout=30, check=False,
        ).stdout  # fmt: skip

    def destroy(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        subprocess.run(["ip", "netns", "del", self.netns], check=False, timeout=30)


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
    assert env.controller.metric("deathwatch_sandboxes_shielded", status="False") == 2

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
