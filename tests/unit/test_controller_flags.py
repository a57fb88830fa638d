"""`deathwatch controller`'s flags made into its Config (`Config.from_args`): every refusal
one line naming the flag and the value, before anything starts; the accepted ones as given."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from deathwatch._cli import build_parser
from deathwatch._operator.process.config import BadFlag, Config
from deathwatch._operator.shards.slot_claims import Spec

GOOD_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.fixture
def kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    path = tmp_path / "kc"
    path.write_text(GOOD_KUBECONFIG)
    return path


def parse(kubeconfig: Path, *flags: str) -> argparse.Namespace:
    return build_parser(["controller"]).parse_args(
        ["controller", "--kubeconfig", str(kubeconfig), *flags]
    )


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--firewall-daemonset=ds"], "--firewall-daemonset: expected NS/NAME, got 'ds'"),
        (["--controller-id=-x"], "--controller-id: expected a label value"),
        (["--coverage-interval=0"], "--coverage-interval: expected seconds in [0.1, 300], got 0.0"),
        (["--release-check-interval=7200"],
         "--release-check-interval: expected seconds in [0.1, 3600], got 7200.0"),
        (["--watch-open-deadline=0.5"],
         "--watch-open-deadline: expected seconds in [1, 3600], got 0.5"),
        (["--identity="], "--identity: empty"),
        (["--shards=2", "--no-leader-elect"], "--shards above 1 needs --leader-elect"),
        (["--shards=2", "--shard=2"], "--shards/--shard/--shard-epoch: "),
        (["--metrics-address=nowhere"], "--metrics-address: "),
        (["--health-address=:99999"], "--health-address: "),
        (["--max-connections=0"], "--max-connections: "),
        (["--metrics-cert-dir=/nonexistent"], "--metrics-cert-dir: no such directory: /nonexistent"),
        (["--lease-duration=5", "--renew-deadline=10"],
         "--lease-duration/--renew-deadline/--retry-period: lease timings: need 0 < retry period"),
        (["--delivery-config=/nonexistent.yaml"], "--delivery-config: "),
    ],
)  # fmt: skip
def test_a_refused_flag_is_named_in_one_line(kubeconfig: Path, flags: list[str], said: str) -> None:
    with pytest.raises(BadFlag) as refused:
        Config.from_args(parse(kubeconfig, *flags))
    message = str(refused.value)
    assert message.startswith(said), message
    assert "\n" not in message and "Traceback" not in message


def test_an_unusable_kubeconfig_is_named_by_its_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_text("clusters: [\n")
    with pytest.raises(BadFlag, match=f"kubeconfig {bad}: not valid YAML"):
        Config.from_args(parse(bad))


def test_the_accepted_flags_are_the_config(kubeconfig: Path) -> None:
    config = Config.from_args(parse(
        kubeconfig, "-n", "a", "-n", "b", "-n", "a", "--metrics-address=127.0.0.1:9443",
        "--health-address=:9081", "--firewall-daemonset=dw/fw", "--controller-id=staging",
        "--shards=3", "--shard=1", "--shard-epoch=pod:dw/c-0", "--max-connections=64",
        "--lease-owner=c", "--node-exits=dw", "--no-agent-sandbox",
    ))  # fmt: skip
    assert config.namespaces == ("a", "b")
    assert config.metrics_address == ("127.0.0.1", 9443)
    assert config.health_address == ("0.0.0.0", 9081)
    assert (config.firewall_daemonset, config.controller_id) == ("dw/fw", "staging")
    assert config.shard == Spec(1, 3, 0) and config.shard_epoch_pod == ("dw", "c-0")
    assert config.port_limits.connections == 64
    assert (config.lease_owner, config.node_exits_namespace) == ("c", "dw")
    assert config.agent_sandbox is False and config.delivery is None
    assert config.kubeconfig == str(kubeconfig)
