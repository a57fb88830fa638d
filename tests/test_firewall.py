"""The firewall's pure parts: config validation, rendering, reading the live table back,
and the agent's decisions over a fake nft (the real one is in test_firewall_netns.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deathwatch.firewall.agent import Agent
from deathwatch.firewall.config import ConfigError, FirewallConfig, load_config, parse_config
from deathwatch.firewall.nft import NftError
from deathwatch.firewall.ruleset import (
    COMMENT,
    desired,
    differences,
    live,
    rejected_packets,
    render,
)

DATA = Path(__file__).parent / "data" / "nft"
GOOD = {"podCIDRs": ["10.244.0.0/16", "fd00:10:244::/56"], "agentPorts": [49983]}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"podCIDRs": [], "agentPorts": [1]}, "podCIDRs: expected a non-empty list"),
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


def test_render_replaces_the_whole_table_in_one_script() -> None:
    script = render(parse_config(GOOD))
    lines = script.splitlines()
    assert lines[:3] == [
        "table inet deathwatch",
        "delete table inet deathwatch",
        "table inet deathwatch {",
    ]
    assert "type filter hook output priority -90; policy accept;" in script
    assert script.count("reject with tcp reset") == 2
    assert "ip daddr @pod_v4 tcp dport { 49983 } counter" in script
    assert "ip6 daddr @pod_v6 tcp dport { 49983 } counter" in script


def test_v4_only_config_has_no_v6_rule_and_cidrs_are_collapsed() -> None:
    config = parse_config({"podCIDRs": ["10.244.0.0/17", "10.244.128.0/17"], "agentPorts": [1]})
    script = render(config)
    assert "pod_v6" not in script
    assert "elements = { 10.244.0.0/16 }" in script


def test_live_model_of_a_real_nft_listing_matches_what_rendering_asked_for() -> None:
    # recorded from nft 1.0.6 after applying this exact config
    listing = json.loads((DATA / "nft-1.0.6-list-table.json").read_text())
    config = FirewallConfig(
        pod_cidrs=tuple(
            parse_config(
                {
                    "podCIDRs": ["10.244.0.0/16", "10.1.2.3/32", "fd00:10:244::/56"],
                    "agentPorts": [1],
                }
            ).pod_cidrs
        ),
        agent_ports=(8000, 49983),
    )
    have = live(listing)
    assert have is not None
    # the recorded table was applied with other comments: everything else must match
    want = desired(config)
    diffs = differences(want, have)
    assert len(diffs) == 1
    assert diffs[0].startswith("rules:")
    assert have.sets == want.sets
    assert have.chains == want.chains


def test_differences_name_what_drifted() -> None:
    want = desired(parse_config(GOOD))
    assert differences(want, None) == ["table inet deathwatch is missing"]
    assert differences(want, want) == []
    flushed = type(want)(want.chains, want.sets, ())
    assert differences(want, flushed)[0].startswith("rules: want")


def test_rejected_packets_sums_the_counters() -> None:
    listing = {
        "nftables": [
            {"rule": {"expr": [{"counter": {"packets": 3, "bytes": 180}}]}},
            {"rule": {"expr": [{"counter": {"packets": 4, "bytes": 1}}]}},
        ]
    }
    assert rejected_packets(listing) == 7
    assert rejected_packets(None) == 0


# --- the agent's decisions, over a fake nft -------------------------------------------------


def nft_listing(config: FirewallConfig) -> dict[str, Any]:
    """What nft 1.0.6 lists for the table rendered from `config` (shape as recorded)."""
    items: list[dict[str, Any]] = [{"table": {"family": "inet", "name": "deathwatch"}}]
    for name, kind, nets in (
        ("pod_v4", "ipv4_addr", config.v4),
        ("pod_v6", "ipv6_addr", config.v6),
    ):
        if nets:
            elems = [{"prefix": {"addr": str(n.network_address), "len": n.prefixlen}} for n in nets]
            items.append(
                {"set": {"name": name, "type": kind, "flags": ["interval"], "elem": elems}}
            )
    items.append(
        {
            "chain": {
                "name": "output",
                "type": "filter",
                "hook": "output",
                "prio": -90,
                "policy": "accept",
            }
        }
    )
    for proto, name, nets in (("ip", "pod_v4", config.v4), ("ip6", "pod_v6", config.v6)):
        if nets:
            ports: Any = (
                {"set": list(config.agent_ports)}
                if len(config.agent_ports) > 1
                else config.agent_ports[0]
            )
            expr = [
                {
                    "match": {
                        "op": "==",
                        "left": {"payload": {"protocol": proto, "field": "daddr"}},
                        "right": f"@{name}",
                    }
                },
                {
                    "match": {
                        "op": "==",
                        "left": {"payload": {"protocol": "tcp", "field": "dport"}},
                        "right": ports,
                    }
                },
                {"counter": {"packets": 0, "bytes": 0}},
                {"reject": {"type": "tcp reset"}},
            ]
            items.append({"rule": {"chain": "output", "comment": COMMENT, "expr": expr}})
    return {"nftables": items}


class FakeNft:
    """The 'live table' as nft would list it; knows which config each script came from."""

    def __init__(self, configs: list[FirewallConfig]) -> None:
        self.by_script = {render(c): c for c in configs}
        self.table: dict[str, Any] | None = None
        self.applied: list[str] = []
        self.fail = False

    def apply(self, script: str) -> None:
        if self.fail:
            raise NftError("nft -f failed: simulated")
        self.applied.append(script)
        self.table = nft_listing(self.by_script[script])

    def list_table(self) -> dict[str, Any] | None:
        return self.table

    def delete_table(self) -> None:
        self.table = None


def test_fake_listing_is_judged_exactly_right() -> None:
    config = parse_config(GOOD)
    assert differences(desired(config), live(nft_listing(config))) == []
    # several ports: nft lists them in numeric order, which is not their string order
    many = parse_config({**GOOD, "agentPorts": [49983, 8000, 123]})
    assert differences(desired(many), live(nft_listing(many))) == []


def test_agent_applies_repairs_and_keeps_the_rule_on_a_bad_config(tmp_path: Path) -> None:
    path = tmp_path / "fw.yaml"
    path.write_text(json.dumps(GOOD))
    nft = FakeNft([parse_config(GOOD)])
    agent = Agent(path, nft)
    agent.step()
    assert len(nft.applied) == 1
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
    nft.table["nftables"] = [i for i in nft.table["nftables"] if "rule" not in i]  # flushed
    agent.step()  # never raises
    assert agent.metrics.sync_failures.labels("nft")._value.get() == 1
    assert agent.metrics.rule_present._value.get() == 0


def test_agent_with_no_valid_config_leaves_the_table_alone(tmp_path: Path) -> None:
    path = tmp_path / "fw.yaml"
    path.write_text("agentPorts: [1]\n")
    previous = nft_listing(parse_config(GOOD))  # a previous agent's rule, during a rollout
    nft = FakeNft([])
    nft.table = previous
    Agent(path, nft).step()
    assert nft.applied == []
    assert nft.table is previous


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
    assert rendered.stdout == render(parse_config(GOOD))
    for action in ("render", "apply", "check", "agent"):
        result = cli(action, "--config", str(bad)) if action != "agent" else None
        if result is not None:
            assert result.returncode == 2, action
            assert "agentPorts[0]: expected a TCP port 1-65535, got 70000" in result.stderr
            assert "Traceback" not in result.stderr
