"""The firewall's pure parts: config validation, rendering, reading the live table back,
and the agent's decisions over a fake nft (the real one: tests/netns/test_firewall.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from ipaddress import ip_address
from pathlib import Path
from typing import Any
from unittest import mock

import prometheus_client
import pytest

from deathwatch._kube.configfile import ConfigError
from deathwatch.firewall.agent import Agent, ClusterLink
from deathwatch.firewall.config import load_config, parse_config
from deathwatch.firewall.coverage import lease_name
from deathwatch.firewall.deathwatches import DeathWatches, read, selections
from deathwatch.firewall.kubeapi import ApiError
from deathwatch.firewall.nft import NftError
from deathwatch.firewall.ruleset import COMMENT, INBOUND_COMMENT, SANDBOX_SETS, desired
from deathwatch.firewall.sandboxes import PodWatch
from deathwatch.firewall.table import (
    Chain,
    Match,
    Rule,
    Set,
    Table,
    differences,
    from_json,
    load_state,
    script,
)
from hack.make_recordings import NFT_CONFIG, NFT_HOSTS, NFT_SANDBOXES
from tests.fakeapi import FakeAgentApi, FakeApi
from tests.kube import wait_for

DATA = Path(__file__).parents[1] / "data" / "nft"
GOOD = {"podCIDRs": ["10.244.0.0/16", "fd00:10:244::/56"], "agentPorts": [49983]}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"podCIDRs": "10.0.0.0/8", "agentPorts": [1]}, "podCIDRs: expected a list of CIDRs"),
        ({"podCIDRs": [], "agentPorts": []}, "agentPorts: expected a non-empty list"),
        (
            {"podCIDRs": ["10.244.0.1/16"], "agentPorts": [1]},
            "podCIDRs[0]: invalid CIDR '10.244.0.1/16'",
        ),
        ({"podCIDRs": ["nope"], "agentPorts": [1]}, "podCIDRs[0]: invalid CIDR 'nope'"),
        ({"podCIDRs": [10], "agentPorts": [1]}, "podCIDRs[0]: expected a CIDR string, got 10"),
        (
            {"podCIDRs": ["10.0.0.0/8"], "agentPorts": [0]},
            "agentPorts[0]: expected a TCP port 1-65535, got 0",
        ),
        (
            {"podCIDRs": ["10.0.0.0/8"], "agentPorts": ["80"]},
            "agentPorts[0]: expected a TCP port 1-65535, got '80'",
        ),
        ({"podCIDRs": ["10.0.0.0/8"], "agentPorts": [80, 80]}, "agentPorts: duplicate port"),
        (
            {"podCIDRs": ["10.0.0.0/8"], "agentPorts": [80], "resyncSeconds": 0},
            "resyncSeconds: expected seconds in (0, 3600], got 0",
        ),
        (
            {"podCIDRs": ["10.0.0.0/8"], "agentPorts": [80], "agentPort": 1},
            "unknown field 'agentPort'",
        ),
        (
            {"podCIDRs": ["10.0.0.0/8"], "agentPorts": [80], "inbound": "yes"},
            "inbound: expected true or false, got 'yes'",
        ),
        (
            {"podCIDRs": ["10.0.0.0/8"], "agentPorts": [80], "allowedSources": ["gateway"]},
            "allowedSources[0]: invalid CIDR 'gateway'",
        ),
        (
            {"podCIDRs": ["10.0.0.0/8"], "agentPorts": [80], "sandboxSelector": "app=a=b"},
            "sandboxSelector: expected a label selector string (e.g. app=sandbox), got 'app=a=b'",
        ),
        (["podCIDRs"], "expected a mapping"),
    ],
)
def test_bad_config_names_the_field_and_value(data: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "fw.yaml")
    assert message in str(info.value)
    assert str(info.value).startswith("fw.yaml: ")


def test_yaml_and_json_files(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "podCIDRs: [10.244.0.0/16]\nagentPorts: [49983, 8000]\nresyncSeconds: 2\n"
    )
    (tmp_path / "b.json").write_text(json.dumps(GOOD))
    a = load_config(tmp_path / "a.yaml")
    assert (a.agent_ports, a.resync_seconds, [str(n) for n in a.pod_cidrs]) == (
        (8000, 49983),
        2.0,
        ["10.244.0.0/16"],
    )
    assert [str(n) for n in load_config(tmp_path / "b.json").v6] == ["fd00:10:244::/56"]
    (tmp_path / "c.yaml").write_text("podCIDRs: [10.244.0.0/16\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "c.yaml")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


GOLDEN = """\
table inet deathwatch
delete table inet deathwatch
table inet deathwatch {
\tset pod_v4 { type ipv4_addr; flags interval; elements = { 10.244.0.0/16 } }
\tset podsrc_v4 { type ipv4_addr; flags interval; elements = { 10.244.0.0/16 } }
\tset sandbox_v4 { type ipv4_addr; }
\tset pod_v6 { type ipv6_addr; flags interval; elements = { fd00:10:244::/56 } }
\tset podsrc_v6 { type ipv6_addr; flags interval; elements = { fd00:10:244::/56 } }
\tset sandbox_v6 { type ipv6_addr; }
\tchain output {
\t\ttype filter hook output priority -90; policy accept;
\t\ttcp dport { 49983 } ip daddr @pod_v4 fib saddr type local counter reject with tcp reset comment "deathwatch: refuse host and hostNetwork connections to sandbox agent ports"
\t\ttcp dport { 49983 } ip6 daddr @pod_v6 fib saddr type local counter reject with tcp reset comment "deathwatch: refuse host and hostNetwork connections to sandbox agent ports"
\t}
\tchain inbound {
\t\ttype filter hook forward priority -90; policy accept;
\t\ttcp dport { 49983 } ip daddr @sandbox_v4 ip saddr != @podsrc_v4 counter reject with tcp reset comment "deathwatch: refuse connections from outside the pod network to sandbox agents"
\t\ttcp dport { 49983 } ip6 daddr @sandbox_v6 ip6 saddr != @podsrc_v6 counter reject with tcp reset comment "deathwatch: refuse connections from outside the pod network to sandbox agents"
\t}
}
"""


def test_the_whole_script_for_a_config_is_pinned() -> None:
    """Declare, delete, define in one transaction; every line of it, as nft will read it."""
    assert script(desired(parse_config(GOOD))) == GOLDEN


def test_v4_only_config_without_inbound_has_one_rule_and_cidrs_are_collapsed() -> None:
    config = parse_config(
        {
            "podCIDRs": ["10.244.0.0/17", "10.244.128.0/17"],
            "agentPorts": [8000, 1],
            "inbound": False,
        }
    )
    rule = Rule(
        (
            Match("tcp dport", "{ 1, 8000 }"),
            Match("ip daddr", "@pod_v4"),
            Match("fib saddr type", "local"),
        ),
        "reject with tcp reset",
        comment=COMMENT,
    )
    assert desired(config, [ip_address("10.244.1.2")]) == Table(
        (Set("pod_v4", "ipv4_addr", ("interval",), ("10.244.0.0/16",)),),
        (Chain("output", "filter", "output", -90, "accept", (rule,)),),
    )


def test_the_inbound_rule_guards_this_nodes_sandboxes_but_for_pods_and_allowed_sources() -> None:
    config = parse_config({**GOOD, "allowedSources": ["10.0.5.0/24", "10.0.5.7/32"]})
    table = desired(config, [ip_address("10.244.1.2"), ip_address("fd00:10:244:1::2")])
    sets = {s.name: s.elements for s in table.sets}
    assert sets["sandbox_v4"] == ("10.244.1.2",)  # a hash set of addresses
    assert sets["sandbox_v6"] == ("fd00:10:244:1::2",)
    assert sets["allowed_v4"] == ("10.0.5.0/24",)  # collapsed
    assert "allowed_v6" not in sets  # none allowed: no set, no match
    inbound = next(c for c in table.chains if c.name == "inbound")
    assert (inbound.hook, inbound.priority) == ("forward", -90)
    assert inbound.rules[0] == Rule(
        (  # the port first: what is not to an agent port leaves at this one compare
            Match("tcp dport", "{ 49983 }"),
            Match("ip daddr", "@sandbox_v4"),
            Match("ip saddr", "@podsrc_v4", "!="),
            Match("ip saddr", "@allowed_v4", "!="),
        ),
        "reject with tcp reset",
        comment=INBOUND_COMMENT,
    )
    assert sets["podsrc_v4"] == ("10.244.0.0/16",)  # no host in the pod range known: all pods
    # the readiness probe has no sandbox list: it compares those sets but for their elements
    bare = desired(config)
    assert differences(bare, table)
    assert differences(bare, table, SANDBOX_SETS) == []
    assert differences(bare, desired(parse_config(GOOD)), SANDBOX_SETS)  # allowed differs


def test_hosts_in_the_pod_range_are_taken_out_of_the_pod_sources() -> None:
    """An overlay's tunnel addresses (flannel .0, a bridge gateway .1, Calico's, Cilium's)
    are hosts: the inbound rule refuses them like any non-pod source. One address out of a
    range costs one more interval, not a prefix per bit."""
    config = parse_config(GOOD)
    hosts = [ip_address(a) for a in ("10.244.2.0", "10.244.2.1", "10.244.0.0", "fd00:10:244:2::")]
    sets = {s.name: s.elements for s in desired(config, [ip_address("10.244.1.2")], hosts).sets}
    assert sets["podsrc_v4"] == ("10.244.0.1-10.244.1.255", "10.244.2.2-10.244.255.255")
    assert sets["podsrc_v6"] == (
        "fd00:10:244:2::1-fd00:10:244:ff:ffff:ffff:ffff:ffff",
        "fd00:10:244::/63",
    )
    assert sets["pod_v4"] == ("10.244.0.0/16",)  # the output rule's destinations: unchanged
    # a host address outside the pod ranges is nothing to take out (it is refused already)
    outside = desired(config, [], [ip_address("192.168.1.1")])
    assert {s.name: s.elements for s in outside.sets}["podsrc_v4"] == ("10.244.0.0/16",)


def test_a_real_nft_listing_reduces_to_exactly_the_desired_table() -> None:
    # recorded from nft 1.0.6 (Debian bookworm) after `deathwatch-firewall apply` of this
    # config; test_firewall_netns proves the same against the live kernel
    listing = json.loads((DATA / "nft-1.0.6-list-table.json").read_text())
    config = parse_config(NFT_CONFIG)
    have = from_json(listing)
    assert have == desired(
        config, [ip_address(a) for a in NFT_SANDBOXES], [ip_address(a) for a in NFT_HOSTS]
    )
    assert have is not None and have.rejected_packets == 5  # 3 + 2 counted in the recording


def test_differences_name_what_drifted() -> None:
    want = desired(parse_config(GOOD))
    assert differences(want, None) == ["table inet deathwatch is missing"]
    assert differences(want, want) == []
    chain, inbound = want.chains
    flushed = Table(want.sets, (Chain(chain.name, chain.type, chain.hook, chain.priority), inbound))
    assert differences(want, flushed) == [f"chain output: want {chain}, have {flushed.chains[0]}"]
    emptied = Table((Set("pod_v4", "ipv4_addr", ("interval",)), *want.sets[1:]), want.chains)
    assert [d.split(":")[0] for d in differences(want, emptied)] == ["set pod_v4"]


def test_an_inserted_rule_of_someone_else_is_a_difference_not_an_error() -> None:
    listing = {
        "nftables": [
            {"chain": {"name": "output", "type": "filter", "hook": "output", "prio": -90, "policy": "accept"}},
            {"rule": {"chain": "output", "expr": [
                {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 49983}},
                {"accept": None},
            ]}},
            {"rule": {"chain": "output", "expr": [{"queue": {"num": 1}}]}},
        ]
    }  # fmt: skip
    have = from_json(listing)
    assert have is not None
    rules = have.chains[0].rules
    assert rules[0] == Rule((Match("tcp dport", "{ 49983 }"),), "accept", counter=False)
    assert "queue" in rules[1].verdict
    assert differences(desired(parse_config(GOOD)), have)


# --- the agent's decisions, over a fake nft -------------------------------------------------


class FakeNft:
    """Stores the table model, as the kernel would hold it; `dump` shows it as nft script."""

    table_name = "deathwatch"

    def __init__(self) -> None:
        self.table: Table | None = None
        self.applied: list[Table] = []
        self.fail = False

    def apply(self, table: Table) -> None:
        if self.fail:
            raise NftError("nft -f failed: simulated")
        self.applied.append(table)
        self.table = table

    def list_table(self) -> Table | None:
        return self.table

    def delete_table(self) -> None:
        self.table = None

    def dump(self) -> str:
        return script(self.table) if self.table else ""


def test_agent_applies_repairs_and_keeps_the_rule_on_a_bad_config(tmp_path: Path) -> None:
    path = tmp_path / "fw.yaml"
    path.write_text(json.dumps(GOOD))
    nft = FakeNft()
    agent = Agent(path, nft)
    agent.step()
    assert nft.table == desired(parse_config(GOOD))
    assert nft.dump() == GOLDEN
    assert agent.metrics.syncs.labels("applied")._value.get() == 1
    agent.step()
    assert len(nft.applied) == 1  # nothing drifted: nothing written
    nft.table = None  # someone deleted it
    agent.step()
    assert len(nft.applied) == 2
    assert agent.metrics.syncs.labels("repaired")._value.get() == 1
    path.write_text("podCIDRs: [bad\n")  # a broken new config
    agent.step()
    assert agent.config == parse_config(GOOD)
    assert len(nft.applied) == 2
    assert agent.metrics.sync_failures.labels("config")._value.get() == 1
    assert agent.metrics.rule_present._value.get() == 1
    nft.fail = True
    assert nft.table is not None
    chain, inbound = nft.table.chains
    nft.table = Table(
        nft.table.sets, (Chain(chain.name, chain.type, chain.hook, chain.priority), inbound)
    )
    agent.step()  # flushed and cannot be repaired: never raises
    assert agent.metrics.sync_failures.labels("nft")._value.get() == 1
    assert agent.metrics.rule_present._value.get() == 0


@pytest.mark.parametrize("mode", ["enforce", "audit"])
def test_every_mode_renders_the_releases_own_table(mode: str) -> None:
    """A release's table is inet TABLE in either mode (the audit rules' own set names once
    took its place)."""
    config = parse_config({**GOOD, "mode": mode})
    table = desired(config, [ip_address("10.244.1.2")], table="staging")
    assert table.name == "staging"
    assert script(table).startswith("table inet staging\ndelete table inet staging\n")


def test_only_a_table_replaced_under_the_agent_is_a_repair_and_again_and_again_contested(
    tmp_path: Path,
) -> None:
    """Issue #51: its own changes (new sandboxes, a new config) are applied, never counted as
    repairs; the live table found otherwise than it last applied it is. Replaced three times
    within the window (another writer of the same table): contested, until left alone."""
    path = tmp_path / "fw.yaml"
    path.write_text(json.dumps(GOOD))
    nft = FakeNft()
    agent = Agent(path, nft, sandboxes=[ip_address("10.244.1.2")])
    agent.step()
    for i in range(3, 8):  # sandboxes come and go: the agent's own changes
        agent.sandboxes = (ip_address(f"10.244.1.{i}"),)
        agent.step()
    path.write_text(json.dumps({**GOOD, "agentPorts": [49983, 8000]}))
    agent.step()
    assert agent.repairs == 0 and not agent.contested
    assert agent.metrics.syncs.labels("repaired")._value.get() == 0
    assert agent.metrics.syncs.labels("applied")._value.get() == 7
    for _ in range(3):  # another writer's table, each time
        nft.table = desired(parse_config(GOOD), table="deathwatch")
        agent.step()
    assert agent.repairs == 3 and agent.contested
    assert agent.metrics.table_replaced.labels("changed")._value.get() == 3
    assert nft.table == agent._applied  # repaired each time all the same


def test_agent_counts_refusals_across_replacements(tmp_path: Path) -> None:
    path = tmp_path / "fw.yaml"
    path.write_text(json.dumps(GOOD))
    nft = FakeNft()
    agent = Agent(path, nft)
    agent.step()
    assert nft.table is not None
    counted = [dataclasses.replace(r, packets=4) for r in nft.table.chains[0].rules]
    nft.table = Table(
        nft.table.sets,
        (dataclasses.replace(nft.table.chains[0], rules=tuple(counted)), nft.table.chains[1]),
    )
    agent.step()
    assert agent.metrics.rejected._value.get() == 8  # counters are not drift
    assert len(nft.applied) == 1


def test_agent_with_no_valid_config_leaves_the_table_alone(tmp_path: Path) -> None:
    path = tmp_path / "fw.yaml"
    path.write_text("podCIDRs: [10.0.0.0/8]\n")  # no agentPorts
    previous = desired(parse_config(GOOD))  # a previous agent's rule, during a rollout
    nft = FakeNft()
    nft.table = previous
    agent = Agent(path, nft)
    agent.step()
    assert nft.applied == []
    assert nft.table is previous
    # the config's failure, not nft's: the alert names the reason (the Helm lane's bad roll)
    failures = agent.metrics.sync_failures
    assert failures.labels("config")._value.get() >= 1
    assert failures.labels("nft")._value.get() == 0


def test_cli_render_and_bad_config_exit_codes(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(json.dumps(GOOD))
    bad.write_text("podCIDRs: [10.0.0.0/8]\nagentPorts: [70000]\n")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "deathwatch.firewall.cli", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    rendered = cli("render", "--config", str(good))
    assert rendered.returncode == 0
    assert rendered.stdout == GOLDEN
    for action in ("render", "apply", "check"):
        result = cli(action, "--config", str(bad))
        assert result.returncode == 2, action
        assert "agentPorts[0]: expected a TCP port 1-65535, got 70000" in result.stderr
        assert "Traceback" not in result.stderr


def test_agent_started_on_a_bad_config_says_why_and_waits_for_a_good_one(tmp_path: Path) -> None:
    """It does not exit (a previous agent's rule stays in force meanwhile) and does not touch
    the table; its readiness check fails, which is how coverage shows the node uncovered."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("podCIDRs: [10.0.0.0/8]\nagentPorts: [70000]\n")
    log = tmp_path / "agent.log"
    with log.open("w") as out:
        agent = subprocess.Popen(
            [sys.executable, "-m", "deathwatch.firewall.cli", "agent", "--config", str(bad),
             "--metrics-port", "0"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for(lambda: "config rejected" in log.read_text(), timeout=20, what="the rejection")
        assert agent.poll() is None
        rejected = next(
            json.loads(line) for line in log.read_text().splitlines() if "config rejected" in line
        )
        assert "agentPorts[0]: expected a TCP port 1-65535, got 70000" in rejected["error"]
        assert rejected["in_force"] is False
    finally:
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(15) == 0


# --- the agent in a cluster: its node's sandboxes and its coverage Lease, over a fake API ---


def sandbox_pod(
    ip: str,
    phase: str = "Running",
    host_network: bool = False,
    node: str = "node-a",
    app: str = "sandbox",
) -> dict[str, Any]:
    return {
        "metadata": {"name": f"pod-{ip}-{node}", "labels": {"app": app}},
        "spec": {"hostNetwork": host_network, "nodeName": node},
        "status": {"phase": phase, "podIP": ip},
    }


def coverage_lease(api: FakeApi, node: str = "node-a", namespace: str = "deathwatch-system"
                   ) -> dict[str, Any]:  # fmt: skip
    lease = api.get("leases", namespace, lease_name(node))
    assert lease is not None
    return lease


def test_agent_guards_its_nodes_sandboxes_and_keeps_them_when_the_api_is_down(
    tmp_path: Path,
) -> None:
    path = tmp_path / "fw.yaml"
    path.write_text(json.dumps({**GOOD, "sandboxSelector": "app=sandbox"}))
    api, nft = FakeApi(), FakeNft()
    for pod in (sandbox_pod("10.244.1.2"), sandbox_pod("10.244.1.3", phase="Succeeded"),
                sandbox_pod("10.0.0.9", host_network=True), sandbox_pod("10.244.2.2", node="node-b"),
                sandbox_pod("10.244.1.5", app="other")):  # fmt: skip
        api.add("pods", "sandboxes", pod)
    agent = Agent(path, nft, link=ClusterLink(api.agent(), "node-a", "fw-a", "deathwatch-system"))
    agent.step()
    config = parse_config({**GOOD, "sandboxSelector": "app=sandbox"})
    # a finished pod's address may be reused at once; a hostNetwork pod is the node itself;
    # another node's sandboxes and this node's other pods are not asked for
    assert nft.table == desired(config, [ip_address("10.244.1.2")])
    assert ("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a&labelSelector=app%3Dsandbox") in api.requests  # fmt: skip
    lease = coverage_lease(api)
    notes = lease["metadata"]["annotations"]
    assert (notes["deathwatch.dev/rule"], notes["deathwatch.dev/sandboxes"]) == ("in-force", "1")
    assert notes["deathwatch.dev/config"] == notes["deathwatch.dev/config-file"]
    renewed = lease["spec"]["renewTime"]
    # the API goes away: the last known sandboxes stay guarded, the Lease is not renewed
    api.add("pods", "sandboxes", sandbox_pod("10.244.1.4"))
    api.down = True
    agent.step()
    assert nft.table == desired(config, [ip_address("10.244.1.2")])
    assert agent.metrics.sync_failures.labels("sandboxes")._value.get() == 1
    assert agent.metrics.sync_failures.labels("coverage")._value.get() == 1
    assert coverage_lease(api)["spec"]["renewTime"] == renewed
    # back: the new sandbox guarded, the Lease renewed
    api.down = False
    agent.step()
    assert nft.table == desired(config, [ip_address("10.244.1.2"), ip_address("10.244.1.4")])
    assert coverage_lease(api)["metadata"]["annotations"]["deathwatch.dev/sandboxes"] == "2"
    # a refused new config: the old rule stays, and the Lease says the two differ
    path.write_text("podCIDRs: [bad\n")
    agent.step()
    notes = coverage_lease(api)["metadata"]["annotations"]
    assert notes["deathwatch.dev/config-file"] == "invalid"
    assert notes["deathwatch.dev/config"] == config.digest()


def test_a_failed_sync_judges_the_rule_in_force_against_the_table_with_its_hosts(
    tmp_path: Path,
) -> None:
    """After a failed sync the agent checks whether its rule is still in force, against the
    table it enforces: host addresses included (an overlay CNI's tunnel addresses). Checked
    against a table without them, a rule in force read as missing: a false SandboxUnshielded
    on every node of such a cluster at the first nft hiccup."""
    path = tmp_path / "fw.yaml"
    path.write_text(json.dumps({**GOOD, "sandboxSelector": "app=sandbox"}))
    host = ip_address("10.244.7.64")

    class Hiccup(FakeNft):
        hiccups = 0

        def list_table(self) -> Table | None:
            if self.hiccups:
                self.hiccups -= 1
                raise NftError("nft list table inet deathwatch: interrupted")
            return super().list_table()

    api, nft = FakeApi(), Hiccup()
    api.add("pods", "sandboxes", sandbox_pod("10.244.1.2"))
    agent = Agent(path, nft, link=ClusterLink(api.agent(), "node-a", "fw-a", "deathwatch-system"),
                  hosts=[host])  # fmt: skip
    agent.step()
    config = parse_config({**GOOD, "sandboxSelector": "app=sandbox"})
    assert nft.table == desired(config, [ip_address("10.244.1.2")], [host])
    nft.hiccups = 1
    agent.step()
    assert agent.metrics.sync_failures.labels("nft")._value.get() == 1
    assert agent.metrics.rule_present._value.get() == 1
    assert coverage_lease(api)["metadata"]["annotations"]["deathwatch.dev/rule"] == "in-force"
    # and a table that really differs is reported missing
    nft.hiccups, nft.table = 1, desired(config, [ip_address("10.244.1.2")])
    nft.fail = True
    agent.step()
    assert agent.metrics.rule_present._value.get() == 0
    assert coverage_lease(api)["metadata"]["annotations"]["deathwatch.dev/rule"] != "in-force"


def test_the_pod_watch_survives_any_failure_counted_and_wakes_the_agent() -> None:
    stop = threading.Event()
    woken: list[int] = []
    failed: list[int] = []
    modified = {"type": "MODIFIED", "object": {"metadata": {"resourceVersion": "11"}}}

    class Flaky(FakeAgentApi):
        @contextlib.contextmanager
        def lines(
            self, path: str, params: Mapping[str, str | int], seconds: float
        ) -> Iterator[Iterator[bytes]]:
            watched = sum(method == "WATCH" for method, _ in self.api.requests)
            if watched == 0:
                self.api.requests.append(("WATCH", path))
                raise ValueError("a bug below the protocol")  # neither ApiError nor NoAnswer
            if watched == 1:
                self.api.requests.append(("WATCH", path))
                raise ApiError(500, "InternalError")  # the API's refusal: the protocol retries
            with super().lines(path, params, seconds) as lines:
                stop.set()
                yield lines

    api = FakeApi()
    api.streams["/api/v1/pods"] = [[modified]]
    watcher = PodWatch(Flaky(api), "node-a", lambda: "app=sandbox", lambda: woken.append(1),
                       lambda: failed.append(1), stop)  # fmt: skip
    with mock.patch("deathwatch._kube.backoff.NODE_WATCH", (0.01,)):
        thread = watcher.start()
        thread.join(10)
    assert not thread.is_alive()
    # a bug: counted, the watch started again from a list; the API's 500: counted, retried
    # from where it was (no list); the change: a wake
    assert len(failed) == 2
    assert len(woken) == 3  # two lists and the change
    assert [m for m, _ in api.requests] == ["GET", "WATCH", "GET", "WATCH", "WATCH"]


class Nodes:
    """The Node objects as the agent's watch last saw them."""

    def __init__(self, *nodes: tuple[str, list[str]]) -> None:
        self.nodes = [{"metadata": {"name": n}, "spec": {"podCIDRs": r}} for n, r in nodes]

    def snapshot(self) -> list[Mapping[str, Any]] | None:
        return list(self.nodes)


def deathwatch(namespace: str, name: str, controller: str = "", **spec: Any) -> dict[str, Any]:
    notes = {"deathwatch.dev/controller-id": controller} if controller else {}
    return {"metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}",
                         "annotations": notes}, "spec": spec}  # fmt: skip


def test_with_no_selector_the_agent_guards_exactly_the_pods_the_deathwatches_select(
    tmp_path: Path,
) -> None:
    """One definition of a sandbox (ADR 0037): no sandboxSelector (the default), and the
    inbound rule holds the pods a DeathWatch selects: by its podSelector in its namespace,
    and agent-sandbox's pods (a Sandbox's ownerReference and label) with no label of ours;
    only this release's DeathWatches (its controller id). Until the DeathWatches are listed,
    the sandboxes are unknown, never none."""
    path = tmp_path / "fw.yaml"
    path.write_text(json.dumps(GOOD))
    api, nft = FakeApi(), FakeNft()
    sandbox_ref = {"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "name": "s1",
                   "uid": "u", "controller": True}  # fmt: skip
    pods = {
        "10.244.1.2": ("sandboxes", {"app": "sandbox"}, []),  # selected by its DeathWatch
        "10.244.1.3": ("other", {"app": "sandbox"}, []),  # no DeathWatch in its namespace
        "10.244.1.4": ("sandboxes", {"app": "web"}, []),  # not selected
        "10.244.1.5": ("tenant", {"agents.x-k8s.io/sandbox-name-hash": "ab"}, [sandbox_ref]),
        "10.244.1.6": ("tenant", {"agents.x-k8s.io/sandbox-name-hash": "cd"}, []),  # no owner
    }
    for ip, (namespace, labels, owners) in pods.items():
        pod = sandbox_pod(ip)
        pod["metadata"] = {"name": f"pod-{ip}", "namespace": namespace, "labels": labels,
                           "ownerReferences": owners}  # fmt: skip
        api.add("pods", namespace, pod)
    agent = Agent(path, nft, link=ClusterLink(api.agent(), "node-a", "fw-a", "deathwatch-system"))
    agent.deathwatches = Seen(None)  # type: ignore[assignment]
    agent.step()
    notes = coverage_lease(api)["metadata"]["annotations"]
    assert notes["deathwatch.dev/sandboxes"] == "unknown"
    assert notes["deathwatch.dev/sandboxes-from"] == "deathwatches"
    assert "deathwatch.dev/sandbox-selector" not in notes  # the controller checks no labels
    listed = Seen([
        read(deathwatch("sandboxes", "dw", podSelector={"matchLabels": {"app": "sandbox"}})),
        read(deathwatch("tenant", "dw", podSelector={}, sandboxes="agent-sandbox")),
        read(deathwatch("other", "bad", podSelector={"matchLabels": {"app": "-bad"}})),
        # another release's (its controller id): its firewall guards its pods, not this one
        read(deathwatch("sandboxes", "web", "staging", podSelector={"matchLabels": {"app": "web"}})),
    ])  # fmt: skip
    agent.deathwatches = listed  # type: ignore[assignment]
    agent.step()
    config = parse_config(GOOD)
    assert nft.table == desired(config, [ip_address("10.244.1.2"), ip_address("10.244.1.5")])
    # every pod of the node is listed (the DeathWatches choose), not a label's
    assert ("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a") in api.requests
    assert coverage_lease(api)["metadata"]["annotations"]["deathwatch.dev/sandboxes"] == "2"
    # the DeathWatches not known again (a relist under way): the last known stay guarded
    agent.deathwatches = Seen(None)  # type: ignore[assignment]
    agent.step()
    assert nft.table == desired(config, [ip_address("10.244.1.2"), ip_address("10.244.1.5")])
    # an operator's selector overrides the DeathWatches, and the Lease says which it is
    path.write_text(json.dumps({**GOOD, "sandboxSelector": "app=web"}))
    agent.step()
    config = parse_config({**GOOD, "sandboxSelector": "app=web"})
    assert nft.table == desired(config, [ip_address("10.244.1.4")])
    notes = coverage_lease(api)["metadata"]["annotations"]
    assert (notes["deathwatch.dev/sandboxes-from"], notes["deathwatch.dev/sandbox-selector"]) \
        == ("selector", "app=web")  # fmt: skip
    # the staging release's agent (its controllerId) guards the staging DeathWatch's pod
    agent.deathwatches = listed  # type: ignore[assignment]
    path.write_text(json.dumps({**GOOD, "controllerId": "staging"}))
    agent.step()
    staging = parse_config({**GOOD, "controllerId": "staging"})
    assert nft.table == desired(staging, [ip_address("10.244.1.4")])  # not 1.2 nor 1.5
    api.add("pods", "sandboxes", {**sandbox_pod("10.244.1.9"), "metadata": {
        "name": "web-2", "namespace": "sandboxes", "labels": {"app": "web"}}})  # fmt: skip
    agent.step()
    config = parse_config({**GOOD, "controllerId": "staging"})
    assert nft.table == desired(config, [ip_address("10.244.1.4"), ip_address("10.244.1.9")])
    notes = coverage_lease(api)["metadata"]["annotations"]
    assert notes["deathwatch.dev/sandboxes-from"] == "deathwatches"


class Seen:
    """The DeathWatches as the agent's watch last saw them (None: not listed yet)."""

    def __init__(self, read: list[Any] | None) -> None:
        self.read = read

    def snapshot(self) -> list[Any] | None:
        return self.read


def test_the_deathwatch_watch_keeps_each_selection_and_wakes_the_agent() -> None:
    stop, wakes = threading.Event(), []
    api = FakeApi()
    api.add("deathwatches", "sandboxes", deathwatch("sandboxes", "a", podSelector={}))
    path = "/apis/deathwatch.dev/v1alpha1/deathwatches"
    edited = deathwatch("sandboxes", "a", podSelector={"matchLabels": {"app": "x"}})
    edited["metadata"]["resourceVersion"] = "12"
    api.streams[path] = [[
        {"type": "MODIFIED", "object": edited},
        {"type": "ADDED", "object": {**deathwatch("t", "b", sandboxes="nope"),
                                     "metadata": {"namespace": "t", "name": "b"}}},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "13"}}},
    ]]  # fmt: skip
    watch = DeathWatches(api.agent(), lambda: wakes.append(1), lambda: None, stop)
    assert watch.snapshot() is None
    watch.start()
    wait_for(lambda: any("resourceVersion=13" in p for _, p in api.requests), what="resumed")
    stop.set()
    snapshot = watch.snapshot()
    assert snapshot is not None
    chosen = selections(snapshot)
    assert len(chosen) == 1 and chosen[0].namespace == "sandboxes"
    assert chosen[0].selects({"metadata": {"namespace": "sandboxes", "labels": {"app": "x"}}})
    assert not chosen[0].selects({"metadata": {"namespace": "sandboxes", "labels": {}}})
    assert snapshot[1] == "spec.sandboxes: expected 'agent-sandbox', got 'nope'"
    assert len(wakes) == 3  # listed, edited, the unreadable one added


