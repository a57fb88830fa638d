"""The controller's core in process: pods and DeathWatches in, SandboxVerdicts, Events and
DeathWatch status out through the real writer, against the fake API with a test clock. The
adoption race of issue #23, interleaved deterministically. Properties: a verdict status
written and read back carries the engine on exactly as if the controller had never
restarted; a DeathWatch's counts kept by difference equal a recount."""

from __future__ import annotations

import asyncio
import copy
import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from deathwatch._api.objects import (
    DeathWatchObject,
    EventType,
    EvictionNotice,
    Undecodable,
    VerdictObject,
    decode_deathwatch,
)
from deathwatch._api.resources import DW_PLURAL, SV_PLURAL, to_document
from deathwatch._engine import memory
from deathwatch._engine.engine import Track
from deathwatch._engine.nodeexit import NodeExit
from deathwatch._engine.podview import read_pod
from deathwatch._engine.verdict import Cause, Evidence, Observer, State
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.memory.core import Core
from deathwatch._operator.memory.deathwatches import DeathWatches, Revised
from deathwatch._operator.passes import (
    publishing,
)
from deathwatch._operator.passes.wiring import Passes
from deathwatch._operator.reporting import sandbox_verdicts
from deathwatch._operator.sources.receivers import DeathWatchReceiver, Malformed
from deathwatch._operator.writing.writer import Writer
from deathwatch._policies import AUTO, PolicySettings, default_registry
from tests.builders import T0, at, exec_probe, pod, running, terminated, waiting
from tests.engine_driver import Pods
from tests.examples import examples
from tests.fakeapi import FakeApi, FakeTimers
from tests.lifecycles import lifecycle, observation, probes
from tests.writer_driver import lead, standing_by, the_only_writer, workers

NS = "sandboxes"


def deathwatch_body(generation: int = 1, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "deathwatch.dev/v1alpha1",
        "kind": "DeathWatch",
        "metadata": {
            "name": "sandboxes",
            "namespace": NS,
            "uid": "dw-uid",
            "generation": generation,
            "resourceVersion": "1",
            "creationTimestamp": "2026-11-29T09:00:00Z",
        },
        "spec": {"podSelector": {"matchLabels": {"app": "sandbox"}}, "agentPorts": [49983], **spec},
    }


def as_deathwatch(body: dict[str, Any]) -> DeathWatchObject:
    """A DeathWatch as the controller's reflector hands it over: decoded from its bytes."""
    return decode_deathwatch(msgspec.json.encode(body))


@dataclass
class Clock:
    now: datetime = T0

    def __call__(self) -> datetime:
        return self.now


LIVENESS = publishing.Liveness(fresh=lambda: None, stale_after=90.0)


def core(writer: Writer, clock: Clock, metrics: Metrics) -> Passes:
    """The controller's passes on a fresh memory, as the app wires them."""
    registry = default_registry()
    return Passes(Core(DeathWatches(registry)), writer=writer, metrics=metrics,
                  policies=registry, clock=clock)  # fmt: skip


@dataclass
class Harness:
    api: FakeApi
    clock: Clock
    controller: Passes
    writer: Writer

    def deathwatch(self, **spec: Any) -> None:
        self.controller.owners.on_deathwatch(
            EventType.LISTED, as_deathwatch(deathwatch_body(**spec))
        )

    def pod(
        self, body: dict[str, Any], seconds: float, event: EventType = EventType.MODIFIED
    ) -> None:
        self.clock.now = at(seconds)
        self.controller.pods.on_pod(event, read_pod(body))

    async def settle(self) -> None:
        self.controller.status.publish(LIVENESS)
        await asyncio.wait_for(self.writer.idle(), 5)

    def sv(self, name: str = "sbx-1") -> dict[str, Any] | None:
        return self.api.status(SV_PLURAL, NS, name)


@asynccontextmanager
async def harness(api: FakeApi | None = None) -> AsyncIterator[Harness]:
    api = api or FakeApi()
    api.objects.setdefault((DW_PLURAL, NS, "sandboxes"), deathwatch_body())
    clock, metrics = Clock(), Metrics()
    writer = Writer(
        api, metrics, schedule=FakeTimers(), clock=clock, leadership=the_only_writer(metrics)
    )
    async with workers(writer):
        yield Harness(api, clock, core(writer, clock, metrics), writer)


