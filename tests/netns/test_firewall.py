"""The firewall on real nftables, in a node built from network namespaces (routed and
bridge wirings): what the host and hostNetwork pods can reach, what ordinary pods can, and
the agent keeping the rule through drift, config changes and SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from ipaddress import ip_address
from pathlib import Path

import pytest

from deathwatch.firewall.config import load_config
from deathwatch.firewall.ruleset import desired
from deathwatch.firewall.table import from_json
from hack.localcluster.netnode import (
    AGENT_PORT,
    GATEWAY,
    NODE_B,
    OTHER_PORT,
    Node,
    netns_available,
    node,
    tunnel_addresses,
    two_nodes,
)
from tests.kube import wait_for

pytestmark = pytest.mark.netns
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["routed", "bridge"])
def host(request: pytest.FixtureRequest) -> Iterator[Node]:
    reason = netns_available()
    if reason:
        pytest.skip(reason)
    with node(request.param) as n:
        n.listen(n.sandbox)  # type: ignore[arg-type]
        n.wait_reachable(n.host, n.sandbox.v4, AGENT_PORT)  # type: ignore[union-attr]
        n.wait_reachable(n.host, n.sandbox.v6, AGENT_PORT)  # type: ignore[union-attr]
        yield n


def config_file(
    tmp_path: Path, n: Node, ports: list[int], resync: float = 10, name: str = "fw.yaml"
) -> Path:
    path = tmp_path / name
    path.write_text(
        json.dumps({"podCIDRs": n.pod_cidrs, "agentPorts": ports, "resyncSeconds": resync})
    )
    return path


def firewall(n: Node, *args: str) -> subprocess.CompletedProcess[str]:
    return n.ns_exec(
        n.host, sys.executable, "-m", "deathwatch.firewall.cli", *args, check=False, timeout=30
    )


def test_host_is_refused_the_agent_port_and_nothing_else(host: Node, tmp_path: Path) -> None:
    sbx, other = host.sandbox, host.ordinary
    assert sbx is not None
    assert other is not None
    # without the rule the host reaches the agent: the hole this closes
    assert host.connect(host.host, sbx.v4, AGENT_PORT) == "connected"
    cfg = config_file(tmp_path, host, [AGENT_PORT])
    applied = firewall(host, "apply", "--config", str(cfg))
    assert applied.returncode == 0, applied.stderr
    assert firewall(host, "check", "--config", str(cfg)).returncode == 0
    outcomes = {
        "host -> agent v4": host.connect(host.host, sbx.v4, AGENT_PORT),
        "host -> agent v6": host.connect(host.host, sbx.v6, AGENT_PORT),
        "host -> other port v4": host.connect(host.host, sbx.v4, OTHER_PORT),
        "host -> other port v6": host.connect(host.host, sbx.v6, OTHER_PORT),
        "pod -> agent v4": host.connect(other.ns, sbx.v4, AGENT_PORT),
        "pod -> agent v6": host.connect(other.ns, sbx.v6, AGENT_PORT),
    }
    assert outcomes == {
        "host -> agent v4": "refused",  # a TCP reset, at once (not a timeout)
        "host -> agent v6": "refused",
        "host -> other port v4": "connected",
        "host -> other port v6": "connected",
        "pod -> agent v4": "connected",
        "pod -> agent v6": "connected",
    }
    live = from_json(json.loads(host.nft("-j", "list", "table", "inet", "deathwatch").stdout))
    assert live == desired(load_config(cfg))  # the whole table, exactly as the model says
    assert live is not None and live.rejected_packets >= 2  # the two refusals were counted


def test_a_service_dnat_to_the_agent_port_is_refused(host: Node, tmp_path: Path) -> None:
    sbx = host.sandbox
    assert sbx is not None
    host.ns_exec(host.host, "ip", "-6", "route", "add", "fd00:96::/64", "dev", "lo")
    # what kube-proxy does for a ClusterIP, in the host's nat output path
    host.nft(
        "-f",
        "-",
        stdin=f"""