def test_pod_ranges_are_learned_from_the_nodes_and_the_inbound_rule_waits_for_all_of_them(
    tmp_path: Path,
) -> None:
    """No podCIDRs configured (the default): the ranges come from every Node's spec.podCIDRs.
    A node without one could hold the platform's gateway: its address would be in no range
    and refused, so the inbound rule waits (the output rule does not). A sandbox in no known
    range is left out of the inbound rule, never refused its clients."""
    path = tmp_path / "fw.yaml"
    path.write_text(json.dumps({"agentPorts": [49983]}))
    nft = FakeNft()
    agent = Agent(path, nft, sandboxes=[ip_address("10.42.0.7"), ip_address("192.168.9.9")])
    nodes = Nodes(("node-a", ["10.42.0.0/24"]), ("node-b", ["10.42.1.0/24"]))
    agent.nodes = nodes  # type: ignore[assignment]
    agent.step()
    assert nft.table is not None
    sets = {s.name: s.elements for s in nft.table.sets}
    assert sets["pod_v4"] == ("10.42.0.0/23",)
    assert sets["sandbox_v4"] == ("10.42.0.7",)  # 192.168.9.9: in no range, not guarded
    assert sets["podsrc_v4"] == ("10.42.0.2-10.42.0.255", "10.42.1.2-10.42.1.255")  # hosts out
    assert agent.metrics.inbound_enforced._value.get() == 1
    nodes.nodes.append({"metadata": {"name": "node-c"}, "spec": {}})
    agent.step()
    assert [c.name for c in nft.table.chains] == ["output"]  # the inbound rule waits
    assert agent.metrics.inbound_enforced._value.get() == 0
    # the operator's ranges are complete by their word; the nodes' are added to them
    path.write_text(json.dumps({"agentPorts": [49983], "podCIDRs": ["10.43.0.0/16"]}))
    agent.step()
    assert [c.name for c in nft.table.chains] == ["output", "inbound"]
    assert {s.name: s.elements for s in nft.table.sets}["pod_v4"] == ("10.42.0.0/23",
                                                                     "10.43.0.0/16")  # fmt: skip