async def test_a_sandbox_lifecycle_ending_in_death() -> None:
    async with harness() as h:
        h.deathwatch()
        h.pod(pod(ready=False, phase="Pending", containers=[waiting()]), 0)
        await h.settle()
        assert h.sv() is None  # never Ready: nothing written yet
        h.pod(pod(ready=True, ready_at=2, node="node-1"), 2)
        await h.settle()
        alive = h.sv()
        assert alive is not None and (alive["state"], alive["policy"]) == ("Alive", "no-probe")
        obj = h.api.objects[(SV_PLURAL, NS, "sbx-1")]
        assert [(o["kind"], o["name"], o["uid"]) for o in obj["metadata"]["ownerReferences"]] == [
            ("DeathWatch", "sandboxes", "dw-uid")
        ]
        # the node's death counters exist at 0 before any death: increase() skips a series'
        # first sample, so a series born with the deaths would never fire an alert
        deaths = h.controller.metrics.registry.get_sample_value
        labels = {"node": "node-1", "cause": "ContainerExited", "origin": "Workload"}
        assert deaths("deathwatch_sandbox_deaths_total", labels) == 0
        h.pod(pod(ready=False, ready_at=50, phase="Failed", containers=[terminated(code=7)],
                  node="node-1"), 50)  # fmt: skip
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
    assert deaths("deathwatch_sandbox_deaths_total", labels) == 1
    dw = h.api.status(DW_PLURAL, NS, "sandboxes")
    assert dw is not None and (dw["tracked"], dw["dead"], dw["alive"]) == (1, 1, 0)
    assert dw["lastDeaths"][0]["exitCode"] == 7
    # the Event went out with the verdict that announces it: one round trip
    ops = [op for op, k in h.api.calls if k[2] in ("sbx-1", "sbx-1.uid-1.sandboxdead")]
    assert ops[:2] == ["create", "replace_status"]
    # the death is one status write and its Event: no label write of its own (#43; the
    # origin is a selectable field, `--field-selector status.origin=Workload`)
    assert sorted(ops[2:]) == ["create_event", "replace_status"]
    assert "deathwatch.dev/origin" not in (h.api.labels(SV_PLURAL, NS, "sbx-1") or {})
    assert (dead["origin"], dw["deaths"]["workload"]) == ("Workload", 1)
    # and the writer taking over (a restart, a new leader) says it again: a 409, not a second
    (lost,) = h.controller.status.unannounced_deaths()
    assert lost.name == "sbx-1.uid-1.sandboxdead"
    h.clock.now = at(60 * 60)
    assert (
        h.controller.status.unannounced_deaths() == []
    )  # past the Event TTL: no old death as news


async def test_an_exit_heard_on_the_node_is_dead_at_once_and_a_kubelet_that_disagrees_is_said(
) -> None:  # fmt: skip
    """ADR 0028: the exit, with the pod as read, makes the verdict (one status write); the
    kubelet's report agreeing costs nothing; one disagreeing is counted and announced, and
    the verdict stands."""
    cid = "containerd://" + "a" * 64
    async with harness() as h:
        h.deathwatch()
        live = pod(ready=True, ready_at=2, node="node-1", containers=[running(cid=cid)])
        h.pod(live, 2)
        await h.settle()
        h.clock.now = at(50.2)
        heard = NodeExit(cid, 3, False, at(50.1), "node-1")
        assert h.controller.node_exits.exited(heard, read_pod(live), "9") == "judged"
        await h.settle()
        dead = h.sv()
        assert dead is not None
        assert (dead["state"], dead["cause"], dead["exitCode"], dead["observedBy"],
                dead["containerID"]) == ("Dead", "ContainerExited", 3, "node", cid)  # fmt: skip
        assert "heard on its node" in next(iter(h.api.events.values()))["message"]
        # the same exit again (the Lease read again after a restart): the verdict is final
        assert h.controller.node_exits.exited(heard, read_pod(live), "9") == "kubelet"
        writes = len(h.api.writes)
        report = pod(ready=False, ready_at=51, node="node-1",
                     containers=[terminated(code=3, finished=50, cid=cid)])  # fmt: skip
        h.pod(report, 51)
        await h.settle()
        assert len(h.api.writes) == writes  # the kubelet agrees: nothing to write
        other = pod(ready=False, ready_at=51, node="node-1",
                    containers=[terminated(code=4, finished=50, cid=cid)])  # fmt: skip
        h.pod(other, 52)
        await h.settle()
    disputed = h.sv()
    assert disputed is not None and disputed["state"] == "Dead"
    assert disputed["disputed"] == "exit code: the node saw 3, the kubelet reports 4"
    reasons = sorted(e["reason"] for e in h.api.events.values())
    assert reasons == ["NodeExitDisputed", "SandboxDead"]
    sample = h.controller.metrics.registry.get_sample_value
    assert sample("deathwatch_node_exit_disputes_total", {"policy": "no-probe"}) == 1
    # an exit of a pod no record tracks, or of an instance its status does not name
    unknown = pod(uid="uid-2", name="sbx-2", containers=[running(cid=cid)])
    assert h.controller.node_exits.exited(heard, read_pod(unknown), "3") == "not-watched"


async def test_deletion_is_gone_and_the_verdict_retires_after_its_retention() -> None:
    async with harness() as h:
        h.deathwatch(verdictRetention="30s")
        h.pod(pod(ready=True, ready_at=2), 2)
        h.pod(pod(ready=True, ready_at=2, deletion_at=10), 10)
        h.pod(pod(ready=True, ready_at=2, deletion_at=10), 11, event=EventType.DELETED)
        await h.settle()
        gone = h.sv()
        assert gone is not None and (gone["state"], gone["cause"]) == ("Gone", "Deleted")
        h.clock.now = at(11 + 29)
        assert h.controller.retention.retire() == 0
        h.clock.now = at(11 + 31)
        assert h.controller.retention.retire() == 1
        await h.settle()
    assert (SV_PLURAL, NS, "sbx-1") not in h.api.objects
    dw = h.api.status(DW_PLURAL, NS, "sandboxes")
    assert dw is not None and dw["tracked"] == 0


async def test_a_dead_sandboxs_deletion_starts_its_retention_clock_on_the_verdict() -> None:
    """The pod of a Dead verdict deleted: nothing the engine says changes, but the verdict
    must say when (a restart resumes the retention clock from it)."""
    async with harness() as h:
        h.deathwatch()
        h.pod(pod(), 2)
        h.pod(pod(ready=False, ready_at=5, phase="Failed", containers=[terminated(finished=5)]), 5)
        await h.settle()
        dead = h.sv()
        assert dead is not None and "podDeletedAt" not in dead
        h.pod(pod(ready=False, ready_at=5, phase="Failed", containers=[terminated(finished=5)],
                  deletion_at=8), 9, event=EventType.DELETED)  # fmt: skip
        await h.settle()
    dead = h.sv()
    assert dead is not None and (dead["state"], dead["podDeletedAt"]) == (
        "Dead",
        "2026-11-29T10:00:09Z",
    )


