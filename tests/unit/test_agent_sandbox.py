"""agent-sandbox's Sandboxes as deathwatch reads them (agent_sandboxes.py), which pods a
DeathWatch of `sandboxes: agent-sandbox` selects, and what a deletion means to the engine:
pure logic, no API (tests/node/test_agent_sandbox.py runs the real thing on the real node)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from deathwatch._api.agent_sandbox import read
from deathwatch._api.resources import SANDBOX_LABEL, SandboxRef
from deathwatch._api.rules import read_deathwatch
from deathwatch._engine.contract import PolicySettings
from deathwatch._engine.podview import read_pod
from deathwatch._engine.verdict import Cause, State
from deathwatch._kube.selection import TRACKING_LABEL
from deathwatch._operator.memory.agent_sandboxes import AgentSandboxes
from deathwatch._operator.reporting.sandbox_verdicts import verdict_object
from deathwatch._policies import default_registry
from tests.builders import at, pod, running, ts
from tests.engine_driver import Pods


def sandbox(name: str = "box", uid: str = "s-1", owner: tuple[str, str] | None = None,
            mode: str | None = None, shutdown: float | None = None, deleting: bool = False,
            template: str | None = None) -> bytes:  # fmt: skip
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "uid": uid, "resourceVersion": "7"}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                                    "kind": owner[0], "name": owner[1], "uid": "o", "controller": True}]  # fmt: skip
    if template:
        meta["annotations"] = {"agents.x-k8s.io/sandbox-template-ref": template}
    if deleting:
        meta["deletionTimestamp"] = ts(50)
    spec: dict[str, Any] = {"podTemplate": {"spec": {}}}
    if mode:
        spec["operatingMode"] = mode
    if shutdown is not None:
        spec["shutdownTime"] = ts(shutdown)
    return json.dumps({"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                       "metadata": meta, "spec": spec}).encode()  # fmt: skip


def known(*objs: bytes) -> AgentSandboxes:
    store = AgentSandboxes()
    for raw in objs:
        store.update(read(raw)[0])
    return store


@pytest.mark.parametrize(
    ("obj", "cause"),
    [
        (sandbox(mode="Suspended"), Cause.SUSPENDED),
        (sandbox(shutdown=100), Cause.EXPIRED),  # asked at 100: due
        (sandbox(shutdown=100.9), Cause.EXPIRED),  # within the second shutdownTime is kept in
        (sandbox(shutdown=200), Cause.DELETED),  # not due: someone deleted the pod
        (sandbox(deleting=True, mode="Suspended"), Cause.DELETED),  # deleted wins
        (sandbox(), Cause.DELETED),  # running: its pod deleted under it
    ],
)
def test_what_a_pods_deletion_means(obj: bytes, cause: Cause) -> None:
    assert known(obj).fate("team-a", "box", at(100)) is cause


def test_a_sandbox_never_seen_or_gone_is_deleted() -> None:
    store = known(sandbox(mode="Suspended"))
    assert store.fate("team-a", "other", at(100)) is Cause.DELETED
    store.remove("team-a", "box")
    assert store.fate("team-a", "box", at(100)) is Cause.DELETED


def test_a_claim_adopting_a_warm_pool_sandbox_is_a_change_and_the_pool_is_kept() -> None:
    store = AgentSandboxes()
    warm = read(sandbox(owner=("SandboxWarmPool", "warm"), template="agent"))[0]
    assert store.update(warm)
    assert store.ref("team-a", "box") == SandboxRef(name="box", template="agent", warm_pool="warm")
    assert not store.update(warm)  # the same again: nothing to say
    claimed = read(sandbox(owner=("SandboxClaim", "alice"), template="agent"))[0]
    assert store.update(claimed)
    assert store.ref("team-a", "box") == SandboxRef(
        name="box", claim="alice", template="agent", warm_pool="warm"
    )
    # deleted, its last verdicts still name everything; a new Sandbox of the name does not
    store.remove("team-a", "box")
    assert store.ref("team-a", "box").claim == "alice"
    assert store.update(read(sandbox(uid="s-2"))[0])
    assert store.ref("team-a", "box") == SandboxRef(name="box")


def test_the_pool_is_remembered_from_a_verdict_after_a_restart() -> None:
    store = known(sandbox(owner=("SandboxClaim", "alice")))
    store.remember("team-a", SandboxRef(name="box", claim="alice", warm_pool="warm"))
    assert store.ref("team-a", "box").warm_pool == "warm"


def test_a_relisting_marks_the_ones_it_did_not_show_deleted() -> None:
    store = known(
        sandbox(name="a", uid="1", mode="Suspended"), sandbox(name="b", uid="2", mode="Suspended")
    )
    store.relisted("team-a", [("team-a", "a")])
    assert store.fate("team-a", "a", at(0)) is Cause.SUSPENDED
    assert store.fate("team-a", "b", at(0)) is Cause.DELETED


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"{", "truncated"),
        (json.dumps({"metadata": {"name": "x"}}).encode(), "metadata.uid"),
        (json.dumps({"metadata": {"name": "x", "uid": "u"}, "spec": {"shutdownTime": 7}}).encode(),
         "shutdownTime"),
    ],
)  # fmt: skip
def test_a_bad_sandbox_is_refused_with_the_field(raw: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        read(raw)


def owned_pod(labels: dict[str, str] | None = None, kind: str = "Sandbox",
              group: str = "agents.x-k8s.io/v1beta1", **kw: Any) -> dict[str, Any]:  # fmt: skip
    obj = pod(labels=labels if labels is not None else {TRACKING_LABEL: "abc"}, **kw)
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": group, "kind": kind, "name": "box", "uid": "s-1", "controller": True}
    ]
    return obj


def test_a_deathwatch_of_agent_sandbox_selects_only_its_pods() -> None:
    watch = read_deathwatch(
        {"metadata": {"name": "w", "namespace": "team-a"}, "spec": {"sandboxes": "agent-sandbox"}},
        default_registry(),
    )
    assert watch.selects(read_pod(owned_pod()))
    assert read_pod(owned_pod()).sandbox == "box"
    assert not watch.selects(read_pod(pod()))  # no owner
    assert not watch.selects(read_pod(owned_pod(labels={})))  # owned, but not its tracking label
    assert not watch.selects(read_pod(owned_pod(kind="ReplicaSet", group="apps/v1")))
    narrowed = read_deathwatch(
        {"metadata": {"name": "w"}, "spec": {"sandboxes": "agent-sandbox",
                                              "podSelector": {"matchLabels": {"tier": "gpu"}}}},
        default_registry(),
    )  # fmt: skip
    assert not narrowed.selects(read_pod(owned_pod()))
    assert narrowed.selects(read_pod(owned_pod(labels={TRACKING_LABEL: "a", "tier": "gpu"})))


def test_an_unknown_sandboxes_value_is_named() -> None:
    from deathwatch._api.rules import SpecError

    with pytest.raises(SpecError, match=r"spec\.sandboxes"):
        read_deathwatch(
            {"metadata": {"name": "w"}, "spec": {"sandboxes": "kata"}}, default_registry()
        )


@pytest.mark.parametrize("deletion", [Cause.SUSPENDED, Cause.EXPIRED, Cause.DELETED])
def test_the_engine_says_what_the_owner_says_a_deletion_was(deletion: Cause) -> None:
    fleet, settings = Pods(default_registry()), PolicySettings()
    fleet.observe(read_pod(pod(containers=[running()])), at(5), "auto", settings)
    step = fleet.observe(read_pod(pod(containers=[running()], deletion_at=10)), at(10), "auto",
                         settings, deletion)  # fmt: skip
    assert (step.track.state, step.track.cause) == (State.GONE, deletion)
    assert step.track.evidence is not None and step.track.evidence.cause is deletion


def test_a_death_before_the_deletion_is_still_dead() -> None:
    fleet, settings = Pods(default_registry()), PolicySettings()
    fleet.observe(read_pod(pod(containers=[running()])), at(5), "auto", settings)
    dropped = pod(ready=False, ready_at=8, containers=[running()], deletion_at=10)
    step = fleet.remove("uid-1", at(10) + timedelta(seconds=1), read_pod(dropped), Cause.SUSPENDED)
    assert step is not None and step.track.state is State.DEAD


def test_a_long_sandbox_name_is_in_status_but_not_a_label() -> None:
    watch = read_deathwatch({"metadata": {"name": "w", "uid": "u"}, "spec": {}}, default_registry())
    short = verdict_object("team-a", "p", watch, "uid", SandboxRef(name="box"))
    assert short["metadata"]["labels"][SANDBOX_LABEL] == "box"
    long = verdict_object("team-a", "p", watch, "uid", SandboxRef(name="b" * 100))
    assert SANDBOX_LABEL not in long["metadata"]["labels"]