def test_the_agent_writes_what_it_applied_for_its_readiness_probe(tmp_path: Path) -> None:
    """`check --state-file` compares the live table with what the agent applied: the table
    holds the pod ranges learned from the nodes, which the config alone does not say."""
    path, state = tmp_path / "fw.yaml", tmp_path / "applied.json"
    path.write_text(json.dumps({"agentPorts": [49983]}))
    nft = FakeNft()
    agent = Agent(path, nft, sandboxes=[ip_address("10.42.0.7")], state_file=state)
    agent.nodes = Nodes(("node-a", ["10.42.0.0/24"]))  # type: ignore[assignment]
    agent.step()
    digest, table = load_state(state.read_bytes())
    assert digest == load_config(path).digest() and table == nft.table
    assert {s.name: s.elements for s in table.sets}["pod_v4"] == ("10.42.0.0/24",)
    written = state.stat().st_mtime_ns
    agent.step()  # nothing changed: nothing written
    assert state.stat().st_mtime_ns == written
    with pytest.raises(ValueError, match="not an agent's state"):
        load_state(b'{"config": 1}')


@pytest.mark.parametrize(
    ("daemonset", "down", "removed"),
    [
        (None, False, True),  # gone: `helm uninstall` (background propagation), pruned
        ({"deletionTimestamp": "2026-12-02T10:00:00Z"}, False, True),  # foreground deletion
        ({}, False, False),  # standing: a rollout or a drain
        (None, True, False),  # the API cannot say: the table stays (the safe side)
    ],
)
def test_a_stopping_agent_removes_the_table_only_when_its_daemonset_is_uninstalled(
    tmp_path: Path, daemonset: dict[str, Any] | None, down: bool, removed: bool
) -> None:
    path = tmp_path / "fw.yaml"
    path.write_text(json.dumps(GOOD))
    api, nft = FakeApi(), FakeNft()
    if daemonset is not None:
        api.add("daemonsets", "deathwatch-system",
                {"metadata": {"name": "deathwatch-firewall", **daemonset}})  # fmt: skip
    link = ClusterLink(api.agent(), "node-a", "fw-a", "deathwatch-system", "deathwatch-firewall")
    agent = Agent(path, nft, link=link)
    agent.step()
    assert nft.table is not None and coverage_lease(api)
    api.down = down
    assert agent.leave() is removed
    assert (nft.table is None) is removed
    assert api.get("leases", "deathwatch-system", lease_name("node-a"))  # it goes stale
    asked = ("GET", "/apis/apps/v1/namespaces/deathwatch-system/daemonsets/deathwatch-firewall")
    assert asked in api.requests