table ip svc {{
  chain out {{
    type nat hook output priority -100;
    ip daddr 10.96.0.10 tcp dport 80 dnat to {sbx.v4}:{AGENT_PORT}
    ip daddr 10.96.0.11 tcp dport 80 dnat to {sbx.v4}:{OTHER_PORT}
  }}
}}
table ip6 svc {{
  chain out {{
    type nat hook output priority -100;
    ip6 daddr fd00:96::10 tcp dport 80 dnat to [{sbx.v6}]:{AGENT_PORT}
  }}
}}
""",
    )
    assert host.connect(host.host, "10.96.0.10", 80) == "connected"  # the hole, via a Service
    assert (
        firewall(
            host, "apply", "--config", str(config_file(tmp_path, host, [AGENT_PORT]))
        ).returncode
        == 0
    )
    assert host.connect(host.host, "10.96.0.10", 80) == "refused"
    assert host.connect(host.host, "fd00:96::10", 80) == "refused"
    assert host.connect(host.host, "10.96.0.11", 80) == "connected"
    # and the agent never touched the other tables
    assert host.nft("list", "table", "ip", "svc").returncode == 0


def test_an_established_connection_is_cut_when_the_rule_arrives(host: Node, tmp_path: Path) -> None:
    sbx = host.sandbox
    assert sbx is not None
    hold = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            host.host,
            sys.executable,
            str(ROOT / "hack" / "localcluster" / "netns_tool.py"),
            "hold",
            sbx.v4,
            str(AGENT_PORT),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert hold.stdout is not None and hold.stdin is not None
        assert hold.stdout.readline().strip() == "held"
        assert (
            firewall(
                host, "apply", "--config", str(config_file(tmp_path, host, [AGENT_PORT]))
            ).returncode
            == 0
        )
        hold.stdin.write("go\n")
        hold.stdin.flush()
        result = hold.stdout.readline().strip()
    finally:
        hold.kill()
        hold.wait(5)
    assert result.startswith("error:"), result


def test_agent_repairs_drift_reloads_config_and_leaves_the_rule_on_sigterm(
    host: Node, tmp_path: Path
) -> None:
    sbx = host.sandbox
    assert sbx is not None
    cfg = config_file(tmp_path, host, [AGENT_PORT], resync=0.5)
    host.nft("add", "table", "inet", "someone-else")
    host.nft("add", "chain", "inet", "someone-else", "c")
    log = (tmp_path / "agent.log").open("w")
    agent = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            host.host,
            sys.executable,
            "-m",
            "deathwatch.firewall.cli",
            "agent",
            "--config",
            str(cfg),
            "--metrics-port",
            "0",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])},
    )

    def in_force(config: Path = cfg) -> bool:
        return firewall(host, "check", "--config", str(config)).returncode == 0

    try:
        wait_for(in_force, timeout=15, what="the agent's first apply")
        assert host.connect(host.host, sbx.v4, AGENT_PORT) == "refused"
        for drift in (
            ["delete", "table", "inet", "deathwatch"],
            ["flush", "table", "inet", "deathwatch"],
            [
                "insert",
                "rule",
                "inet",
                "deathwatch",
                "output",
                "tcp",
                "dport",
                str(AGENT_PORT),
                "accept",
            ],
            ["flush", "set", "inet", "deathwatch", "pod_v4"],
        ):
            # frozen while the drift is made and seen: the check must not race the repair
            agent.send_signal(signal.SIGSTOP)
            host.nft(*drift)
            assert not in_force(), drift
            agent.send_signal(signal.SIGCONT)
            started = time.monotonic()
            wait_for(in_force, timeout=10, what=f"repair after nft {' '.join(drift)}")
            repaired_in = time.monotonic() - started
            assert repaired_in < 3, f"repair took {repaired_in:.1f}s with a 0.5 s resync"
            assert host.connect(host.host, sbx.v4, AGENT_PORT) == "refused"
        # a new config is picked up
        new = config_file(tmp_path, host, [AGENT_PORT, OTHER_PORT], resync=0.5, name="new.yaml")
        cfg.write_text(new.read_text())
        wait_for(
            in_force,
            timeout=10,
            what=f"the new config in force; agent {agent.poll()}; log: {(tmp_path / 'agent.log').read_text()[-600:]}",
        )
        assert host.connect(host.host, sbx.v4, OTHER_PORT) == "refused"
        # a broken config keeps the previous rule
        cfg.write_text("podCIDRs: [10.244.0.0/16]\nagentPorts: [70000]\n")
        wait_for(
            lambda: "config rejected" in (tmp_path / "agent.log").read_text(),
            timeout=10,
            what="the bad config logged",
        )
        assert in_force(new)
        assert host.connect(host.host, sbx.v4, OTHER_PORT) == "refused"
        # SIGTERM: the agent exits, the rule stays (a rollout never opens the hole)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(15) == 0
        assert in_force(new)
        assert host.connect(host.host, sbx.v4, AGENT_PORT) == "refused"
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(5)
        log.close()
    # uninstall: cleanup removes our table, and only ours
    assert firewall(host, "cleanup").returncode == 0
    assert host.nft("list", "table", "inet", "deathwatch", check=False).returncode != 0
    assert host.nft("list", "table", "inet", "someone-else").returncode == 0
    assert host.connect(host.host, sbx.v4, AGENT_PORT) == "connected"
    events = [
        json.loads(line)
        for line in (tmp_path / "agent.log").read_text().splitlines()
        if line.startswith("{")
    ]
    assert any(e.get("event") == "drift repaired" for e in events)
    assert any(e.get("event") == "agent stopping; the table stays in place" for e in events)


# --- the output rule keys on the host's own source address ---------------------------------

CLIENT = "10.244.7.9"  # a pod address of another range: never an address of this host


def test_a_connection_sent_on_the_output_path_from_a_pod_address_passes(
    host: Node, tmp_path: Path
) -> None:
    """IPVS sends a client pod's Service connection out through the host's output hook with
    the pod's address as source: it must reach the sandbox. Reproduced with a transparent
    socket bound to a pod address, and the reply steered back to it as TPROXY does."""
    sbx = host.sandbox
    assert sbx is not None
    host.ns_exec(host.host, "ip", "rule", "add", "fwmark", "0x77", "lookup", "177")
    host.ns_exec(host.host, "ip", "route", "add", "local", f"{CLIENT}/32", "dev", "lo",
                 "table", "177")  # fmt: skip
    host.nft("-f", "-", stdin=f"""
