"""The pod shapes a platform runs, on the real node (issue #51): native sidecars that crash
or exit, completions (alone, beside a sidecar, under a restart rule that does not match),
helpers that end, a restart rule that matches, an ephemeral container, exec'd processes
(an exec probe's), a deletion and an eviction through the Eviction API.

Each shape's fate is judged by two replicas (a leader and its hot standby) with the node's
exits heard (the node path) and without (the kubelet's reports alone). Every shape must end
in its one fate on both paths: the verdict the leader wrote, the one the standby holds (its
log), no Dead ever written for a live sandbox, and no replica that judged a fate otherwise
than the leader wrote it (deathwatch_standby_disagreements_total). The engine's side of the
same claim, over every interleaving: tests/unit/test_engine_anatomy.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hack.localcluster import agentpods, controlplane, images
from hack.localcluster.node import NODE_NAME, Node, node_available
from hack.localcluster.replicas import Replica, Replicas
from tests.controller_env import Env, VerdictRecorder
from tests.kube import wait_for
from tests.node.parts import EXEC_PROBE, NODE_EXITS

pytestmark = pytest.mark.node
RESULTS: dict[str, Any] = {}


@pytest.fixture(scope="module")
def node(control_plane: controlplane.ControlPlane) -> Iterator[Node]:
    reason = node_available()
    if reason:
        pytest.skip(reason)
    n = Node(control_plane).up()
    try:
        yield n
    finally:
        n.down()
        assert n.leftovers() == []
        print("\npod shapes:", json.dumps(RESULTS, indent=1))


def ctl(e: Env, pod: str, container: str) -> Path:
    """The host directory mounted at /ctl in one container of a pod."""
    path: Path = e.node.ctl(f"{e.ns}-{pod}") / container  # type: ignore[attr-defined]
    path.mkdir(parents=True, exist_ok=True)
    return path


def _agent(e: Env, pod: str, name: str) -> dict[str, Any]:
    """A test agent container steered through its own /ctl (a subdirectory of the pod's)."""
    ctl(e, pod, name)
    return {
        "name": name,
        "image": images.AGENT,
        "imagePullPolicy": "Never",
        "volumeMounts": [{"name": "ctl", "mountPath": "/ctl", "subPath": name}],
        "resources": {"limits": {"memory": "32Mi"}, "requests": {"memory": "8Mi", "cpu": "5m"}},
    }


def sandbox(
    e: Env,
    name: str,
    *,
    app: str = "sandbox",
    sidecars: tuple[str, ...] = (),
    helpers: tuple[str, ...] = (),
    restart_policy: str = "Never",
    rules: dict[str, Any] | None = None,
    probe: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body = agentpods.agent_pod(name, e.node.ctl(f"{e.ns}-{name}"), node=NODE_NAME,  # type: ignore[attr-defined]
                               probe=probe, labels={"app": app})  # fmt: skip
    spec = body["spec"]
    main = spec["containers"][0]
    main["volumeMounts"] = [{"name": "ctl", "mountPath": "/ctl", "subPath": "agent"}]
    ctl(e, name, "agent")
    main.update(rules or {})
    spec["restartPolicy"] = restart_policy
    spec["containers"] += [_agent(e, name, h) for h in helpers]
    if sidecars:
        spec["initContainers"] = [{**_agent(e, name, s), "restartPolicy": "Always"}
                                  for s in sidecars]  # fmt: skip
    return body


def pod_of(e: Env, name: str) -> Any:
    return e.core.read_namespaced_pod(name, e.ns, _request_timeout=10)


def status_of(pod: Any, container: str) -> Any:
    s = pod.status
    for c in [*(s.container_statuses or []), *(s.init_container_statuses or []),
              *(s.ephemeral_container_statuses or [])]:  # fmt: skip
        if c.name == container:
            return c
    return None


def restarted_and_ready(container: str) -> Callable[[Env, str], bool]:
    def check(e: Env, name: str) -> bool:
        pod = pod_of(e, name)
        c = status_of(pod, container)
        ready = any(x.type == "Ready" and x.status == "True" for x in pod.status.conditions or [])
        return c is not None and c.restart_count >= 1 and ready

    return check


def terminated(container: str) -> Callable[[Env, str], bool]:
    def check(e: Env, name: str) -> bool:
        c = status_of(pod_of(e, name), container)
        return c is not None and c.state.terminated is not None

    return check


def gone(e: Env, name: str) -> bool:
    return not e.core.list_namespaced_pod(e.ns, field_selector=f"metadata.name={name}",
                                          _request_timeout=10).items  # fmt: skip


def write(container: str, what: str, value: str) -> Callable[[Env, str], None]:
    def act(e: Env, name: str) -> None:
        (ctl(e, name, container) / what).write_text(value)

    return act


def debug_exits(e: Env, name: str) -> None:
    """`kubectl debug`'s way: an ephemeral container, which exits 3 at once."""
    e.core.patch_namespaced_pod_ephemeralcontainers(name, e.ns, {"spec": {"ephemeralContainers": [
        {"name": "debug", "image": images.AGENT, "imagePullPolicy": "Never",
         "command": ["sh", "-c", "exit 3"]}]}}, _request_timeout=30)  # fmt: skip


def delete(e: Env, name: str) -> None:
    e.core.delete_namespaced_pod(name, e.ns, grace_period_seconds=2, _request_timeout=30)


def evict(e: Env, name: str) -> None:
    body = {"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": e.ns}}  # fmt: skip
    e.core.create_namespaced_pod_eviction(name, e.ns, body, _request_timeout=30)


def succeeded(e: Env, name: str) -> bool:
    return bool(pod_of(e, name).status.phase == "Succeeded")


def nothing(e: Env, name: str) -> None:
    return None


def for_a_while(e: Env, name: str) -> bool:
    """An exec probe's processes exit every second: a few dozen of them, seen by the node."""
    pod = pod_of(e, name)
    started = status_of(pod, "agent").state.running.started_at
    return bool(time.time() - started.timestamp() > 8)


NEVER_BUT_42 = {"restartPolicy": "Never", "restartPolicyRules": [
    {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]}  # fmt: skip


@dataclass(frozen=True)
class Shape:
    name: str
    build: Callable[[Env, str], dict[str, Any]]
    act: Callable[[Env, str], None]
    settled: Callable[[Env, str], bool]  # the kubelet has reported what the act did
    fate: tuple[str, str | None]  # the one final verdict: state, cause
    container: str | None = None  # the dead container the verdict names
    restarts: int = 0  # at least this many sidecar restarts counted
    extra: dict[str, Any] = field(default_factory=dict)


SHAPES = [
    Shape("sidecar-crashes", lambda e, n: sandbox(e, n, sidecars=("proxy",)),
          write("proxy", "exit-once", "2"), restarted_and_ready("proxy"), ("Alive", None),
          restarts=1),
    Shape("sidecar-exits-0", lambda e, n: sandbox(e, n, sidecars=("proxy",)),
          write("proxy", "exit-once", "0"), restarted_and_ready("proxy"), ("Alive", None),
          restarts=1),
    Shape("vital-sidecar-crashes", lambda e, n: sandbox(e, n, app="vital", sidecars=("proxy",)),
          write("proxy", "exit-once", "2"), restarted_and_ready("proxy"),
          ("Dead", "ContainerExited"), container="proxy"),
    Shape("completes", sandbox, write("agent", "exit", "0"), succeeded,
          ("Gone", "Completed")),
    Shape("completes-beside-a-sidecar", lambda e, n: sandbox(e, n, sidecars=("proxy",)),
          write("agent", "exit", "0"), succeeded, ("Gone", "Completed")),
    Shape("completes-no-rule-matches", lambda e, n: sandbox(e, n, rules=NEVER_BUT_42),
          write("agent", "exit", "0"), succeeded, ("Gone", "Completed")),
    Shape("restart-rule-matches", lambda e, n: sandbox(e, n, rules=NEVER_BUT_42),
          write("agent", "exit-once", "42"), restarted_and_ready("agent"),
          ("Dead", "ContainerExited"), container="agent"),
    Shape("exits-3", sandbox, write("agent", "exit", "3"),
          terminated("agent"), ("Dead", "ContainerExited"), container="agent"),
    Shape("helper-completes", lambda e, n: sandbox(e, n, helpers=("tools",)),
          write("tools", "exit", "0"), terminated("tools"), ("Alive", None)),
    Shape("helper-fails", lambda e, n: sandbox(e, n, helpers=("tools",)),
          write("tools", "exit", "1"), terminated("tools"), ("Dead", "ContainerExited"),
          container="tools"),
    Shape("named-sandbox-helper-fails", lambda e, n: sandbox(e, n, app="named", helpers=("tools",)),
          write("tools", "exit", "1"), terminated("tools"), ("Alive", None)),
    Shape("ephemeral-exits", sandbox, debug_exits, terminated("debug"),
          ("Alive", None)),
    Shape("exec-probed", lambda e, n: sandbox(e, n, probe=EXEC_PROBE), nothing, for_a_while,
          ("Alive", None)),
    Shape("deleted", sandbox, delete, gone, ("Gone", "Deleted")),
    Shape("evicted", sandbox, evict, gone, ("Dead", "Drained")),
]  # fmt: skip
DEATHWATCHES = {
    "sandboxes": {},  # app=sandbox: every regular container is the sandbox, no sidecar vital
    "vital": {"podSelector": {"matchLabels": {"app": "vital"}},
              "containers": {"vitalSidecars": ["proxy"]}},
    "named": {"podSelector": {"matchLabels": {"app": "named"}},
              "containers": {"sandbox": ["agent"]}},
}  # fmt: skip


def replica_fates(replica: Replica) -> dict[str, tuple[str, str | None]]:
    """Each pod's verdict as this replica last held it: its own judgements ("verdict") and
    the written ones it took ("taken"), from its log."""
    held: dict[str, tuple[str, str | None]] = {}
    for line in replica.process.log.read_text().splitlines():
        try:
            said = json.loads(line)
        except ValueError:
            continue
        if said.get("event") == "verdict":
            held[said["pod"]] = (said["to"], said.get("cause"))
        elif str(said.get("event", "")).startswith("a final verdict the API holds"):
            held[said["pod"]] = (said["state"], said.get("cause"))
    return held


@pytest.mark.parametrize("node_path", [False, True], ids=["kubelet", "node"])
def test_every_shape_has_one_fate_on_both_paths_and_both_replicas(
    nenv: Env, request: pytest.FixtureRequest, node_path: bool
) -> None:
    e = nenv
    if node_path:
        request.getfixturevalue("heard")  # the exits observer, reading the runtime
    replicas = Replicas(e.cp, e.api, e.ns, e.tmp)
    recorder = VerdictRecorder(e.api, e.ns).start()
    try:
        for name, spec in DEATHWATCHES.items():
            e.deathwatch(name, **spec)
        for identity in ("shapes-a", "shapes-b"):
            replicas.start(identity, tuple(NODE_EXITS if node_path else ()))
        leader = replicas.wait_leader()
        standby = next(r for r in replicas.members.values() if r is not leader)
        for shape in SHAPES:
            e.core.create_namespaced_pod(e.ns, shape.build(e, shape.name), _request_timeout=30)
        for shape in SHAPES:
            e.wait_state(shape.name, "Alive", timeout=90)
        started = time.monotonic()
        for shape in SHAPES:
            shape.act(e, shape.name)
        for shape in SHAPES:
            wait_for(lambda s=shape: s.settled(e, s.name), timeout=90,  # type: ignore[misc]
                     what=f"{shape.name}: the kubelet's report")  # fmt: skip
            if shape.fate[0] != "Alive":
                e.wait_state(shape.name, shape.fate[0], timeout=60)
        # a pod made after every report: once it is Alive, both replicas have judged them
        # (one ordered pod stream each) and the leader's writes have come back to the standby
        e.core.create_namespaced_pod(e.ns, sandbox(e, "marker"), _request_timeout=30)
        e.wait_state("marker", "Alive", timeout=60)
        for shape in SHAPES:
            if shape.restarts:
                wait_for(lambda s=shape: ((e.sv(s.name) or {}).get("status", {})  # type: ignore[misc]
                                          .get("sidecarRestarts", 0) >= s.restarts),
                         timeout=30, what=f"{shape.name}: its sidecar's restart counted")  # fmt: skip
        wait_for(lambda: {s.name: replica_fates(standby).get(s.name) for s in SHAPES}
                 == {s.name: replica_fates(leader).get(s.name) for s in SHAPES}, timeout=30,
                 what="the standby holding the leader's verdicts")  # fmt: skip
        written = {}
        for shape in SHAPES:
            status = (e.sv(shape.name) or {}).get("status", {})
            written[shape.name] = (status.get("state"), status.get("cause"))
            if shape.container is not None:
                assert status.get("container") == shape.container, (shape.name, status)
        fates = {s.name: s.fate for s in SHAPES}
        RESULTS["node" if node_path else "kubelet"] = {
            "seconds": round(time.monotonic() - started, 1),
            "written": {k: "/".join(str(x) for x in v) for k, v in written.items()},
        }
        assert written == fates
        assert {s.name: replica_fates(leader).get(s.name) for s in SHAPES} == fates
        assert {s.name: replica_fates(standby).get(s.name) for s in SHAPES} == fates
        assert recorder.taken_back() == []
        for shape in SHAPES:
            if shape.fate[0] == "Alive":  # never once said Dead
                states = [state for _, state in recorder.seen.get(shape.name, [])]
                assert "Dead" not in states, (shape.name, states)
        for r in (leader, standby):
            assert r.process.metric("deathwatch_standby_disagreements_total") == 0, r.identity
        if node_path:  # the node heard the deaths the shapes meant
            for shape in SHAPES:
                if shape.fate[0] == "Dead" and shape.name != "evicted":
                    status = (e.sv(shape.name) or {})["status"]
                    assert status.get("observedBy") == "node", (shape.name, status)
    finally:
        recorder.stop()
        for r in replicas.members.values():
            print(f"--- {r.identity}\n{r.process.tail(30)}")
        replicas.stop_all()