def test_a_stopping_agent_not_told_to_remove_never_asks_and_keeps_the_table(
    tmp_path: Path,
) -> None:
    path = tmp_path / "fw.yaml"
    path.write_text(json.dumps(GOOD))
    api, nft = FakeApi(), FakeNft()
    agent = Agent(path, nft, link=ClusterLink(api.agent(), "node-a", "fw-a", "deathwatch-system"))
    agent.step()
    assert agent.leave() is False and nft.table is not None
    assert not [r for r in api.requests if "daemonsets" in r[1]]
    done = subprocess.run([sys.executable, "-m", "deathwatch.firewall.cli", "agent", "--config",
                           str(path), "--remove-on-uninstall", "deathwatch-firewall"],
                          capture_output=True, text=True, timeout=30, check=False,
                          env={k: v for k, v in os.environ.items() if k != "NODE_NAME"})  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--remove-on-uninstall needs --node-name" in done.stderr


def test_an_uninstall_whose_rbac_went_first_is_told_by_the_daemonsets_watch() -> None:
    """Helm deletes the DaemonSet, then the agent's roles; the pods stop after both, so the
    read at stop is refused (403). The watch, open since start, saw the deletion."""
    import msgspec

    from deathwatch._kube.errors import ApiError as KubeApiError
    from deathwatch._kube.listwatch import Item, Listed, Noted
    from deathwatch.firewall.uninstall import DaemonSetWatch, assess

    class Refused:
        def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
            raise KubeApiError(403, "Forbidden")

    api: Any = Refused()
    failures: list[int] = []
    watch = DaemonSetWatch(api, "deathwatch-system", "deathwatch-firewall",
                           lambda: failures.append(1), threading.Event())  # fmt: skip
    ds = msgspec.Raw(json.dumps({"metadata": {"name": "deathwatch-firewall"}}).encode())
    assert assess(api, "deathwatch-system", "deathwatch-firewall", watch).uninstalling is False
    watch.handle(Item("LISTED", ds, "1"))
    watch.handle(Listed("1", 1))
    assert assess(api, "deathwatch-system", "deathwatch-firewall", watch).uninstalling is False
    watch.handle(Item("DELETED", ds, "2"))
    seen = assess(api, "deathwatch-system", "deathwatch-firewall", watch)
    assert seen.uninstalling and "403" in seen.why and "deleted (seen on its watch)" in seen.why
    # deleted and made again (orphaning its pods, to change its selector): it stands
    watch.handle(Item("ADDED", ds, "3"))
    assert assess(api, "deathwatch-system", "deathwatch-firewall", watch).uninstalling is False
    # a relisting that finds none by its name: gone
    watch.handle(Listed("4", 0))
    assert assess(api, "deathwatch-system", "deathwatch-firewall", watch).uninstalling is True
    watch.handle(Noted("failed", KubeApiError(500, "InternalError"), 1.0))
    assert failures == [1]


