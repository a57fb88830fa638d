"""deathwatch where agent-sandbox is not installed, then is: it runs unchanged without the
CRDs, says so on /readyz, and picks them up once installed, with no restart. On its own
control plane (the CRDs must be absent at the start); the test plays agent-sandbox's
controller (a Sandbox, its pod with the controller's ownerReference and tracking label) and
the kubelet, so each step is exact."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deathwatch._kube.selection import TRACKING_LABEL
from hack.localcluster import agentsandbox, controlplane
from hack.localcluster.sandbox_script import pod_manifest
from tests.conftest import _binaries_or_skip
from tests.controller_env import Env, admin_api, prepare, ready_status
from tests.kube import fresh_namespace, wait_for

pytestmark = pytest.mark.apiserver
ROOT = Path(__file__).resolve().parents[2]
CORE = ("agents.x-k8s.io", "v1beta1")


@pytest.fixture(scope="module")
def cp() -> Iterator[controlplane.ControlPlane]:
    _binaries_or_skip()
    reason = agentsandbox.missing()
    if reason:
        pytest.skip(reason)
    with controlplane.running() as c:
        prepare(c)
        yield c


@pytest.fixture
def aenv(cp: controlplane.ControlPlane, tmp_path: Path) -> Iterator[Env]:
    api = admin_api(cp)
    fresh_namespace(api, "team-a")
    e = Env(cp, api, "team-a", tmp_path)
    e.bind_controller()
    yield e
    if e.controller is not None:
        print(e.controller.tail(60))
        e.controller.stop()


def sandbox_pod(e: Env, name: str, sandbox: dict[str, Any]) -> str:
    """The pod agent-sandbox's controller would make for `sandbox`."""
    s = e.script(name)
    body = pod_manifest(s)
    body["metadata"]["labels"] = {TRACKING_LABEL: "0f1e2d3c"}
    body["metadata"]["ownerReferences"] = [{
        "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "name": sandbox["metadata"]["name"],
        "uid": sandbox["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True,
    }]  # fmt: skip
    e.core.create_namespaced_pod(e.ns, body, _request_timeout=30)
    e.kubelet.status(e.ns, name, ready_status(s))
    return name


def test_runs_without_the_crds_and_picks_them_up_once_installed(aenv: Env) -> None:
    e = aenv
    e.start_controller()
    e.deathwatch(podSelector={}, sandboxes="agent-sandbox")
    controller = e.controller
    assert controller is not None
    wait_for(lambda: controller.get("/readyz")["details"]["agent_sandbox"] == "not installed",
             timeout=30, what="/readyz: agent-sandbox not installed")  # fmt: skip
    # a plain pod is not a Sandbox's: not judged by a DeathWatch of agent-sandbox's pods
    plain = e.script("plain")
    e.create(plain)
    e.kubelet.status(e.ns, "plain", ready_status(plain))

    agentsandbox.install_crds(e.cp)
    wait_for(lambda: controller.get("/readyz")["details"]["agent_sandbox"] == "watching",
             timeout=30, what="/readyz: agent-sandbox watched, with no restart")  # fmt: skip
    sandbox: dict[str, Any] = e.custom.create_namespaced_custom_object(*CORE, e.ns, "sandboxes", {
        "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "metadata": {"name": "box"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "agent", "image": "x"}]}},
                 "shutdownTime": "2099-01-01T00:00:00Z"},
    }, _request_timeout=30)  # fmt: skip
    sandbox_pod(e, "box", sandbox)
    alive = e.wait_state("box", "Alive")
    assert alive["status"]["sandbox"] == {"name": "box"}
    assert alive["metadata"]["labels"]["deathwatch.dev/sandbox"] == "box"
    assert e.sv("plain") is None  # its events came first in the same stream
    assert controller.proc is not None and controller.proc.poll() is None  # the same process

    # suspended, as agent-sandbox does it: the mode first, then its pod deleted
    e.custom.patch_namespaced_custom_object(*CORE, e.ns, "sandboxes", "box",
                                            {"spec": {"operatingMode": "Suspended"}}, _request_timeout=30)  # fmt: skip
    e.kubelet.request_deletion(e.ns, "box")
    gone = e.wait_state("box", "Gone")
    assert gone["status"]["cause"] == "Suspended"
    assert e.forbidden_calls() == 0  # get/list/watch on sandboxes is all it needed