async def test_an_exec_probe_window_closes_on_the_clock_not_on_the_next_event() -> None:
    probe = exec_probe(period=1, threshold=1, timeout=1)  # W = 2 x 2 s = 4 s
    async with harness() as h:
        h.deathwatch()
        h.pod(pod(ready=True, ready_at=2, probe=probe), 2)
        h.pod(pod(ready=False, ready_at=10, probe=probe, containers=[running(ready=False)]), 10)
        await h.settle()
        suspect = h.sv()
        assert suspect is not None and suspect["state"] == "Suspect"
        assert h.controller.pods.next_deadline() == at(14)
        h.clock.now = at(13.9)
        h.controller.pods.expire()
        h.clock.now = at(14)
        h.controller.pods.expire()
        await h.settle()
    dead = h.sv()
    assert dead is not None and (dead["state"], dead["cause"]) == ("Dead", "Unresponsive")


async def test_an_invalid_deathwatch_says_which_field_on_its_status() -> None:
    async with harness() as h:
        h.controller.owners.on_deathwatch(
            EventType.LISTED,
            as_deathwatch(deathwatch_body(podSelector={"matchLabels": {"a b": "x"}})),
        )
        await h.settle()
    status = h.api.status(DW_PLURAL, NS, "sandboxes")
    assert status is not None
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.podSelector.matchLabels.a b" in ready["message"]


async def test_a_restarted_controller_rewrites_nothing_it_already_published() -> None:
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
        assert [h2.controller.verdicts.restore(as_verdict(copy.deepcopy(o))) for o in listed] == [
            True
        ]
        h2.pod(body, 3)
        await h2.settle()
    new = api.calls[writes:]
    # only the DeathWatch status (its Ready condition carries over); no SandboxVerdict write
    assert [k[0] for _, k in new] == [DW_PLURAL] * len(new)


@pytest.mark.parametrize(
    ("ending", "expected"),
    [("deleted", ("Gone", "Deleted")), ("exited", ("Dead", "ContainerExited"))],
)
async def test_a_late_joiner_takes_the_verdict_of_a_deletion_it_did_not_see(
    ending: str, expected: tuple[str, str]
) -> None:
    """Issue #40: a standby that lists the verdicts (Alive), then the pods (this one already
    deleted), finds it gone with nobody watching: Gone (Unobserved). The leader saw how it
    ended and wrote it; once the standby's watch shows that, it holds the same verdict, and
    taking over writes nothing over it."""
    body = pod(ready=True, ready_at=2)
    async with harness() as leader:
        leader.deathwatch()
        leader.pod(body, 2)
        await leader.settle()
        alive = [copy.deepcopy(o) for k, o in leader.api.objects.items() if k[0] == SV_PLURAL]
        if ending == "exited":
            leader.pod(pod(ready=False, ready_at=5, phase="Failed",
                           containers=[terminated(finished=5)]), 5)  # fmt: skip
        leader.pod(pod(deletion_at=6), 6, event=EventType.DELETED)
        await leader.settle()
    api = leader.api
    final = api.objects[(SV_PLURAL, NS, "sbx-1")]
    assert (final["status"]["state"], final["status"]["cause"]) == expected
    writes = len(api.calls)
    clock, metrics = Clock(at(7)), Metrics()
    writer = Writer(
        api, metrics, schedule=FakeTimers(), clock=clock, leadership=standing_by(metrics)
    )
    late = core(writer, clock, metrics)
    async with workers(writer):
        late.owners.on_deathwatch(EventType.LISTED, as_deathwatch(deathwatch_body()))
        assert [late.verdicts.restore(as_verdict(o)) for o in alive] == [True]
        late.pods.listing(None)
        late.pods.listed(None)  # the pod is not in the listing
        record = late.core.records.named(NS, "sbx-1")
        assert record is not None and record.track is not None
        assert (record.track.state, record.track.cause) == (State.GONE, Cause.UNOBSERVED)
        late.verdicts.on_verdict(EventType.MODIFIED, as_verdict(copy.deepcopy(final)))
        assert record.track is not None
        assert (str(record.track.state), str(record.track.cause)) == expected
        late.verdicts.republish(lead(writer, 2))
        await asyncio.wait_for(writer.idle(), 5)
    assert [k[0] for _, k in api.calls[writes:]] == []  # nothing written over the leader's