@pytest.fixture(autouse=True)
def no_real_connections(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """The agent's self-check connects from the host to a sandbox (selfcheck.py): here no
    address is real, so every attempt is answered by nobody (inconclusive) unless a test
    says otherwise; the attempts are kept."""
    from deathwatch.firewall import selfcheck

    tried: list[tuple[str, int]] = []

    def dial(address: Any, port: int, timeout: float = 1.0, mark: bool = False) -> str:
        tried.append((str(address), port))
        return "timeout"

    monkeypatch.setattr(selfcheck, "connect", dial)
    return tried


def test_the_agent_measures_its_output_rule_on_its_nodes_sandboxes_in_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_real_connections: list[tuple[str, int]]
) -> None:
    from deathwatch.firewall import selfcheck

    path = tmp_path / "fw.yaml"
    path.write_text(json.dumps({**GOOD, "sandboxSelector": "app=sandbox"}))
    api, nft = FakeApi(), FakeNft()
    for ip in ("10.244.1.2", "10.244.1.3"):
        api.add("pods", "sandboxes", sandbox_pod(ip))
    agent = Agent(path, nft, link=ClusterLink(api.agent(), "node-a", "fw-a", "deathwatch-system"))

    def refused_by_us(address: Any, port: int, timeout: float = 1.0) -> str:
        no_real_connections.append((str(address), port))
        assert nft.table is not None
        output, *rest = nft.table.chains
        counted = dataclasses.replace(output.rules[0], packets=output.rules[0].packets + 1)
        nft.table = dataclasses.replace(nft.table, chains=(
            dataclasses.replace(output, rules=(counted, *output.rules[1:])), *rest))  # fmt: skip
        return "refused"

    def notes() -> dict[str, str]:
        return coverage_lease(api)["metadata"]["annotations"]  # type: ignore[no-any-return]

    monkeypatch.setattr(selfcheck, "connect", refused_by_us)
    agent.step()
    agent.step()
    assert notes()["deathwatch.dev/rule-measured"] == "verified"
    port = parse_config(GOOD).agent_ports[0]
    assert no_real_connections == [("10.244.1.2", port), ("10.244.1.3", port)]  # in turn
    assert agent.metrics.self_checks.labels("verified")._value.get() == 2
    assert agent.metrics.rejected._value.get() == 0  # its own refusals are not a neighbour's
    # the host got through: whatever carries its packets skips the table
    monkeypatch.setattr(selfcheck, "connect", lambda address, port, timeout=1.0: "connected")
    agent.step()
    assert notes()["deathwatch.dev/rule-measured"] == "bypassed"
    assert agent.metrics.rule_bypassed._value.get() == 1
    # refused, but not by us (our counter did not move): no proof either way
    monkeypatch.setattr(selfcheck, "connect", lambda address, port, timeout=1.0: "refused")
    agent.step()
    assert notes()["deathwatch.dev/rule-measured"] == "inconclusive"
    assert agent.metrics.rule_bypassed._value.get() == 0
    # no sandbox on this node: nothing to try
    api.objects = {k: v for k, v in api.objects.items() if k[0] != "pods"}
    agent.step()
    assert notes()["deathwatch.dev/rule-measured"] == "none"


