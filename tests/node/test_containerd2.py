"""The real node on containerd 2.x, built from its module (hack/build-peers.sh): the exits
observer reads the CRI's container events (GetContainerEvents, the stream the kubelet's
EventedPLEG reads), not containerd's own task events as on Debian's 1.6 (test_deaths.py).

One module, one node: an exit, a SIGKILL from the host and an OOM kill, each Dead with its
cause and code, observed by the node, the kubelet's report agreeing; then the same node with
no observer, the kubelet's reports judging a death alone."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deathwatch.firewall.runtime import CONTAINERD, CRI
from hack.localcluster import controlplane
from hack.localcluster.node import Node, containerd2_available
from tests.controller_env import Env
from tests.kube import wait_for
from tests.node.parts import NODE_EXITS, Exits, agent_pod, ctl, each_death_heard

pytestmark = pytest.mark.node
RESULTS: dict[str, Any] = {}


@pytest.fixture(scope="module")
def node(control_plane: controlplane.ControlPlane) -> Iterator[Node]:
    reason = containerd2_available()
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    n = Node(control_plane, runtime="containerd2").up()
    RESULTS["node_up_seconds"] = round(time.monotonic() - started, 1)
    try:
        yield n
    finally:
        n.down()
        assert n.leftovers() == []
        print("\ncontainerd 2 node measurements:", json.dumps(RESULTS, indent=1))


@pytest.mark.parametrize(("prefer", "stream"), [("auto", CONTAINERD), ("cri", CRI)])
def test_each_stream_hears_each_death_and_the_kubelet_agrees(
    nenv: Env, control_plane: controlplane.ControlPlane, exits_token: Path, tmp_path: Path,
    prefer: str, stream: str,
) -> None:  # fmt: skip
    e = nenv
    observer = Exits(control_plane, exits_token, tmp_path / "exits.log",
                     extra=("--runtime-stream", prefer)).start()  # fmt: skip
    try:
        wait_for(observer.reading, timeout=30, what="the observer reading containerd 2")
        said = next(json.loads(line) for line in observer.log.read_text().splitlines()
                    if "reading the runtime's exits" in line)  # fmt: skip
        assert (said["runtime"], said["stream"]) == ("containerd", stream), said
        assert said["version"].lstrip("v").startswith("2."), said
        e.start_controller(extra=NODE_EXITS)
        e.deathwatch()
        # containerd 2 removes a killed container's cgroup sooner: with the other lanes
        # beside this one (hack/lanes.py) a task exit was read 36 ms late, its cgroup gone,
        # and the exit held 20 ms for an OOM event (bench/node_latency.py measures the gain)
        each_death_heard(
            e,
            f"{prefer}-",
            exits=observer if stream == CONTAINERD else None,
            cgroup_may_be_gone=True,
        )
    finally:
        observer.stop()
        print(f"--- exits observer:\n{observer.log.read_text()[-3000:]}")
    RESULTS[f"{prefer}_stream_deaths"] = 3


def test_with_no_observer_the_kubelets_report_judges_the_death(nenv: Env) -> None:
    e = nenv
    e.start_controller(extra=NODE_EXITS)
    e.deathwatch()
    name = agent_pod(e, "kubelet-path")
    e.wait_state(name, "Alive", timeout=60)
    (ctl(e, name) / "exit").write_text("5")
    dead = e.wait_state(name, "Dead", timeout=30)["status"]
    assert (dead["cause"], dead["exitCode"]) == ("ContainerExited", 5), dead
    assert dead.get("observedBy", "kubelet") == "kubelet", dead