async def test_two_controllers_each_judge_only_what_the_oldest_deathwatch_of_theirs_selects(
) -> None:  # fmt: skip
    """Issue #51: two releases, each its controller id. The default controller serves the
    DeathWatches with no deathwatch.dev/controller-id; `staging`, those annotated so. The
    oldest DeathWatch in a namespace that selects a pod judges it, whoever serves it: one
    writer per verdict. Moving a DeathWatch to the other controller moves its sandboxes."""
    api = FakeApi()
    older = deathwatch_body()
    newer = deathwatch_body()
    newer["metadata"].update(name="staging", uid="dw-staging",
                             creationTimestamp="2026-11-29T09:30:00Z",
                             annotations={"deathwatch.dev/controller-id": "staging"})  # fmt: skip
    newer["spec"]["podSelector"] = {"matchLabels": {"tier": "staging"}}
    controllers = {}
    for name in ("", "staging"):
        clock, metrics = Clock(), Metrics()
        writer = Writer(
            api, metrics, schedule=FakeTimers(), clock=clock, leadership=the_only_writer(metrics)
        )
        c = core(writer, clock, metrics)
        c.core.deathwatches.controller_id = name
        controllers[name] = (c, writer, clock)
    both = pod(uid="uid-both", name="both", labels={"app": "sandbox", "tier": "staging"})
    theirs = pod(uid="uid-staging", name="staging-only", labels={"tier": "staging"})
    for c, writer, clock in controllers.values():
        async with workers(writer):
            for body in (older, newer):
                c.owners.on_deathwatch(EventType.LISTED, as_deathwatch(body))
            clock.now = at(2)
            for p in (both, theirs):
                c.pods.on_pod(EventType.ADDED, read_pod(p))
            await asyncio.wait_for(writer.idle(), 5)
    default, staging = controllers[""][0], controllers["staging"][0]
    assert default.core.records.named(NS, "both") is not None  # the older DeathWatch's
    assert staging.core.records.named(NS, "both") is None
    assert staging.core.records.named(NS, "staging-only") is not None
    assert default.core.records.named(NS, "staging-only") is None
    writers = {(k[2], k[1]) for _, k in api.calls if k[0] == SV_PLURAL}
    assert {name for name, _ in writers} == {"both", "staging-only"}
    # the default DeathWatch handed to staging: the default controller lets its pods go
    moved = copy.deepcopy(older)
    moved["metadata"]["annotations"] = {"deathwatch.dev/controller-id": "staging"}
    default.owners.on_deathwatch(EventType.MODIFIED, as_deathwatch(moved))
    assert default.core.records.named(NS, "both") is None
    assert list(default.core.deathwatches) == []


async def test_a_standby_holds_the_fate_the_leader_wrote_and_a_takeover_writes_no_other() -> None:
    """Issue #51: the leader's written verdict is the one every replica holds. A standby that
    judged the same pod otherwise (here: a report only it saw) takes the written fate and
    counts the disagreement; taking over then writes nothing over it."""
    body = pod(ready=True, ready_at=2, restart_policy="Never")
    done = pod(ready=False, ready_at=5, restart_policy="Never",
               containers=[terminated(code=0, reason="Completed", finished=5)])  # fmt: skip
    async with harness() as leader:
        leader.deathwatch()
        leader.pod(body, 2)
        leader.pod(done, 5)
        await leader.settle()
    api = leader.api
    final = api.objects[(SV_PLURAL, NS, "sbx-1")]
    assert (final["status"]["state"], final["status"]["cause"]) == ("Gone", "Completed")
    writes = len(api.calls)
    clock, metrics = Clock(at(6)), Metrics()
    writer = Writer(
        api, metrics, schedule=FakeTimers(), clock=clock, leadership=standing_by(metrics)
    )
    standby = core(writer, clock, metrics)
    async with workers(writer):
        standby.owners.on_deathwatch(EventType.LISTED, as_deathwatch(deathwatch_body()))
        standby.pods.on_pod(EventType.ADDED, read_pod(body))
        standby.pods.on_pod(EventType.MODIFIED, read_pod(
            pod(ready=False, ready_at=5, restart_policy="Never",
                containers=[terminated(code=1, finished=5)])))  # fmt: skip
        record = standby.core.records.named(NS, "sbx-1")
        assert record is not None and record.track is not None
        assert record.track.state is State.DEAD
        standby.verdicts.on_verdict(EventType.MODIFIED, as_verdict(copy.deepcopy(final)))
        assert (record.track.state, record.track.cause) == (State.GONE, Cause.COMPLETED)
        assert metrics.standby_disagreements._value.get() == 1
        standby.verdicts.republish(lead(writer, 2))
        await asyncio.wait_for(writer.idle(), 5)
    assert [k for _, k in api.calls[writes:] if k[0] == SV_PLURAL] == []


async def test_a_standby_counts_the_death_it_takes_from_the_leader() -> None:
    """The leader heard the death on the node and wrote it before the kubelet told the
    standby anything: the standby holds it, and counts it as a death on that node, so that the
    death-rate alerts (the highest replica's count) stay whole if the Lease changes hands in a
    burst. A fate it held already is not counted twice."""
    body = pod(ready=True, ready_at=2, node="node-1")
    dead = pod(ready=False, ready_at=5, phase="Failed", node="node-1",
               containers=[terminated(code=3, finished=5)])  # fmt: skip
    async with harness() as leader:
        leader.deathwatch()
        leader.pod(body, 2)
        leader.pod(dead, 5)
        await leader.settle()
    final = leader.api.objects[(SV_PLURAL, NS, "sbx-1")]
    clock, metrics = Clock(at(5)), Metrics()
    writer = Writer(leader.api, metrics, schedule=FakeTimers(), clock=clock,
                    leadership=standing_by(metrics))  # fmt: skip
    standby = core(writer, clock, metrics)
    standby.owners.on_deathwatch(EventType.LISTED, as_deathwatch(deathwatch_body()))
    standby.pods.on_pod(EventType.ADDED, read_pod(body))
    deaths = {"node": "node-1", "cause": "ContainerExited", "origin": "Workload"}
    sample = metrics.registry.get_sample_value
    assert sample("deathwatch_sandbox_deaths_total", deaths) == 0
    for _ in range(2):  # the leader's write, then the same status seen again
        standby.verdicts.on_verdict(EventType.MODIFIED, as_verdict(copy.deepcopy(final)))
        record = standby.core.records.named(NS, "sbx-1")
        assert record is not None and record.track is not None
        assert (record.track.state, record.track.cause) == (State.DEAD, Cause.CONTAINER_EXITED)
        assert sample("deathwatch_sandbox_deaths_total", deaths) == 1
    standby.pods.on_pod(EventType.MODIFIED, read_pod(dead))  # the kubelet's report, later
    assert sample("deathwatch_sandbox_deaths_total", deaths) == 1
    assert metrics.standby_disagreements._value.get() == 0