def test_a_self_check_outcome_is_the_connection_and_our_counter_together() -> None:
    from deathwatch.firewall.selfcheck import Measured, outcome

    assert outcome("refused", 4, 5) is Measured.VERIFIED
    assert outcome("refused", 4, 4) is Measured.INCONCLUSIVE
    assert outcome("connected", 4, 4) is Measured.BYPASSED
    assert outcome("connected", 4, 5) is Measured.BYPASSED  # a neighbour's refusal meanwhile
    assert outcome("timeout", 4, 5) is Measured.INCONCLUSIVE
    assert outcome("error:101", 4, 4) is Measured.INCONCLUSIVE


class Unlisted:
    """A Node watch that has not listed yet."""

    def snapshot(self) -> list[Mapping[str, Any]] | None:
        return None


def test_a_new_agent_never_replaces_the_table_in_force_before_it_knows_the_pod_ranges(
    tmp_path: Path,
) -> None:
    """A rollout: the old agent's table (its output rule over the learned range) is in force;
    the new agent, its Node watch not listed yet, would know no range and drop the rule. It
    touches nothing until the listing comes, then applies (the Helm lane caught the hole)."""
    path = tmp_path / "fw.yaml"
    path.write_text(json.dumps({"agentPorts": [49983]}))  # no podCIDRs: learned from the nodes
    api, nft = FakeApi(), FakeNft()
    old = Agent(path, nft)
    old.nodes = Nodes(("node-a", ["10.42.0.0/24"]))  # type: ignore[assignment]
    old.link = None
    old.step()
    in_force = nft.table
    assert in_force is not None and in_force.chains[0].rules  # the output rule, over 10.42/24
    new = Agent(path, nft, link=ClusterLink(api.agent(), "node-a", "fw-b", "deathwatch-system"))
    new.nodes = Unlisted()  # type: ignore[assignment]
    new.step()
    assert nft.table is in_force and len(nft.applied) == 1  # untouched
    new.nodes = Nodes(("node-a", ["10.42.0.0/24"]))  # type: ignore[assignment]
    new.step()
    assert nft.table == in_force
    # with no table at all (a first install) there is nothing to keep: it applies what it knows
    fresh_nft = FakeNft()
    first = Agent(
        path, fresh_nft, link=ClusterLink(api.agent(), "node-b", "fw-c", "deathwatch-system")
    )
    first.nodes = Unlisted()  # type: ignore[assignment]
    first.step()
    assert fresh_nft.table is not None