table ip steer {{
  chain pre {{ type filter hook prerouting priority -150; ip daddr {CLIENT} meta mark set 0x77; }}
}}
""")  # fmt: skip
    assert host.connect(host.host, sbx.v4, AGENT_PORT, source=CLIENT) == "connected"
    cfg = config_file(tmp_path, host, [AGENT_PORT])
    assert firewall(host, "apply", "--config", str(cfg)).returncode == 0
    outcomes = {
        "pod address via output -> agent": host.connect(
            host.host, sbx.v4, AGENT_PORT, source=CLIENT
        ),
        "host -> agent": host.connect(host.host, sbx.v4, AGENT_PORT),
        "host -> other port": host.connect(host.host, sbx.v4, OTHER_PORT),
    }
    assert outcomes == {
        "pod address via output -> agent": "connected",
        "host -> agent": "refused",
        "host -> other port": "connected",
    }


# --- the receiving side: two nodes, only A runs the agent ----------------------------------


@pytest.fixture(params=["routed", "bridge"])
def nodes(request: pytest.FixtureRequest) -> Iterator[tuple[Node, Node]]:
    reason = netns_available()
    if reason:
        pytest.skip(reason)
    with two_nodes(request.param) as (a, b):
        assert a.sandbox is not None and a.ordinary is not None and b.ordinary is not None
        a.listen(a.sandbox)
        a.listen(a.ordinary)  # not a sandbox, but listening on the agent port too
        for ns in (b.host, b.ordinary.ns):
            a.wait_reachable(ns, a.sandbox.v4, AGENT_PORT)
            a.wait_reachable(ns, a.sandbox.v6, AGENT_PORT)
        yield a, b


def test_another_nodes_host_is_refused_by_the_sandboxs_own_node_alone(
    nodes: tuple[Node, Node], tmp_path: Path
) -> None:
    a, b = nodes
    sbx, other, b_pod = a.sandbox, a.ordinary, b.ordinary
    assert sbx is not None and other is not None and b_pod is not None
    path = tmp_path / "fw.yaml"
    path.write_text(
        json.dumps(
            {"podCIDRs": ["10.244.0.0/16", "fd00:10:244::/56"], "agentPorts": [AGENT_PORT],
             "allowedSources": [f"{GATEWAY}/32"]}
        )
    )  # fmt: skip
    # the hole: B's host reaches A's sandbox agent; B runs no agent and never will here
    assert a.connect(b.host, sbx.v4, AGENT_PORT) == "connected"
    applied = firewall(a, "apply", "--config", str(path), "--sandbox", sbx.v4, "--sandbox", sbx.v6)
    assert applied.returncode == 0, applied.stderr
    assert b.nft("list", "tables").stdout.strip() == ""  # nothing on B
    outcomes = {
        "B host -> A sandbox agent v4": a.connect(b.host, sbx.v4, AGENT_PORT),
        "B host -> A sandbox agent v6": a.connect(b.host, sbx.v6, AGENT_PORT),
        "B host -> A sandbox other port": a.connect(b.host, sbx.v4, OTHER_PORT),
        "B pod -> A sandbox agent v4": a.connect(b_pod.ns, sbx.v4, AGENT_PORT),
        "B pod -> A sandbox agent v6": a.connect(b_pod.ns, sbx.v6, AGENT_PORT),
        "B gateway (allowed) -> A sandbox agent": a.connect(
            b.host, sbx.v4, AGENT_PORT, source=GATEWAY
        ),
        "B host -> A non-sandbox pod's agent port": a.connect(b.host, other.v4, AGENT_PORT),
        "A host -> A sandbox agent": a.connect(a.host, sbx.v4, AGENT_PORT),
        "A pod -> A sandbox agent": a.connect(other.ns, sbx.v4, AGENT_PORT),
    }
    assert outcomes == {
        "B host -> A sandbox agent v4": "refused",
        "B host -> A sandbox agent v6": "refused",
        "B host -> A sandbox other port": "connected",
        "B pod -> A sandbox agent v4": "connected",
        "B pod -> A sandbox agent v6": "connected",
        "B gateway (allowed) -> A sandbox agent": "connected",
        "B host -> A non-sandbox pod's agent port": "connected",
        "A host -> A sandbox agent": "refused",
        "A pod -> A sandbox agent": "connected",
    }
    config = load_config(path)
    live = from_json(json.loads(a.nft("-j", "list", "table", "inet", "deathwatch").stdout))
    assert live == desired(config, [ip_address(sbx.v4), ip_address(sbx.v6)])
    # inbound off: A's output rule alone cannot stop B's host (B must run the agent)
    path.write_text(json.dumps({**json.loads(path.read_text()), "inbound": False}))
    assert firewall(a, "apply", "--config", str(path)).returncode == 0
    assert a.connect(b.host, sbx.v4, AGENT_PORT) == "connected"


# --- overlays: a host sending from its own tunnel address inside the pod range ------------


@pytest.fixture(params=["ipip", "vxlan"])
def overlay(request: pytest.FixtureRequest) -> Iterator[tuple[Node, Node, str]]:
    reason = netns_available()
    if reason:
        pytest.skip(reason)
    with two_nodes("routed", request.param) as (a, b):
        assert a.sandbox is not None and b.ordinary is not None
        a.listen(a.sandbox)
        for ns in (b.host, b.ordinary.ns):
            a.wait_reachable(ns, a.sandbox.v4, AGENT_PORT)
            if request.param == "vxlan":  # IPIP carries IPv4 only
                a.wait_reachable(ns, a.sandbox.v6, AGENT_PORT)
        yield a, b, request.param


def test_a_host_sending_from_its_tunnel_address_is_refused_by_the_sandboxs_node_alone(
    overlay: tuple[Node, Node, str], tmp_path: Path
) -> None:
    """Calico IPIP, flannel and Calico VXLAN, Cilium's tunnel: B's host reaches A's pods
    from an address of the pod pool. B runs no agent. A's rule must refuse it on its own,
    while B's pods and an allowed gateway still connect (issue #22)."""
    a, b, kind = overlay
    sbx, b_pod = a.sandbox, b.ordinary
    assert sbx is not None and b_pod is not None
    b4, b6 = tunnel_addresses(b, kind)
    path = tmp_path / "fw.yaml"
    config = {"podCIDRs": ["10.244.0.0/16", "fd00:10:244::/56"], "agentPorts": [AGENT_PORT],
              "allowedSources": [f"{GATEWAY}/32"]}  # fmt: skip
    path.write_text(json.dumps(config))
    sandboxes = ["--sandbox", sbx.v4, "--sandbox", sbx.v6]
    # the hole, as it was: a pod-range source passes the inbound rule (the host set emptied)
    assert firewall(a, "apply", "--config", str(path), *sandboxes).returncode == 0
    assert a.connect(b.host, sbx.v4, AGENT_PORT) == "connected", "no hole without the host set?"
    hosts = ["--host-address", b4, *(["--host-address", b6] if b6 else [])]
    applied = firewall(a, "apply", "--config", str(path), *sandboxes, *hosts)
    assert applied.returncode == 0, applied.stderr
    assert b.nft("list", "tables").stdout.strip() == ""  # nothing on B
    outcomes = {
        "B host (tunnel address) -> A sandbox agent v4": a.connect(b.host, sbx.v4, AGENT_PORT),
        "B host (node address) -> A sandbox agent v4": a.connect(
            b.host, sbx.v4, AGENT_PORT, source=NODE_B
        ),
        "B host -> A sandbox other port": a.connect(b.host, sbx.v4, OTHER_PORT),
        "B pod -> A sandbox agent v4": a.connect(b_pod.ns, sbx.v4, AGENT_PORT),
        "B gateway (allowed) -> A sandbox agent": a.connect(
            b.host, sbx.v4, AGENT_PORT, source=GATEWAY
        ),
        "A host -> A sandbox agent": a.connect(a.host, sbx.v4, AGENT_PORT),
    }
    want = {
        "B host (tunnel address) -> A sandbox agent v4": "refused",
        "B host (node address) -> A sandbox agent v4": "refused",
        "B host -> A sandbox other port": "connected",
        "B pod -> A sandbox agent v4": "connected",
        "B gateway (allowed) -> A sandbox agent": "connected",
        "A host -> A sandbox agent": "refused",
    }
    if b6:  # the VXLAN device carries IPv6 too
        outcomes["B host (tunnel address) -> A sandbox agent v6"] = a.connect(
            b.host, sbx.v6, AGENT_PORT
        )
        outcomes["B pod -> A sandbox agent v6"] = a.connect(b_pod.ns, sbx.v6, AGENT_PORT)
        want["B host (tunnel address) -> A sandbox agent v6"] = "refused"
        want["B pod -> A sandbox agent v6"] = "connected"
    assert outcomes == want
    live = from_json(json.loads(a.nft("-j", "list", "table", "inet", "deathwatch").stdout))
    assert live == desired(load_config(path), [ip_address(sbx.v4), ip_address(sbx.v6)],
                           [ip_address(h) for h in (b4, b6) if h])  # fmt: skip
    # allowedSources still win: the tunnel address allowed, B's host connects through it
    path.write_text(json.dumps({**config, "allowedSources": [f"{GATEWAY}/32", f"{b4}/32"]}))
    assert firewall(a, "apply", "--config", str(path), *sandboxes, *hosts).returncode == 0
    assert a.connect(b.host, sbx.v4, AGENT_PORT) == "connected"