@pytest.mark.parametrize("deathwatch_first", [True, False])
async def test_a_restored_record_is_judged_with_its_deathwatchs_settings(
    deathwatch_first: bool,
) -> None:
    """Verdicts are listed at start before or after their DeathWatch is compiled: either
    way, the restored record takes its settings (agent ports, window multiplier) the moment
    both are known; not the defaults, with which a deletion coming first was judged."""
    body = pod(ready=True, ready_at=2)
    async with harness() as h:
        h.deathwatch(agentPorts=[1234], execProbe={"windowMultiplier": 3})
        h.pod(body, 2)
        await h.settle()
    listed = [o for k, o in h.api.objects.items() if k[0] == SV_PLURAL]
    async with harness(h.api) as h2:
        if deathwatch_first:
            h2.deathwatch(agentPorts=[1234], execProbe={"windowMultiplier": 3})
        assert [h2.controller.verdicts.restore(as_verdict(copy.deepcopy(o))) for o in listed] == [
            True
        ]
        record = h2.controller.core.records.named(NS, "sbx-1")
        assert record is not None and record.memory is not None
        if not deathwatch_first:
            assert record.memory.settings is None  # not known yet: nothing guessed
            h2.deathwatch(agentPorts=[1234], execProbe={"windowMultiplier": 3})
        assert record.memory.settings == PolicySettings(3.0, frozenset({1234}))


# --- DeathWatches on their own reflector (#43) -------------------------------------------------


