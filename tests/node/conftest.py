"""The node lane's fixtures: each module brings its own `node` (a runtime); these sit on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from hack.localcluster import controlplane
from hack.localcluster.node import Node
from tests.controller_env import Env
from tests.kube import wait_for
from tests.node.parts import ROOT, Exits


@pytest.fixture
def nenv(env: Env, node: Node) -> Env:
    env.node = node  # type: ignore[attr-defined]
    return env


@pytest.fixture(scope="module")
def exits_token(control_plane: controlplane.ControlPlane, api: object,
                tmp_path_factory: pytest.TempPathFactory) -> Path:  # fmt: skip
    control_plane.kubectl_run("create", "namespace", "deathwatch-system", check=False)
    control_plane.kubectl_run("apply", "-f", str(ROOT / "manifests/base/rbac/firewall.yaml"))
    token = client.CoreV1Api(api).create_namespaced_service_account_token(
        "deathwatch-firewall", "deathwatch-system", {"spec": {"expirationSeconds": 7200}},
        _request_timeout=30,
    ).status.token  # fmt: skip
    path = tmp_path_factory.mktemp("exits") / "token"
    path.write_text(token)
    return path


@pytest.fixture
def heard(nenv: Env, control_plane: controlplane.ControlPlane, exits_token: Path,
          tmp_path: Path) -> Iterator[Exits]:  # fmt: skip
    """The node's exits observer, reading the runtime; the controller reads its Lease when
    started with NODE_EXITS."""
    observer = Exits(control_plane, exits_token, tmp_path / "exits.log").start()
    try:
        wait_for(observer.reading, timeout=30, what="the observer reading containerd's events")
        yield observer
    finally:
        observer.stop()
        print(f"--- exits observer:\n{observer.log.read_text()[-3000:]}")