# --- the agent measures its own output rule (selfcheck.py) ----------------------------------


def run_agent(n: Node, tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / "agent.log"
    agent = subprocess.Popen(
        ["ip", "netns", "exec", n.host, sys.executable, "-m", "deathwatch.firewall.cli", "agent",
         "--metrics-port", "0", *args],
        stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])},
    )  # fmt: skip
    return agent, log


def measured(log: Path) -> list[str]:
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [e["outcome"] for e in lines if e.get("event") == "the output rule measured"]


def test_the_agent_measures_its_rule_refusing_the_host_and_says_when_the_host_gets_through(
    host: Node, tmp_path: Path
) -> None:
    """With its table in the host's path, the agent's own connection from the host to a
    sandbox's agent port is refused, and by its rule (the counter moved): verified. With the
    table applied where the host's packets never pass (another network namespace, as a
    datapath that skips netfilter would leave it), the host gets through: bypassed."""
    sbx, other = host.sandbox, host.ordinary
    assert sbx is not None and other is not None
    cfg = config_file(tmp_path, host, [AGENT_PORT], resync=0.5)
    sandboxes = ["--sandbox", sbx.v4, "--sandbox", sbx.v6]
    agent, log = run_agent(host, tmp_path, "--config", str(cfg), *sandboxes)
    try:
        wait_for(lambda: measured(log), timeout=15, what=f"a self-check: {log.read_text()[-600:]}")
        assert measured(log)[0] == "verified"
        assert host.connect(host.host, sbx.v4, AGENT_PORT) == "refused"
    finally:
        agent.terminate()
        agent.wait(15)
    assert firewall(host, "cleanup").returncode == 0
    elsewhere = tmp_path / "nft-elsewhere"
    elsewhere.write_text(f'#!/bin/sh\nexec ip netns exec {other.ns} nft "$@"\n')
    elsewhere.chmod(0o755)
    agent, log = run_agent(host, tmp_path, "--config", str(cfg), *sandboxes,
                           "--nft", str(elsewhere))  # fmt: skip
    try:
        wait_for(lambda: measured(log), timeout=15, what=f"a self-check: {log.read_text()[-600:]}")
        assert measured(log)[0] == "bypassed"
        assert host.connect(host.host, sbx.v4, AGENT_PORT) == "connected"  # the hole, measured
        assert other_table(host, other.ns)  # the table is in force, where it does no good
    finally:
        agent.terminate()
        agent.wait(15)
        host.ns_exec(other.ns, "nft", "delete", "table", "inet", "deathwatch", check=False)