async def test_a_status_write_of_a_deathwatch_reads_its_status_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Most DeathWatch events are the controller's own status writes, received by every
    process: one that is not a new revision of the spec is never decoded whole."""
    async with harness() as h:
        h.deathwatch()
        rules = h.controller.core.deathwatches.get((NS, "sandboxes"))

        def whole(self: DeathWatchObject) -> dict[str, Any]:
            raise AssertionError("a status write decoded whole")

        monkeypatch.setattr(DeathWatchObject, "body", whole)
        written = {**deathwatch_body(), "status": {"tracked": 3, "conditions": []}}
        change = h.controller.owners.on_deathwatch(EventType.MODIFIED, as_deathwatch(written))
        assert change is None
        assert h.controller.core.deathwatches.get((NS, "sandboxes")) is rules
        edited = as_deathwatch(deathwatch_body(generation=2, agentPorts=[1234]))
        with pytest.raises(AssertionError, match="decoded whole"):  # an edit is read whole
            h.controller.owners.on_deathwatch(EventType.MODIFIED, edited)


async def test_a_relisting_without_a_deathwatch_forgets_it_and_its_sandboxes() -> None:
    """Deleted while the watch was down: the next complete listing does not show it."""
    async with harness() as h:
        sink = DeathWatchReceiver(h.controller.owners, Malformed(), Metrics())
        sink.listing(NS)
        sink.event(EventType.LISTED, as_deathwatch(deathwatch_body()), 0.0, "1")
        sink.listed(NS)
        h.pod(pod(), 2)
        assert len(h.controller.core.records) == 1
        other = DeathWatchReceiver(
            h.controller.owners, Malformed(), Metrics()
        )  # another namespace's reflector
        other.listing("elsewhere")  # its listing, empty, leaves this one's DeathWatch alone
        other.listed("elsewhere")
        assert h.controller.core.deathwatches.get((NS, "sandboxes")) is not None
        sink.listing(NS)
        sink.listed(NS)
    assert h.controller.core.deathwatches.get((NS, "sandboxes")) is None
    assert len(h.controller.core.records) == 0


async def test_a_deathwatch_adopts_its_pods_only_after_the_first_listing() -> None:
    """The first listing comes before the pods' own (they need no adoption); after it, a new
    selection is adopted, a status write or a deletion is not."""
    async with harness() as h:
        sink = DeathWatchReceiver(h.controller.owners, Malformed(), Metrics())
        adopted: list[Revised] = []
        sink.listing(NS)
        sink.event(EventType.LISTED, as_deathwatch(deathwatch_body()), 0.0, "1")
        sink.listed(NS)
        sink.adopt = adopted.append
        sink.event(EventType.MODIFIED, as_deathwatch(
            {**deathwatch_body(), "status": {"tracked": 0}}), 0.0, "2")  # fmt: skip
        assert adopted == []
        reselected = deathwatch_body(generation=2, podSelector={"matchLabels": {"tier": "b"}})
        sink.event(EventType.MODIFIED, as_deathwatch(reselected), 0.0, "3")
        assert [c.rules.generation if c.rules else None for c in adopted] == [2]
        gone = as_deathwatch(reselected)
        sink.event(EventType.DELETED, gone, 0.0, "4")
        assert len(adopted) == 1 and h.controller.core.deathwatches.get(gone.key) is None


def test_a_deathwatch_that_cannot_be_read_is_named() -> None:
    with pytest.raises(Undecodable, match="sandboxes/w"):
        decode_deathwatch(b'{"metadata": {"namespace": "sandboxes", "name": "w", '
                          b'"generation": "two"}}')  # fmt: skip


# --- the adoption race (issue #23) -------------------------------------------------------------


async def test_a_new_deathwatch_adopts_its_idle_pods_whatever_comes_between_the_pages() -> None:
    """A DeathWatch created over idle sandboxes lists them, page by page. Between the pages
    other pods change and kopf delivers the same DeathWatch again: before the reshape the
    second reading replaced the compiled DeathWatch with an equal object, the adoption
    compared by identity, and adopted nothing (300 of 300 sandboxes with no verdict)."""
    async with harness() as h:
        c = h.controller
        change = c.owners.on_deathwatch(EventType.LISTED, as_deathwatch(deathwatch_body()))
        assert change is not None and change.rules is not None
        rules = change.rules
        idle = [read_pod(pod(uid=f"u{i}", name=f"idle-{i}")) for i in range(600)]
        assert c.pods.adopt(rules.key, rules.revision, idle[:500]) == 500  # the first page
        h.pod(pod(uid="other", name="web", labels={"app": "web"}), 3)  # the namespace churns
        assert (
            c.owners.on_deathwatch(EventType.MODIFIED, as_deathwatch(deathwatch_body())) is None
        )  # read again: same one
        h.pod(pod(uid="u7", name="idle-7", ready=False, ready_at=4), 4)  # one dies meanwhile
        assert c.pods.adopt(rules.key, rules.revision, idle[500:]) == 100  # the second page
        await h.settle()
        states = Counter(str((h.sv(f"idle-{i}") or {}).get("state")) for i in range(600))
    assert states == {"Alive": 599, "Dead": 1}
    assert h.sv("web") is None


async def test_an_adoption_for_a_superseded_version_adopts_nothing_and_the_newer_one_does() -> None:
    async with harness() as h:
        c = h.controller
        first = c.owners.on_deathwatch(EventType.LISTED, as_deathwatch(deathwatch_body()))
        assert first is not None and first.rules is not None
        listed = [read_pod(pod(uid="u1", name="sbx-1", labels={"tier": "b"}))]
        newer = c.owners.on_deathwatch(EventType.MODIFIED, as_deathwatch(deathwatch_body(
            generation=2, podSelector={"matchLabels": {"tier": "b"}})))  # fmt: skip
        assert newer is not None and newer.rules is not None
        assert c.pods.adopt(first.key, first.rules.revision, listed) == 0  # for generation 1
        assert c.pods.adopt(newer.key, newer.rules.revision, listed) == 1


async def test_a_pod_deleted_while_it_was_being_listed_is_not_adopted() -> None:
    async with harness() as h:
        c = h.controller
        change = c.owners.on_deathwatch(EventType.LISTED, as_deathwatch(deathwatch_body()))
        assert change is not None and change.rules is not None
        listed = read_pod(pod())
        h.pod(pod(deletion_at=3), 4, event=EventType.DELETED)  # its DELETED came before the page
        assert c.pods.adopt(change.key, change.rules.revision, [listed]) == 0


async def test_a_pod_deleted_before_it_was_ever_ready_is_judged_once() -> None:
    """A warm pool's surplus pod, deleted while Pending: Gone once, never written; the
    kubelet's later reports of its deletion do not make it a new pod to judge again (seen on
    the node: four Pending → Gone lines, each counted, for one uid)."""
    async with harness() as h:
        h.deathwatch()
        pending: dict[str, Any] = {"ready": None, "phase": "Pending", "containers": [waiting()]}
        h.pod(pod(**pending), 1, event=EventType.ADDED)
        h.pod(pod(**pending, deletion_at=2), 2)
        h.pod(pod(**pending, deletion_at=2), 3)
        h.pod(pod(**pending, deletion_at=2), 4, event=EventType.DELETED)
        await h.settle()
        assert h.sv() is None
        counted = h.controller.pods.tail.metrics.verdicts.labels("Gone", "no-probe", "Deleted")
        assert counted._value.get() == 1


async def test_an_older_event_behind_a_newer_listing_is_not_judged() -> None:
    """The pods existed before their DeathWatch: its listing shows them Ready (version 12),
    while the watch stream still holds their creation (version 10, no status) and their
    Ready (11). Judged in that order, the stale creation was a Ready drop: Dead (seen in CI
    under load). Each pod's newest state judged is kept; an older one comes to nothing."""
    async with harness() as h:
        c = h.controller
        change = c.owners.on_deathwatch(EventType.LISTED, as_deathwatch(deathwatch_body()))
        assert change is not None and change.rules is not None
        listed = read_pod(pod())
        assert c.pods.adopt(change.key, change.rules.revision, [listed], {"uid-1": "12"}) == 1
        created = pod(ready=None, phase="Pending", containers=[])
        c.pods.on_pod(EventType.ADDED, read_pod(created), None, "10")
        c.pods.on_pod(EventType.MODIFIED, read_pod(pod()), None, "11")
        await h.settle()
        assert (h.sv() or {}).get("state") == "Alive"
        c.pods.on_pod(
            EventType.MODIFIED, read_pod(pod()), None, "12"
        )  # the same state: changes nothing
        h.clock.now = at(50)
        dies = pod(ready=False, ready_at=50, phase="Failed", containers=[terminated(code=3)])
        c.pods.on_pod(EventType.MODIFIED, read_pod(dies), None, "13")
        await h.settle()
        assert ((h.sv() or {}).get("state"), (h.sv() or {}).get("cause")) == (
            "Dead",
            "ContainerExited",
        )


