"""Shielded: each sandbox's verdict says whether its node's firewall is current and covers it.
The pure join (shield.py) and the one format both sides of the coverage Lease agree on. The
whole path on real nftables and the real control plane: tests/netns/test_shield.py."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime, timedelta
from ipaddress import ip_address
from pathlib import Path
from typing import Any

from deathwatch._api.resources import ConditionStatus
from deathwatch._operator.memory.coverage import Coverage
from deathwatch._operator.reporting.shield import (
    SELECTOR,
    NodeCoverage,
    ShieldReason,
    Sighting,
    assess,
    pending,
    read_lease,
    sight,
)
from deathwatch.firewall.config import FirewallConfig, parse_config
from deathwatch.firewall.coverage import LABELS, NodeState, lease_body, lease_name
from deathwatch.firewall.hosts import Hosts

ROOT = Path(__file__).resolve().parents[2]
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
        hosts_unknown="",
        pod_ranges_unknown="",
        measured="none",
        mode="enforce",
        table="deathwatch",
        selector=None,  # no sandboxSelector: the DeathWatches' pods
        guarded=None,  # not listed: the inbound rule waits for the sandboxes
        repairs=0,
        repaired_at="",
        contested=False,
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
        s = assess(node, ips, ports, coverage, seen if coverage else None, now, observed)
        return s.status, s.reason

    t, f, u = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN
    assert reason() == (t, ShieldReason.IN_FORCE)
    assert reason(now=105.0) == (t, ShieldReason.IN_FORCE)  # 1 + 5 s old: valid for 6
    assert reason(now=105.5) == (f, ShieldReason.AGENT_STALE)
    assert reason(coverage=None) == (f, ShieldReason.NO_AGENT)
    assert reason(claim(rule_in_force=False)) == (f, ShieldReason.RULE_MISSING)
    assert reason(claim(config_file="invalid")) == (f, ShieldReason.CONFIG_MISMATCH)
    assert reason(ips=("10.9.0.1",)) == (f, ShieldReason.OUTSIDE_POD_RANGES)
    assert reason(ports=(49983, 8000)) == (f, ShieldReason.CONFIG_MISMATCH)
    assert reason(node=None) == (u, ShieldReason.NOT_SCHEDULED)
    assert reason(observed=False) == (u, ShieldReason.NOT_OBSERVED)
    assert reason(claim(hosts_unknown="node-b")) == (f, ShieldReason.HOSTS_UNKNOWN)
    assert reason(claim(hosts_unknown="*")) == (f, ShieldReason.HOSTS_UNKNOWN)
    # with inbound off, the hosts of other nodes are their own output rules' business
    assert reason(claim(hosts_unknown="node-b", inbound=False)) == (t, ShieldReason.IN_FORCE)
    assert reason(claim(pod_ranges_unknown="node-b")) == (f, ShieldReason.POD_RANGES_UNKNOWN)
    assert reason(claim(pod_ranges_unknown="*")) == (f, ShieldReason.POD_RANGES_UNKNOWN)
    # the agent's own host connection to a sandbox got through: a claim disproved
    assert reason(claim(measured="bypassed")) == (f, ShieldReason.RULE_BYPASSED)
    for measured in ("verified", "inconclusive", "none", ""):  # "": an agent older than it
        assert reason(claim(measured=measured)) == (t, ShieldReason.IN_FORCE)
    verified = assess("node-a", ("10.244.1.2",), (49983,), claim(measured="verified"), seen,
                     101.0, True)  # fmt: skip
    assert verified.message.endswith("refused by it (measured)")
    # a node that audits (ADR 0027): not shielded, on purpose: neither uncovered nor exposed
    assert reason(claim(mode="audit")) == (f, ShieldReason.AUDIT)
    audited = assess("node-a", ("10.244.1.2",), (49983,), claim(mode="audit"), seen, 101.0, True)
    assert audited.audited and not audited.exposed
    assert "deathwatch_firewall_audited_connections_total" in audited.message
    assert reason(claim(mode="audit", rule_in_force=False)) == (f, ShieldReason.RULE_MISSING)


def test_a_pod_the_agent_does_not_guard_is_never_shielded() -> None:
    """Issue #51: a pod a DeathWatch selects but the agent's sandbox selector does not was
    left out of the inbound rule and still read Shielded=True. The agent publishes its
    selector and the addresses its inbound rule holds; the controller checks each pod."""
    seen = Sighting("t", seen_at=100.0, age_then=1.0)
    config = parse_config({**CONFIG, "sandboxSelector": "app=sandbox"})
    state = NodeState(config, config.digest(), True, 1, guarded=(ip_address("10.244.1.2"),),
                      table="staging-deathwatch", repairs=2,
                      repaired_at=datetime(2026, 11, 30, 11, 0, tzinfo=UTC))  # fmt: skip
    agent = read_lease(lease_body("node-a", "fw-a", "deathwatch-system", state, NOW))
    assert agent is not None and agent.guarded == frozenset({"10.244.1.2"})

    def judge(labels: dict[str, str], ip: str = "10.244.1.2", addressed: float = 99.0,
              coverage: NodeCoverage = agent) -> tuple[ConditionStatus, str, str]:  # fmt: skip
        s = assess("node-a", (ip,), (49983,), coverage, seen, 101.0, True, labels, addressed)
        return s.status, s.reason, s.message

    t, f = ConditionStatus.TRUE, ConditionStatus.FALSE
    status, reason, message = judge({"app": "sandbox"})
    assert (status, reason) == (t, ShieldReason.IN_FORCE)
    assert "table inet staging-deathwatch" in message and "repaired 2 time(s)" in message
    # agent-sandbox's pods: no app=sandbox label (docs/agent-sandbox.md)
    status, reason, message = judge({"agents.x-k8s.io/sandbox-name-hash": "abc"})
    assert (status, reason) == (f, ShieldReason.NOT_GUARDED)
    assert "'app=sandbox'" in message and "firewall.sandboxSelector" in message
    # selected, its address not yet in the rule: shielded until a whole claim has passed
    assert judge({"app": "sandbox"}, ip="10.244.1.9", addressed=99.0)[:2] == (
        t, ShieldReason.IN_FORCE)  # fmt: skip
    assert pending(agent, ("10.244.1.9",), 99.0) == 99.0 + agent.valid_for
    assert judge({"app": "sandbox"}, ip="10.244.1.9", addressed=90.0)[:2] == (
        f, ShieldReason.NOT_GUARDED)  # fmt: skip
    # inbound off: the output rule alone, which covers every pod address
    off = NodeCoverage(**{**{k: getattr(agent, k) for k in agent.__slots__}, "inbound": False})
    assert judge({}, coverage=off)[:2] == (t, ShieldReason.IN_FORCE)
    # a table replaced again and again under the agent
    contested = NodeCoverage(**{**{k: getattr(agent, k) for k in agent.__slots__},
                                "contested": True})  # fmt: skip
    assert judge({"app": "sandbox"}, coverage=contested)[:2] == (f, ShieldReason.CONTESTED)


def test_another_releases_agents_are_not_this_releases_claims() -> None:
    """Two releases in one namespace: each controller reads its own agents' Leases only."""
    config = parse_config(CONFIG)
    state = NodeState(config, config.digest(), True, 1)
    ours = lease_body("node-a", "fw-a", "ns", state, NOW, "deathwatch-firewall")
    theirs = lease_body("node-a", "fw-b", "ns", NodeState(config, "other", False, 1), NOW,
                        "staging-deathwatch-firewall")  # fmt: skip
    coverage = Coverage(5.0, prefix="deathwatch-firewall")
    coverage.read([theirs, ours], NOW)
    assert coverage.claims["node-a"].holder == "fw-a"