# --- audit mode (ADR 0027) -----------------------------------------------------------------

AUDIT = {**GOOD, "mode": "audit"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"mode": "warn"}, "mode: expected enforce or audit, got 'warn'"),
        ({"mode": "audit", "enforceNodeSelector": "pool in (a)"},
         "enforceNodeSelector: --selector term 'pool in (a)': set-based terms"),
        ({"enforceNodeSelector": "a b=c"}, "enforceNodeSelector: --selector term 'a b=c'"),
    ],
)  # fmt: skip
def test_a_bad_mode_or_node_selector_names_the_field(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config({**GOOD, **extra})


def test_audit_mode_counts_and_records_what_it_would_refuse_and_refuses_nothing() -> None:
    from deathwatch.firewall.ruleset import SELF_COMMENT

    table = desired(
        parse_config({**AUDIT, "agentPorts": [49983, 8000]}), [ip_address("10.244.1.2")]
    )
    rules = [r for c in table.chains for r in c.rules]
    assert [r for r in rules if r.verdict] == []  # no verdict at all: nothing refused
    audits = [r for r in rules if r.comment != SELF_COMMENT]
    assert sorted(r.comment or "" for r in audits) == sorted(
        f"deathwatch audit: {kind} {port}"
        for kind in ("host", "outside", "host-in-pod-range")
        for port in (8000, 49983)
        for _ in ("v4", "v6")
    )
    for r in audits:  # a connection's first packet, recorded in its chain's set
        assert Match("ct state", "new") in r.matches and len(r.statements) == 1
        assert r.statements[0].startswith(("update @audit_out_", "update @audit_in_"))
    dynamic = {s.name for s in table.sets if s.dynamic}
    assert dynamic == {"audit_out_v4", "audit_out_v6", "audit_in_v4", "audit_in_v6"}
    # the same config enforced: the rules as ever (the pinned script)
    assert desired(parse_config(GOOD)) == desired(parse_config({**GOOD, "mode": "enforce"}))


def test_a_real_nft_audit_listing_reduces_to_the_desired_table_with_its_counts() -> None:
    """Recorded from nft 1.0.6 (hack/make_recordings.py --nft): NFT_CONFIG in audit mode, the
    host's 3 (v4) and 2 (v6) connections let through, counted and recorded."""
    from deathwatch.firewall.ruleset import audited, recorded

    have = from_json(json.loads((DATA / "nft-1.0.6-audit-table.json").read_text()))
    config = parse_config({**NFT_CONFIG, "mode": "audit"})
    want = desired(config, [ip_address(a) for a in NFT_SANDBOXES],
                   [ip_address(a) for a in NFT_HOSTS])  # fmt: skip
    assert differences(want, have) == []  # the recorded elements are the kernel's, not drift
    assert have is not None and have.rejected_packets == 0
    assert {k: v for k, v in audited(have).items() if v} == {("host", 49983): 5}
    assert sorted(recorded(have)) == [("out", "10.9.0.1", 49983, "10.244.0.5"),
                                      ("out", "fd00:9::1", 49983, "fd00:10:244::5")]  # fmt: skip
    assert script(want).count("update @audit_") == 12  # 2 ports x 3 kinds x 2 families


def test_audit_mode_is_per_node_by_its_labels() -> None:
    staged = parse_config({**AUDIT, "enforceNodeSelector": "pool=a,!drain"})
    assert staged.for_node({"pool": "a"}).mode == "enforce"
    assert staged.for_node({"pool": "a", "drain": "yes"}).mode == "audit"
    assert staged.for_node({"pool": "b"}).mode == "audit"
    assert staged.for_node(None).mode == "audit"  # labels not known yet: as configured
    assert parse_config(GOOD).for_node({"pool": "b"}).mode == "enforce"


class Listed:
    """A Node watch that has listed these Node objects."""

    def __init__(self, *nodes: dict[str, Any]) -> None:
        self.nodes: list[Mapping[str, Any]] = list(nodes)

    def snapshot(self) -> list[Mapping[str, Any]] | None:
        return self.nodes


def _counted(table: Table, comment: str, packets: int) -> Table:
    chains = tuple(
        dataclasses.replace(c, rules=tuple(
            dataclasses.replace(r, packets=packets) if r.comment == comment else r
            for r in c.rules))
        for c in table.chains
    )  # fmt: skip
    return dataclasses.replace(table, chains=chains)


def test_an_auditing_agent_counts_by_port_and_kind_logs_each_source_once_and_says_audit(
    tmp_path: Path, no_real_connections: list[tuple[str, int]]
) -> None:
    import structlog.testing

    path = tmp_path / "fw.yaml"
    path.write_text(json.dumps({**AUDIT, "sandboxSelector": "app=sandbox",
                                "enforceNodeSelector": "deathwatch.dev/firewall=enforce"}))  # fmt: skip
    api, nft = FakeApi(), FakeNft()
    api.add("pods", "sandboxes", sandbox_pod("10.244.1.2"))
    agent = Agent(path, nft, link=ClusterLink(api.agent(), "node-a", "fw-a", "deathwatch-system"))
    labels: dict[str, str] = {}
    node = {
        "metadata": {"name": "node-a", "labels": labels},
        "spec": {"podCIDRs": ["10.244.1.0/24"]},
    }
    agent.nodes = Listed(node)  # type: ignore[assignment]
    agent.step()
    assert agent.mode == "audit" and agent.metrics.enforcing._value.get() == 0
    notes = coverage_lease(api)["metadata"]["annotations"]
    assert notes["deathwatch.dev/mode"] == "audit"
    # every series exists at 0 before it counts: an alert's increase() sees its first count
    exposed = prometheus_client.generate_latest(agent.metrics.registry).decode()
    for kind in ("host", "outside", "host-in-pod-range"):
        line = f'deathwatch_firewall_audited_connections_total{{port="49983",source="{kind}"}} 0.0'
        assert line in exposed
    assert nft.table is not None
    table = _counted(nft.table, "deathwatch audit: host 49983", 2)
    table = _counted(table, "deathwatch audit: outside 49983", 1)
    records = [f"10.9.0.{i} . 49983 . 10.244.1.2" for i in range(1, 14)]
    table = dataclasses.replace(table, sets=tuple(
        dataclasses.replace(s, elements=tuple(records)) if s.name == "audit_in_v4" else s
        for s in table.sets))  # fmt: skip
    nft.table = table
    said: list[list[Any]] = []
    for _ in range(3):  # the same counters and records each time: counted once, said once
        with structlog.testing.capture_logs() as logs:
            agent.step()
        said.append([e for e in logs if e["event"].startswith("audit: would refuse")])
    audited = agent.metrics.audited
    # each rule of both families counted: v4 and v6 summed by port and kind
    assert audited.labels("49983", "host")._value.get() == 4
    assert audited.labels("49983", "outside")._value.get() == 2
    # at most ten sources a resync, the rest counted in one line and said at the next
    assert [len(s) for s in said] == [11, 3, 0]
    assert said[0][0]["source"] == "10.9.0.1" and said[0][0]["kind"] == "outside"
    assert said[0][-1] == {**said[0][-1], "event": "audit: would refuse more", "more": 3}
    assert len(nft.applied) == 1  # the kernel's records and counters are not drift
    # the node labelled into enforcement: the table replaced at once, refusing
    labels["deathwatch.dev/firewall"] = "enforce"
    agent.step()
    assert agent.mode == "enforce" and agent.metrics.enforcing._value.get() == 1
    assert nft.table is not None and len(nft.applied) == 2
    assert [s.name for s in nft.table.sets if s.name.startswith("audit")] == []
    assert all(r.verdict == "reject with tcp reset" for c in nft.table.chains for r in c.rules)
    assert coverage_lease(api)["metadata"]["annotations"]["deathwatch.dev/mode"] == "enforce"


def test_a_self_check_in_audit_mode_is_our_own_rule_seeing_the_host() -> None:
    from deathwatch.firewall.selfcheck import Measured, outcome

    assert outcome("connected", 4, 5, audit=True) is Measured.VERIFIED
    assert outcome("connected", 4, 4, audit=True) is Measured.BYPASSED
    assert outcome("refused", 4, 5, audit=True) is Measured.VERIFIED  # someone else refused
    assert outcome("timeout", 4, 4, audit=True) is Measured.INCONCLUSIVE
    assert outcome("error:mark:1", 4, 4, audit=True) is Measured.INCONCLUSIVE


def test_an_agent_whose_table_another_release_holds_leaves_it_alone_and_says_who(
    tmp_path: Path,
) -> None:
    """ADR 0038: two releases applied with `helm template | kubectl apply` on one table. The
    agent of the release applied later never applies, repairs or removes it (not even told
    to remove it on uninstall), and its Lease names the release that holds it; once that
    release is gone, it takes the table."""
    from deathwatch._kube.releases import workload
    from deathwatch.firewall.rivals import FirewallReleases
    from tests.unit.test_releases import obj

    path = tmp_path / "fw.yaml"
    path.write_text(json.dumps(GOOD))
    api, nft = FakeApi(), FakeNft()
    api.add("daemonsets", "deathwatch-staging",
            {"metadata": {"name": "staging-deathwatch-firewall"}})  # fmt: skip
    link = ClusterLink(api.agent(), "node-a", "fw-a", "deathwatch-staging",
                       "staging-deathwatch-firewall", daemonset="staging-deathwatch-firewall")  # fmt: skip
    agent = Agent(path, nft, link=link)
    first = workload(obj("deathwatch-system", "deathwatch", "firewall", "2026-12-01T00:00:00Z",
                         table="deathwatch"), "DaemonSet")  # fmt: skip
    mine = workload(obj("deathwatch-staging", "staging", "firewall", "2026-12-02T00:00:00Z",
                        table="deathwatch"), "DaemonSet")  # fmt: skip
    releases = FirewallReleases(api.agent(), lambda: None, lambda: None, threading.Event())
    agent.releases = releases
    # not listed yet: a table in force (here the first release's) stays untouched
    theirs = desired(parse_config({**GOOD, "agentPorts": [40000]}), [])
    nft.table = theirs
    agent.step()
    assert nft.table is theirs
    releases.objects, releases.listed = {"a": first, "b": mine}, True  # as listed
    agent.step()
    assert nft.table is theirs  # never applied, never repaired
    notes = coverage_lease(api, namespace="deathwatch-staging")["metadata"]["annotations"]
    assert notes["deathwatch.dev/rule"] == "contested"
    assert notes["deathwatch.dev/table-held-by"] == (
        "release deathwatch (namespace deathwatch-system, DaemonSet deathwatch-deathwatch-firewall)"
    )
    gauge = agent.metrics.release_collisions.labels("table", "deathwatch-system/deathwatch", "true")
    assert gauge._value.get() == 1
    assert agent.leave() is False and nft.table is theirs  # never another's table
    # the other release uninstalled: this agent takes the table at its next resync
    releases.objects = {"b": mine}
    agent.step()
    assert nft.table == desired(parse_config(GOOD), [])
    notes = coverage_lease(api, namespace="deathwatch-staging")["metadata"]["annotations"]
    assert (
        notes["deathwatch.dev/rule"] == "in-force" and "deathwatch.dev/table-held-by" not in notes
    )