# --- one pass per event, and only when something changed ---------------------------------------


async def test_a_pod_event_that_changes_nothing_builds_no_document() -> None:
    async with harness() as h:
        h.deathwatch()
        h.pod(pod(), 2)
        await h.settle()
        wanted: list[Any] = []
        want = h.writer.want

        def spy(d: Any) -> None:
            wanted.append(d)
            want(d)

        h.writer.want = spy  # type: ignore[method-assign]
        for t in range(3, 30):
            h.pod(pod(), t)  # the kubelet rewrites the status: nothing a verdict says changes
        assert wanted == []


async def test_a_standby_owes_digests_and_a_takeover_says_only_what_differs() -> None:
    api = FakeApi()
    api.objects[(DW_PLURAL, NS, "sandboxes")] = deathwatch_body()
    clock, metrics = Clock(), Metrics()
    writer = Writer(
        api, metrics, schedule=FakeTimers(), clock=clock, leadership=standing_by(metrics)
    )
    c = core(writer, clock, metrics)
    async with workers(writer):
        c.owners.on_deathwatch(EventType.LISTED, as_deathwatch(deathwatch_body()))
        for i in range(3):
            clock.now = at(2)
            c.pods.on_pod(EventType.MODIFIED, read_pod(pod(uid=f"u{i}", name=f"sbx-{i}")))
        # the leader wrote sbx-0 and sbx-1 as we judge them (but for its own times)
        for i in (0, 1):
            status = api.objects[(SV_PLURAL, NS, f"sbx-{i}")] = {
                "metadata": {"name": f"sbx-{i}"}, "status": {},
            }  # fmt: skip
            record = c.core.records.get(f"u{i}")
            track = record.track if record else None
            assert record is not None and track is not None
            written = sandbox_verdicts.verdict_status(track, None, transitions=record.transitions)
            status["status"] = {**to_document(written), "term": 1}
            c.verdicts.on_verdict(EventType.MODIFIED, VerdictObject(NS, f"sbx-{i}", api.version(SV_PLURAL, NS, f"sbx-{i}"),
                                                 "sandboxes", {}, status["status"]))  # fmt: skip
        assert api.calls == []  # a standby sends nothing
        owed = lead(writer, 2)
        assert [k[2] for k in owed] == ["sbx-2"]
        c.verdicts.republish(owed)
        await asyncio.wait_for(writer.idle(), 5)
    assert [(op, k[2]) for op, k in api.calls] == [("create", "sbx-2"), ("replace_status", "sbx-2")]


# --- a DeathWatch's counts, kept by difference, equal a recount -------------------------------


events = st.lists(
    st.tuples(
        st.integers(0, 5),  # which pod
        st.sampled_from(["ready", "drop", "exit", "delete", "gone", "flap"]),
    ),
    min_size=1,
    max_size=40,
)


@examples(150, slow=True)
@given(events)
def test_counts_kept_by_difference_equal_a_recount(script: list[tuple[int, str]]) -> None:
    async def run() -> None:
        async with harness() as h:
            h.deathwatch()
            t = 1.0
            for i, what in script:
                t += 1
                uid, name = f"u{i}", f"sbx-{i}"
                if what == "ready":
                    h.pod(pod(uid=uid, name=name, ready_at=t), t)
                elif what == "flap":
                    h.pod(pod(uid=uid, name=name, ready_at=t), t)
                    h.pod(pod(uid=uid, name=name, ready=False, ready_at=t + 0.5,
                              probe=exec_probe(), containers=[running(ready=False)]), t + 0.5)  # fmt: skip
                elif what == "drop":
                    h.pod(pod(uid=uid, name=name, ready=False, ready_at=t), t)
                elif what == "exit":
                    h.pod(pod(uid=uid, name=name, ready=False, ready_at=t, phase="Failed",
                              containers=[terminated(finished=t)]), t)  # fmt: skip
                elif what == "delete":
                    h.pod(pod(uid=uid, name=name, deletion_at=t), t, event=EventType.DELETED)
                else:
                    record = h.controller.core.records.get(uid)
                    if record is not None:
                        h.controller.pods.gone(record, at(t))
                if i == 0 and what == "gone":
                    h.clock.now = at(t + 7200)
                    h.controller.retention.retire()
            c = h.controller
            summary = c.core.summaries[(NS, "sandboxes")]
            tracks = [r.track for r in c.core.records if r.track is not None]
            assert dict(+summary.counts) == dict(+Counter(tr.state for tr in tracks))
            assert summary.flaps == sum(tr.flaps for tr in tracks)
            assert summary.false_positives == sum(tr.false_positive for tr in tracks)
            deaths = sorted(
                (tr.evidence for tr in tracks if tr.state is State.DEAD and tr.evidence),
                key=lambda e: (e.declared_at, e.name), reverse=True,
            )  # fmt: skip
            assert [e.pod_uid for e in summary.last_deaths()] == [e.pod_uid for e in deaths][:20]
            assert c.core.summaries.states == Counter(tr.state for tr in tracks) + Counter()

    asyncio.run(run())


