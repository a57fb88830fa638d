"""The tracker's transitions in process: pods and DeathWatches in, SandboxVerdicts, Events and
DeathWatch status out through the real writer, against the fake API with a test clock. And a
property: a verdict status written and read back carries the engine on exactly as if the
controller had never restarted."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deathwatch._engine.engine import Track
from deathwatch._engine.fleet import Fleet
from deathwatch._engine.podview import read_pod
from deathwatch._engine.verdict import Cause, Evidence, State
from deathwatch._operator import documents
from deathwatch._operator.metrics import Metrics
from deathwatch._operator.resources import DW_PLURAL, SV_PLURAL, to_document
from deathwatch._operator.spec import Watch, read_deathwatch
from deathwatch._operator.tracker import Tracker
from deathwatch._operator.writer import Writer
from deathwatch._policies import AUTO, PolicySettings, default_registry
from tests.builders import T0, at, exec_probe, pod, running, terminated, waiting
from tests.fakeapi import FakeApi, FakeTimers
from tests.test_engine_properties import lifecycle, observation, probes

NS = "sandboxes"


def deathwatch_body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "deathwatch.dev/v1alpha1",
        "kind": "DeathWatch",
        "metadata": {
            "name": "sandboxes",
            "namespace": NS,
            "uid": "dw-uid",
            "generation": 1,
            "creationTimestamp": "2026-11-29T09:00:00Z",
        },
        "spec": {"podSelector": {"matchLabels": {"app": "sandbox"}}, "agentPorts": [49983], **spec},
    }


@dataclass
class Clock:
    now: datetime = T0

    def __call__(self) -> datetime:
        return self.now


@dataclass
class Harness:
    api: FakeApi
    clock: Clock
    tracker: Tracker
    writer: Writer
    watches: list[Watch] = field(default_factory=list)

    def deathwatch(self, **spec: Any) -> None:
        body = deathwatch_body(**spec)
        self.watches = [read_deathwatch(body, default_registry())]
        self.tracker.on_deathwatch(None, body)

    def pod(self, body: dict[str, Any], seconds: float, event: str | None = "MODIFIED") -> None:
        self.clock.now = at(seconds)
        self.tracker.on_pod(event, body, self.watches)

    async def settle(self) -> None:
        await self.tracker.publish()
        await asyncio.wait_for(self.writer.idle(), 5)

    def sv(self, name: str = "sbx-1") -> dict[str, Any] | None:
        return self.api.status(SV_PLURAL, NS, name)


@asynccontextmanager
async def harness(api: FakeApi | None = None) -> AsyncIterator[Harness]:
    api = api or FakeApi()
    api.objects.setdefault((DW_PLURAL, NS, "sandboxes"), deathwatch_body())
    clock, metrics = Clock(), Metrics()
    writer = Writer(api, metrics, schedule=FakeTimers(), clock=clock)
    tracker = Tracker(default_registry(), writer, metrics, clock=clock)
    writer.start()
    try:
        yield Harness(api, clock, tracker, writer)
    finally:
        await writer.stop()


async def test_a_sandbox_lifecycle_ending_in_death() -> None:
    async with harness() as h:
        h.deathwatch()
        h.pod(pod(ready=False, phase="Pending", containers=[waiting()]), 0)
        await h.settle()
        assert h.sv() is None  # never Ready: nothing written yet
        h.pod(pod(ready=True, ready_at=2), 2)
        await h.settle()
        alive = h.sv()
        assert alive is not None and (alive["state"], alive["policy"]) == ("Alive", "no-probe")
        obj = h.api.objects[(SV_PLURAL, NS, "sbx-1")]
        assert [(o["kind"], o["name"], o["uid"]) for o in obj["metadata"]["ownerReferences"]] == [
            ("DeathWatch", "sandboxes", "dw-uid")
        ]
        h.pod(pod(ready=False, ready_at=50, phase="Failed", containers=[terminated(code=7)]), 50)
        await h.settle()
    dead = h.sv()
    assert dead is not None
    assert (dead["state"], dead["cause"], dead["exitCode"], dead["container"]) == (
        "Dead",
        "ContainerExited",
        7,
        "agent",
    )
    (event,) = h.api.events.values()
    assert (event["reason"], event["involvedObject"]["uid"]) == ("SandboxDead", "uid-1")
    assert "exit code 7" in event["message"]
    dw = h.api.status(DW_PLURAL, NS, "sandboxes")
    assert dw is not None and (dw["tracked"], dw["dead"], dw["alive"]) == (1, 1, 0)
    assert dw["lastDeaths"][0]["exitCode"] == 7
    # the Event went out with the verdict that announces it: one round trip
    ops = [op for op, k in h.api.calls if k[2] in ("sbx-1", "sbx-1.uid-1.sandboxdead")]
    assert ops[:2] == ["create", "patch_status"]
    assert sorted(ops[2:]) == ["create_event", "patch_status"]
    # and the writer taking over (a restart, a new leader) says it again: a 409, not a second
    (lost,) = h.tracker.unannounced_deaths()
    assert lost.name == "sbx-1.uid-1.sandboxdead"
    h.clock.now = at(60 * 60)
    assert h.tracker.unannounced_deaths() == []  # past the Event TTL: no old death as news


async def test_deletion_is_gone_and_the_verdict_retires_after_its_retention() -> None:
    async with harness() as h:
        h.deathwatch(verdictRetention="30s")
        h.pod(pod(ready=True, ready_at=2), 2)
        h.pod(pod(ready=True, ready_at=2, deletion_at=10), 10)
        h.pod(pod(ready=True, ready_at=2, deletion_at=10), 11, event="DELETED")
        await h.settle()
        gone = h.sv()
        assert gone is not None and (gone["state"], gone["cause"]) == ("Gone", "Deleted")
        h.clock.now = at(11 + 29)
        assert h.tracker.retire() == 0
        h.clock.now = at(11 + 31)
        assert h.tracker.retire() == 1
        await h.settle()
    assert (SV_PLURAL, NS, "sbx-1") not in h.api.objects
    dw = h.api.status(DW_PLURAL, NS, "sandboxes")
    assert dw is not None and dw["tracked"] == 0


async def test_an_exec_probe_window_closes_on_the_clock_not_on_the_next_event() -> None:
    probe = exec_probe(period=1, threshold=1, timeout=1)  # W = 2 x 2 s = 4 s
    async with harness() as h:
        h.deathwatch()
        h.pod(pod(ready=True, ready_at=2, probe=probe), 2)
        h.pod(pod(ready=False, ready_at=10, probe=probe, containers=[running(ready=False)]), 10)
        await h.settle()
        suspect = h.sv()
        assert suspect is not None and suspect["state"] == "Suspect"
        assert h.tracker.fleet.next_deadline() == at(14)
        h.clock.now = at(13.9)
        h.tracker.expire()
        h.clock.now = at(14)
        h.tracker.expire()
        await h.settle()
    dead = h.sv()
    assert dead is not None and (dead["state"], dead["cause"]) == ("Dead", "Unresponsive")


async def test_an_invalid_deathwatch_says_which_field_on_its_status() -> None:
    async with harness() as h:
        h.tracker.on_deathwatch(None, deathwatch_body(podSelector={"matchLabels": {"a b": "x"}}))
        await h.settle()
    status = h.api.status(DW_PLURAL, NS, "sandboxes")
    assert status is not None
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.podSelector.matchLabels.a b" in ready["message"]


async def test_a_restarted_tracker_rewrites_nothing_it_already_published() -> None:
    body = pod(ready=True, ready_at=2)
    async with harness() as h:
        h.deathwatch()
        h.pod(body, 2)
        await h.settle()
    api = h.api
    writes = len(api.calls)
    async with harness(api) as h2:
        h2.deathwatch()
        listed = [o for k, o in api.objects.items() if k[0] == SV_PLURAL]
        assert h2.tracker.restore(copy.deepcopy(listed)) == 1
        h2.pod(body, 3)
        await h2.settle()
    new = api.calls[writes:]
    # only the DeathWatch status (its Ready condition carries over); no SandboxVerdict write
    assert [k[0] for _, k in new] == [DW_PLURAL] * len(new)


# --- a restart loses nothing: status -> track -> engine, as if never restarted ------------


def test_every_persisted_field_of_a_track_survives_the_round_trip() -> None:
    evidence = Evidence(
        state=State.DEAD,
        cause=Cause.OOM_KILLED,
        policy="exec-probe",
        pod_uid="uid-1",
        namespace=NS,
        name="sbx-1",
        container="agent",
        exit_code=137,
        reason="OOMKilled",
        restart_count=2,
        last_ready_at=at(5),
        ready_drop_at=at(40),
        declared_at=at(41.5),
    )
    track = Track(
        uid="uid-1",
        namespace=NS,
        name="sbx-1",
        policy="exec-probe",
        state=State.DEAD,
        cause=Cause.OOM_KILLED,
        ever_ready=True,
        ready=False,
        last_ready_at=at(5),
        ready_drop_at=at(40),
        deadline=None,
        restart_baseline={"agent": 2, "sidecar": 0},
        ready_drops=3,
        flaps=2,
        false_positive=True,
        probe_blocked=True,
        evidence=evidence,
        changed_at=at(41.5),
    )
    stored = json.loads(json.dumps(to_document(documents.verdict_status(track, "node-1"))))
    assert documents.track_from_status(NS, "sbx-1", stored) == track
    suspect = msgspec.structs.replace(
        track, state=State.SUSPECT, cause=Cause.NOT_READY, evidence=None, deadline=at(70.25),
        false_positive=False,
    )  # fmt: skip
    stored = json.loads(json.dumps(to_document(documents.verdict_status(suspect, None))))
    assert documents.track_from_status(NS, "sbx-1", stored) == suspect


SETTINGS = PolicySettings(agent_ports=frozenset({49983}))


def _outcome(fleet: Fleet) -> dict[str, Any]:
    track = fleet.get("uid-1")
    assert track is not None
    return {
        "state": track.state,
        "cause": track.cause,
        "evidence": track.evidence.as_dict() if track.evidence else None,
        "flaps": track.flaps,
        "ready_drops": track.ready_drops,
        "false_positive": track.false_positive,
        "deadline": track.deadline,
        "last_ready_at": track.last_ready_at,
        "ready_drop_at": track.ready_drop_at,
    }


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(observation, min_size=1, max_size=10),
    probes,
    st.integers(0, 10),
    st.sampled_from([AUTO, "container-state"]),
)
def test_a_restart_at_any_point_changes_no_verdict(
    observations: list[dict[str, Any]], probe: dict[str, Any] | None, split: int, policy: str
) -> None:
    steps = lifecycle(observations, probe)
    split = min(split, len(steps) - 1)
    whole, before = Fleet(default_registry()), Fleet(default_registry())
    for i, (t, body) in enumerate(steps):
        whole.observe(read_pod(body), at(t), policy, SETTINGS)
        if i <= split:
            before.observe(read_pod(body), at(t), policy, SETTINGS)
    track = before.get("uid-1")
    assert track is not None
    if not (track.ever_ready or track.probe_blocked):
        return  # never persisted: nothing to restore
    # the status as the API stores it: JSON, and back
    stored = json.loads(json.dumps(to_document(documents.verdict_status(track, "node-1"))))
    restored = documents.track_from_status(NS, "sbx-1", stored)
    assert restored is not None
    assert documents.verdict_status(restored, "node-1") == documents.verdict_status(track, "node-1")
    after = Fleet(default_registry())
    after.restore(restored, PolicySettings())
    for t, body in steps[split + 1 :]:
        after.observe(read_pod(body), at(t), policy, SETTINGS)
    assert _outcome(after) == _outcome(whole)