def other_table(n: Node, ns: str) -> bool:
    return n.ns_exec(ns, "nft", "list", "table", "inet", "deathwatch", check=False).returncode == 0


# --- audit mode: count, record and let through; then enforce (ADR 0027) -------------------


def audit_log(log: Path) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [e for e in lines if e.get("event") == "audit: would refuse"]


def test_audit_lets_through_and_counts_each_kind_then_enforce_refuses_at_once(
    nodes: tuple[Node, Node], tmp_path: Path
) -> None:
    """On A, in audit mode: A's host and B's host reach A's sandbox, each counted once by
    kind and logged once with its source, and the agent's own self-check is neither; pods pass
    uncounted. The config switched to enforce, the next resync replaces the table in one
    transaction: the same connections refused, the pods' still pass."""
    a, b = nodes
    sbx, b_pod = a.sandbox, b.ordinary
    assert sbx is not None and b_pod is not None
    cfg = tmp_path / "fw.yaml"
    base = {"podCIDRs": ["10.244.0.0/16", "fd00:10:244::/56"], "agentPorts": [AGENT_PORT],
            "resyncSeconds": 0.5}  # fmt: skip
    cfg.write_text(json.dumps({**base, "mode": "audit"}))
    agent, log = run_agent(a, tmp_path, "--config", str(cfg), "--sandbox", sbx.v4,
                           "--sandbox", sbx.v6)  # fmt: skip
    try:
        wait_for(lambda: measured(log), timeout=15, what=f"a self-check: {log.read_text()[-600:]}")
        assert measured(log)[-1] == "verified"  # its own rule saw the agent's marked connection
        outcomes = {
            "A host -> sandbox v4": a.connect(a.host, sbx.v4, AGENT_PORT),
            "A host -> sandbox v6": a.connect(a.host, sbx.v6, AGENT_PORT),
            "B host -> sandbox v4": a.connect(b.host, sbx.v4, AGENT_PORT),
            "B pod -> sandbox v4": a.connect(b_pod.ns, sbx.v4, AGENT_PORT),
        }
        assert set(outcomes.values()) == {"connected"}, outcomes  # audit refuses nothing
        table = from_json(json.loads(a.nft("-j", "list", "table", "inet", "deathwatch").stdout))
        from deathwatch.firewall.ruleset import audited, recorded

        assert {k: v for k, v in audited(table).items() if v} == {
            ("host", AGENT_PORT): 2, ("outside", AGENT_PORT): 1,
        }  # fmt: skip
        sources = {(chain, source) for chain, source, _, _ in recorded(table)}
        b_host_v4 = sorted({s for c, s in sources if c == "in"})
        assert len(b_host_v4) == 1 and {c for c, _ in sources} == {"in", "out"}, sources
        said: list[dict[str, object]] = wait_for(
            lambda: audit_log(log) if len(audit_log(log)) >= 3 else None, timeout=10,
            what=f"the sources logged: {log.read_text()[-800:]}",
        )  # fmt: skip
        assert sorted(str(e["kind"]) for e in said) == ["host", "host", "outside"], said
        # the switch: the next resync applies the enforcing table in one transaction
        cfg.write_text(json.dumps({**base, "mode": "enforce"}))
        wait_for(lambda: a.connect(a.host, sbx.v4, AGENT_PORT) == "refused", timeout=10,
                 what="the host refused once the config says enforce")  # fmt: skip
        assert a.connect(b.host, sbx.v4, AGENT_PORT) == "refused"
        assert a.connect(b_pod.ns, sbx.v4, AGENT_PORT) == "connected"
        live = from_json(json.loads(a.nft("-j", "list", "table", "inet", "deathwatch").stdout))
        assert live is not None and not [s for s in live.sets if s.name.startswith("audit")]
        events = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
        modes = [e["mode"] for e in events if e.get("event") == "firewall mode"]
        assert modes == ["audit", "enforce"], modes
        assert len(audit_log(log)) == 3  # each source said once; the self-checks never
    finally:
        agent.terminate()
        agent.wait(15)