def as_verdict(obj: dict[str, Any]) -> VerdictObject:
    """A SandboxVerdict as the verdict reflector decodes it."""
    meta = obj["metadata"]
    return VerdictObject(meta["namespace"], meta["name"], meta["resourceVersion"],
                   obj["spec"]["deathWatch"], meta.get("labels") or {}, obj.get("status"))  # fmt: skip


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
        observed_by=Observer.NODE,
        container_id="containerd://abc",
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
        disputed="exit code: the node saw 137, the kubelet reports 143",
    )
    stored = json.loads(json.dumps(to_document(sandbox_verdicts.verdict_status(track, "node-1"))))
    assert sandbox_verdicts.track_from_status(NS, "sbx-1", stored) == track
    suspect = msgspec.structs.replace(
        track, state=State.SUSPECT, cause=Cause.NOT_READY, evidence=None, deadline=at(70.25),
        false_positive=False,
    )  # fmt: skip
    stored = json.loads(json.dumps(to_document(sandbox_verdicts.verdict_status(suspect, None))))
    assert sandbox_verdicts.track_from_status(NS, "sbx-1", stored) == suspect


SETTINGS = PolicySettings(agent_ports=frozenset({49983}))


def _outcome(fleet: Pods) -> dict[str, Any]:
    track = fleet.tracks.get("uid-1")
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


def _seen(ready: bool | None, *, evicted: bool = False) -> dict[str, Any]:
    """One observation of tests.lifecycles' strategy, at the same second as the last."""
    return {"dt": 0.0, "ready": ready, "phase": "Pending", "evicted": evicted,
            "container": waiting(), "delete": 1, "tick": False}  # fmt: skip


@examples(300, slow=True)
@given(
    st.lists(observation, min_size=1, max_size=10),
    probes,
    st.integers(0, 10),
    st.sampled_from([AUTO, "container-state"]),
)
@example(
    observations=[_seen(None), _seen(None), _seen(True, evicted=True), _seen(True)],
    probe=None,
    split=3,
    policy="auto",
).via("a death while Ready, the pod still Ready after a restart: no false positive")
def test_a_restart_at_any_point_changes_no_verdict(
    observations: list[dict[str, Any]], probe: dict[str, Any] | None, split: int, policy: str
) -> None:
    steps = lifecycle(observations, probe)
    split = min(split, len(steps) - 1)
    whole, before = Pods(default_registry()), Pods(default_registry())
    for i, (t, body) in enumerate(steps):
        whole.observe(read_pod(body), at(t), policy, SETTINGS)
        if i <= split:
            before.observe(read_pod(body), at(t), policy, SETTINGS)
    track = before.tracks.get("uid-1")
    assert track is not None
    if not (track.ever_ready or track.probe_blocked):
        return  # never persisted: nothing to restore
    # the status as the API stores it: JSON, and back
    stored = json.loads(json.dumps(to_document(sandbox_verdicts.verdict_status(track, "node-1"))))
    restored = sandbox_verdicts.track_from_status(NS, "sbx-1", stored)
    assert restored is not None
    assert sandbox_verdicts.verdict_status(restored, "node-1") == sandbox_verdicts.verdict_status(
        track, "node-1"
    )
    after = Pods(default_registry())
    after.memories[restored.uid] = memory.restored(restored, after.policies, after.deadlines)
    for t, body in steps[split + 1 :]:
        after.observe(read_pod(body), at(t), policy, SETTINGS)
    assert _outcome(after) == _outcome(whole)


POD_LIMIT = "Pod ephemeral local storage usage exceeds the total limit of containers 20Mi. "
CID = "containerd://" + "c" * 64


async def test_the_kubelets_evicted_event_names_the_exit_heard_on_the_node() -> None:
    """ADR 0044: the pod pass keeps the kubelet's Evicted Event with the pod's record (once,
    the kubelet's alone, a tracked sandbox's alone), and the exit heard on the node next is
    Dead StorageLimitExceeded; the kubelet's report then agrees: no dispute."""
    async with harness() as h:
        h.deathwatch()
        live = pod(ready=True, ready_at=2, node="node-1", restart_policy="Never",
                   containers=[running(cid=CID)])  # fmt: skip
        h.pod(live, 2)
        await h.settle()
        read = h.controller.metrics.registry.get_sample_value
        counted = {"cause": "StorageLimitExceeded"}
        h.controller.pods.evicted(EvictionNotice("uid-9", NS, "not-tracked", POD_LIMIT, True))
        h.controller.pods.evicted(EvictionNotice("uid-1", NS, "sbx-1", POD_LIMIT, False))
        assert (read("deathwatch_kubelet_evictions_total", counted) or 0) == 0
        for _ in range(2):  # a relisting delivers it again: kept and counted once
            h.controller.pods.evicted(EvictionNotice("uid-1", NS, "sbx-1", POD_LIMIT, True))
        assert read("deathwatch_kubelet_evictions_total", counted) == 1
        h.clock.now = at(50.4)
        exit = NodeExit(CID, 137, False, at(50.3), "node-1")
        assert h.controller.node_exits.exited(exit, read_pod(live), "9") == "judged"
        await h.settle()
        dead = h.sv()
        assert dead is not None
        assert (dead["state"], dead["cause"], dead["origin"], dead["observedBy"]) == (
            "Dead", "StorageLimitExceeded", "Workload", "node"
        )  # fmt: skip
        report = pod(ready=False, ready_at=51, node="node-1", phase="Failed", reason="Evicted",
                     message=POD_LIMIT, restart_policy="Never",
                     containers=[terminated(code=137, finished=50, cid=CID)])  # fmt: skip
        h.pod(report, 52)
        await h.settle()
    after = h.sv()
    assert after is not None and after.get("disputed") is None, after
    (event,) = h.api.events.values()
    assert "the kubelet evicted it: " + POD_LIMIT.strip() in event["message"], event["message"]