def test_an_audit_nodes_sandboxes_are_counted_apart_and_leave_it_covered() -> None:
    from deathwatch._engine.engine import Track
    from deathwatch._engine.verdict import State
    from deathwatch._operator.reporting.decisions import facts
    from deathwatch._operator.reporting.summary import Summaries

    seen = Sighting("t", seen_at=100.0, age_then=1.0)
    track = Track(uid="u", namespace="ns", name="p", policy="no-probe", state=State.ALIVE)
    summaries = Summaries()
    for node, mode in (("node-a", "audit"), ("node-b", "enforce")):
        shield = assess(node, ("10.244.1.2",), (49983,), claim(mode=mode), seen, 101.0, True)
        summaries.apply(("ns", "dw"), None, facts(track, shield, node))
    assert summaries.nodes == {("node-a", "Audit"): 1, ("node-b", "True"): 1}
    assert summaries[("ns", "dw")].uncovered_nodes() == []


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
    shield = assess("node-a", ("10.244.1.2",), (49983,), claim(hosts_unknown="node-b,node-c"),
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


def test_pod_ranges_learned_from_the_nodes_and_when_the_inbound_rule_waits_for_them() -> None:
    """podCIDRs is optional: the ranges the Node objects were given are added to it, and the
    lease says which nodes have none (the agent then holds the inbound rule back)."""
    bare = parse_config({"agentPorts": [49983]})
    learned = (ipaddress.ip_network("10.42.0.0/24"), ipaddress.ip_network("10.42.1.0/24"))

    def read(config: FirewallConfig, hosts: Hosts) -> NodeCoverage:
        body = lease_body("node-a", "fw-a", "deathwatch-system",
                          NodeState(config, config.digest(), True, 2, hosts), NOW)  # fmt: skip
        coverage = read_lease(body)
        assert coverage is not None
        return coverage

    every = read(bare, Hosts((), (), learned, ()))
    assert every.pod_cidrs == (ipaddress.ip_network("10.42.0.0/23"),)  # collapsed
    assert every.pod_ranges_unknown == "" and every.config == bare.digest()
    some = read(bare, Hosts((), (), learned, ("node-c",)))
    assert some.pod_ranges_unknown == "node-c"
    assert read(bare, Hosts((), None, (), None)).pod_ranges_unknown == "*"  # not listed
    # configured ranges are the operator's word: complete, with the learned ones added
    given = parse_config({"agentPorts": [49983], "podCIDRs": ["10.244.0.0/16"]})
    both = read(given, Hosts((), (), learned, ("node-c",)))
    assert both.pod_ranges_unknown == ""
    assert set(both.pod_cidrs) == {ipaddress.ip_network("10.244.0.0/16"),
                                   ipaddress.ip_network("10.42.0.0/23")}  # fmt: skip
    shield = assess("node-a", ("10.42.0.7",), (49983,), some, Sighting("t", 100.0, 1.0), 101.0,
                   True)  # fmt: skip
    assert shield.reason == ShieldReason.POD_RANGES_UNKNOWN
    assert "nodes without spec.podCIDRs: node-c" in shield.message
    assert "set firewall.podCIDRs" in shield.message
    outside = assess("node-a", ("192.168.3.4",), (49983,), every, Sighting("t", 100.0, 1.0),
                    101.0, True)  # fmt: skip
    assert outside.reason == ShieldReason.OUTSIDE_POD_RANGES
    assert "192.168.3.4 is in no pod range the firewall on node-a knows (10.42.0.0/23)" in (
        outside.message
    )


def test_a_node_no_lease_was_read_for_since_its_first_sandbox_waits_for_the_next_read() -> None:
    """The demo's first screen: its sandboxes were judged before the controller read the
    agent's first Lease, and each got a false SandboxUnshielded. A node is judged NoAgent only
    once a read after its first sandbox found no Lease for it."""
    now = [100.0]
    coverage = Coverage(interval=5.0, started=100.0, clock=lambda: now[0])
    config = parse_config(CONFIG)
    lease = lease_body("node-a", "fw-a", "deathwatch-system",
                       NodeState(config, config.digest(), True, 1), NOW)  # fmt: skip
    coverage.read([], NOW)  # the agent has not published yet
    assert coverage.changed_nodes() is None  # readable now: everything
    now[0] = 101.0
    # nothing to say yet (a restored shield stands, a new sandbox has none for now)
    assert coverage.shield_of("node-a", ("10.244.1.2",), frozenset({49983})) is None
    now[0] = 105.0
    coverage.read([lease], NOW + timedelta(seconds=5))  # its first Lease, read
    assert "node-a" in (coverage.changed_nodes() or set())  # judged again
    shield = coverage.shield_of("node-a", ("10.244.1.2",), frozenset({49983}))
    assert shield is not None and shield.reason == ShieldReason.IN_FORCE
    # a node with truly no agent: NoAgent after the read that follows its first sandbox
    now[0] = 106.0
    assert coverage.shield_of("node-b", ("10.244.2.2",), frozenset({49983})) is None
    now[0] = 110.0
    coverage.read([lease], NOW + timedelta(seconds=10))
    assert "node-b" in (coverage.changed_nodes() or set())
    alone = coverage.shield_of("node-b", ("10.244.2.2",), frozenset({49983}))
    assert alone is not None and alone.reason == ShieldReason.NO_AGENT and alone.exposed
    assert coverage.changed_nodes() == set()  # settled: not again
