"""Delivery's pure parts: the sinks file, the event (parsed by the CloudEvents SDK, its
signature verified by the Standard Webhooks library: never by our own code), what an answer
means, and the outbox's order, coalescing and backoff. The whole path on a real control plane
with a real receiver and its faults: tests/chaos/test_delivery.py."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from cloudevents.v1.http import from_http
from standardwebhooks.webhooks import Webhook

from deathwatch._api.resources import DeliveryMark, DeliveryOutcome, SandboxVerdictStatus
from deathwatch._api.verdict_document import VerdictDocument, document
from deathwatch._engine.verdict import State
from deathwatch._kube.configfile import ConfigError
from deathwatch._operator.delivery import config
from deathwatch._operator.delivery.events import (
    PROBE_EVERY,
    Answer,
    Outcome,
    event_id,
    outgoing,
    read_answer,
    request,
    retry_after,
    retry_in,
    signature,
)
from deathwatch._operator.delivery.outbox import Deliveries, SinkOutbox

NOW = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)
KEY_A, KEY_B = b"a" * 32, b"b" * 32


def whsec(key: bytes) -> str:
    return "whsec_" + base64.b64encode(key).decode()


def sink_file(tmp_path: Path, **sink: Any) -> Path:
    secret = tmp_path / "billing"
    secret.mkdir(exist_ok=True)
    (secret / "keys").write_text(whsec(KEY_A) + "\n")
    path = tmp_path / "sinks.yaml"
    path.write_text(json.dumps({"cluster": "prod-eu-1", "sinks": [
        {"name": "billing", "url": "https://billing.example/hooks", "secretDir": str(secret),
         **sink}]}))  # fmt: skip
    return path


@pytest.mark.parametrize(
    ("sink", "said"),
    [
        ({"url": "http://billing.example/hooks"}, "sinks[0].url: 'http://billing.example/hooks' is plain http"),
        ({"url": "https://u:p@billing.example/"}, "carries credentials"),
        ({"url": "ftp://billing.example/"}, "sinks[0].url: expected an https:// URL with a host"),
        ({"timeoutSeconds": 90}, "sinks[0].timeoutSeconds: expected seconds, above 0 and at most 30, got 90"),
        ({"states": ["Dead", "Zombie"]}, "sinks[0].states[1]: expected one of Alive, Suspect, Dead, Gone, got 'Zombie'"),
        ({"mode": "batched"}, "sinks[0].mode: expected structured or binary, got 'batched'"),
        ({"retries": 3}, "unknown field 'retries'"),
        ({"name": "Billing"}, "sinks[0].name: expected a DNS label of at most 63 characters, got 'Billing'"),
    ],
)  # fmt: skip
def test_a_bad_sinks_file_is_one_line_naming_the_field(
    tmp_path: Path, sink: dict[str, Any], said: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        config.load(sink_file(tmp_path, **sink))
    assert said in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_the_sinks_file_and_keys_read_back(tmp_path: Path) -> None:
    loaded = config.load(sink_file(tmp_path, states=["Dead", "Gone"], namespaces=["team-a"]))
    (sink,) = loaded.sinks
    assert loaded.cluster == "prod-eu-1" and sink.states == {State.DEAD, State.GONE}
    assert sink.wants("team-a", State.DEAD) and not sink.wants("team-b", State.DEAD)
    assert not sink.wants("team-a", State.ALIVE)
    assert config.keys(sink) == (KEY_A,)
    (sink.secret_dir / "keys").write_text(f"{whsec(KEY_A)}\n{whsec(KEY_B)}\n")  # a rotation
    assert config.keys(sink) == (KEY_A, KEY_B)
    (sink.secret_dir / "keys").write_text("not-a-key\n")
    with pytest.raises(ConfigError, match="line 1: expected a key starting with 'whsec_'"):
        config.keys(sink)
    (sink.secret_dir / "keys").write_text(whsec(b"short") + "\n")
    with pytest.raises(ConfigError, match="a key of 5 bytes; at least 24"):
        config.keys(sink)
    with pytest.raises(ConfigError, match="plain http"):
        config.parse(
            {"cluster": "c", "sinks": [{"name": "x", "url": "http://x", "secretDir": "/"}]}
        )
    assert config.parse({"cluster": "c", "sinks": [
        {"name": "x", "url": "http://x.svc:8080/", "secretDir": "/", "allowInsecure": True}]})  # fmt: skip


def doc(state: State = State.DEAD) -> VerdictDocument:
    status = msgspec.convert({
        "state": state.value, "policy": "no-probe", "podUID": "uid-1", "restartCounts": {},
        "readyDrops": 1, "flaps": 0, "falsePositive": False, "probeBlockedByFirewall": False,
        "cause": "OOMKilled", "exitCode": 137, "declaredAt": "2026-12-02T10:00:00Z",
        "transitions": 2,
    }, SandboxVerdictStatus)  # fmt: skip
    return document("team-a", "sbx-7", "sandboxes", status, {"deathwatch.dev/pod-uid": "uid-1"})


@pytest.mark.parametrize("mode", ["structured", "binary"])
def test_the_event_parses_as_a_cloudevent_and_both_rotation_keys_verify(mode: str) -> None:
    out = outgoing("billing", "prod-eu-1", doc(), 2, NOW)
    # signed now: the library refuses a timestamp more than 5 minutes off its clock
    headers, body = request(out, mode, (KEY_A, KEY_B), int(time.time()), "deathwatch/test")
    event = from_http(headers, body)
    assert event["specversion"] == "1.0" and event["id"] == "uid-1/dead"
    assert event["type"] == "dev.deathwatch.sandbox.dead"
    assert event["source"] == "//deathwatch.dev/clusters/prod-eu-1/namespaces/team-a"
    assert event["subject"] == "sbx-7" and event["sequence"] == "0000000002"
    assert event["time"] == "2026-12-02T10:00:00Z"
    data = event.get_data()
    data = json.loads(data) if isinstance(data, bytes | str) else data
    typed = msgspec.convert(data, VerdictDocument)  # the client's type decodes it
    assert (typed.state, typed.cause, typed.evidence.exit_code) == (State.DEAD, "OOMKilled", 137)
    # each key alone verifies (receivers mid-rotation hold one or the other)
    for key in (KEY_A, KEY_B):
        with_key = {k.lower(): v for k, v in headers.items()}
        Webhook(whsec(key)).verify(body, with_key, json_parse=False)
    tampered = body.replace(b"OOMKilled", b"Completed")
    with pytest.raises(Exception, match="No matching signature"):
        Webhook(whsec(KEY_A)).verify(tampered, dict(headers), json_parse=False)


def test_the_signature_is_the_specs_worked_example_byte_for_byte() -> None:
    """A known answer, independent of any library: the HMAC-SHA256 of `id.timestamp.body`,
    base64, `v1,` before it, one per key, space-separated (Standard Webhooks 1.0, "Signature
    scheme"). The library that signs (delivery/events.py) must give exactly this."""
    body = b'{"type":"dev.deathwatch.sandbox.dead"}'
    signed = b"uid-1/dead.1796400000." + body
    by_hand = [
        "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        for key in (KEY_A, KEY_B)
    ]
    assert signature((KEY_A, KEY_B), "uid-1/dead", 1796400000, body) == " ".join(by_hand)


def test_ids_are_stable_per_verdict_and_transition() -> None:
    assert event_id("u", State.DEAD, 3) == event_id("u", State.DEAD, 5) == "u/dead"
    assert event_id("u", State.GONE, 1) == "u/gone"
    assert event_id("u", State.SUSPECT, 3) == "u/3" != event_id("u", State.SUSPECT, 5)
    a = outgoing("s", "c", doc(), 2, NOW)
    b = outgoing("s", "c", doc(), 2, NOW)
    assert (a.id, a.data) == (b.id, b.data)  # sent again: the same event


def test_what_each_answer_means() -> None:
    assert read_answer(204, {}, NOW) == Answer(Outcome.DELIVERED, "2xx")
    assert read_answer(400, {}, NOW).outcome is Outcome.REFUSED
    assert read_answer(410, {}, NOW).outcome is Outcome.REFUSED
    assert read_answer(308, {"Location": "http://elsewhere"}, NOW).outcome is Outcome.REFUSED
    assert read_answer(408, {}, NOW) == Answer(Outcome.RETRY, "408")
    assert read_answer(500, {"Retry-After": "9"}, NOW) == Answer(
        Outcome.RETRY, "500"
    )  # not a 429/503
    assert read_answer(429, {"Retry-After": "7"}, NOW) == Answer(Outcome.RETRY, "429", 7.0)
    date = "Wed, 02 Dec 2026 10:00:30 GMT"
    assert read_answer(503, {"Retry-After": date}, NOW) == Answer(Outcome.RETRY, "503", 30.0)
    assert retry_after("999999", NOW) == 3600.0 and retry_after("soon", NOW) is None
    assert retry_after("Wed, 02 Dec 2026 09:00:00 GMT", NOW) == 0.0
    # half to all of 0.5, 1, 2, then 3 s: never near 0, never past the probe interval
    assert [retry_in(n, 0.999) for n in (1, 2, 3, 4, 30)] == pytest.approx(
        [0.49975, 0.9995, 1.999, 2.9985, 2.9985]
    )
    assert [retry_in(n, 0.0) for n in (0, 1, 5)] == [0.25, 0.25, 1.5]


def box(concurrency: int = 2) -> SinkOutbox:
    sink = config.Sink("billing", "https://x", Path("/"), frozenset(State), "structured",
                       frozenset(), 30.0, concurrency, 60.0)  # fmt: skip
    return SinkOutbox(sink)


def test_the_outbox_keeps_order_per_sandbox_and_supersedes_what_moved_on() -> None:
    b = box()
    b.owe("u1", 1, State.ALIVE, NOW, ("ns", "dw"))
    b.owe("u2", 1, State.ALIVE, NOW, ("ns", "dw"))
    taken = b.take(0.0)
    assert taken is not None and taken[0] == "u1"
    # u1 moves on while its Alive is in flight: the Suspect waits for that attempt
    assert b.owe("u1", 2, State.SUSPECT, NOW, ("ns", "dw")) is False  # in flight: not superseded
    nxt = b.take(0.0)
    assert nxt is not None and nxt[0] == "u2"
    assert b.take(0.0) is None  # u1 is in flight: never two at once
    b.ended("u1", 1)
    again = b.take(0.0)
    assert again is not None and again[0] == "u1" and again[1].sequence == 2
    # an owed Suspect superseded by Dead before it went: counted; Dead goes
    b.ended("u2", 1)
    b.owe("u2", 2, State.SUSPECT, NOW, ("ns", "dw"))
    assert b.owe("u2", 3, State.DEAD, NOW, ("ns", "dw")) is True and b.coalesced == 1
    b.ended("u1", 2)
    last = b.take(0.0)
    assert last is not None and last[1].state is State.DEAD and not b.owe("u2", 3, State.DEAD,
                                                                           NOW, ("ns", "dw"))  # fmt: skip


def test_a_failure_pauses_the_sink_and_the_event_goes_first_again() -> None:
    b = box(concurrency=4)
    for uid in ("u1", "u2", "u3"):
        b.owe(uid, 1, State.DEAD, NOW, ("ns", "dw"))
    first = b.take(10.0)
    assert first is not None
    wait = b.failed("u1", 1, Answer(Outcome.RETRY, "429", 30.0), "429", 10.0, 0.5)
    assert wait == 30.0 and b.take(20.0) is None and b.wait(20.0) == 20.0
    retried = b.take(40.0)
    assert retried is not None and retried[0] == "u1"  # oldest first, in order
    b.ended("u1", 1)
    assert b.failures == 0 and b.last_error is None
    # no longer the leader: in flight is owed again, first
    taken = b.take(40.0)
    assert taken is not None and taken[0] == "u2"
    b.abandoned()
    assert b.inflight == {} and b.queued()[0] == "u2"
    b.put_back("u2")  # idempotent
    assert b.queued() == ["u2", "u3"]


def test_a_failing_sink_sends_one_probe_at_a_time_until_one_ends() -> None:
    """#43: a receiver back from an outage is found within the probe interval and drained at
    the sink's whole concurrency; one that answers a 429 or 5xx is not a dead receiver; its
    Retry-After is kept to the second, neither lengthened nor shortened by older pauses."""
    b = box(concurrency=4)
    for uid in ("u1", "u2", "u3", "u4"):
        b.owe(uid, 1, State.DEAD, NOW, ("ns", "dw"))
    taken = [b.take(0.0) for _ in range(4)]
    assert all(taken) and b.take(0.0) is None
    # the receiver is gone: all four fail without an answer
    waits = [b.failed(f"u{i}", 1, None, "connection", 0.0, 0.999) for i in range(1, 5)]
    assert b.unanswered == 4 and max(waits) <= PROBE_EVERY
    # paused for at most PROBE_EVERY; then one probe at a time
    assert b.take(PROBE_EVERY - 0.01) is None
    probe = b.take(PROBE_EVERY)
    assert probe is not None and probe[0] == "u1" and b.take(PROBE_EVERY) is None
    assert b.wait(PROBE_EVERY) is None  # full: the probe is in flight
    # it answers 503 with Retry-After 2: there, not dead; paused exactly 2 s from now
    wait = b.failed("u1", 1, Answer(Outcome.RETRY, "503", 2.0), "503", 10.0, 0.5)
    assert (wait, b.unanswered, b.paused_until) == (2.0, 0, 12.0)
    assert b.take(11.99) is None
    probe = b.take(12.0)
    assert probe is not None and probe[0] == "u1" and b.take(12.0) is None
    # it is delivered: the whole concurrency again, oldest first
    b.ended("u1", 1)
    assert (b.failures, b.unanswered, b.limit) == (0, 0, 4)
    assert [t[0] for t in (b.take(12.0), b.take(12.0), b.take(12.0)) if t] == ["u2", "u3", "u4"]


def test_the_receivers_latest_retry_after_is_the_pause() -> None:
    """Two attempts in flight: the first is told 60 s, the second (answered later) 1 s: the
    receiver's latest word is kept, not the longer pause."""
    b = box()
    for uid in ("u1", "u2"):
        b.owe(uid, 1, State.DEAD, NOW, ("ns", "dw"))
    assert b.take(0.0) is not None and b.take(0.0) is not None
    b.failed("u1", 1, Answer(Outcome.RETRY, "429", 60.0), "429", 0.0, 0.5)
    b.failed("u2", 1, Answer(Outcome.RETRY, "429", 1.0), "429", 5.0, 0.5)
    assert b.paused_until == 6.0 and b.unanswered == 0
    taken = b.take(6.0)
    assert taken is not None and taken[0] == "u1" and b.take(6.0) is None  # one probe


def test_deliveries_owe_each_sink_what_it_wants_and_no_mark_covers(tmp_path: Path) -> None:
    cfg = config.DeliveryConfig("c", (
        config.Sink("dead", "https://a", tmp_path, frozenset({State.DEAD}), "structured",
                    frozenset(), 30.0, 2, 60.0),
        config.Sink("all", "https://b", tmp_path, frozenset(State), "binary",
                    frozenset({"team-a"}), 30.0, 2, 60.0),
    ))  # fmt: skip
    d = Deliveries(cfg)
    d.changed("u1", "team-a", State.ALIVE, 1, NOW, {}, ("team-a", "dw"))
    assert "u1" not in d.sinks["dead"].owed and "u1" in d.sinks["all"].owed
    mark = DeliveryMark(sink="dead", id="u1/dead", sequence=2, state=State.DEAD,
                        outcome=DeliveryOutcome.DELIVERED, at=NOW)  # fmt: skip
    d.changed("u1", "team-a", State.DEAD, 2, NOW, {"dead": mark}, ("team-a", "dw"))
    assert "u1" not in d.sinks["dead"].owed  # its mark covers it (a restart, a new leader)
    assert d.sinks["all"].owed["u1"].state is State.DEAD and d.owes("u1")
    d.changed("u2", "team-b", State.DEAD, 1, NOW - timedelta(minutes=5), {}, ("team-b", "dw"))
    assert [(s, u) for s, u, _ in d.expired(NOW)] == [("dead", "u2")]
    backlogs = d.backlogs([("team-a", "dw"), ("team-b", "dw")])
    assert [(b.sink, b.owed) for b in backlogs[("team-b", "dw")]] == [("dead", 1), ("all", 0)]
    d.forget("u1")
    assert not d.owes("u1")


# --- the controller's side: owed on a transition, built from the record, marked back ----------

from deathwatch._api.objects import EventType, VerdictObject  # noqa: E402
from deathwatch._api.resources import DW_PLURAL, SV_PLURAL  # noqa: E402
from deathwatch._engine.podview import read_pod  # noqa: E402
from deathwatch._operator.delivery.outbox import Ended  # noqa: E402
from deathwatch._operator.instruments.metrics import Metrics  # noqa: E402
from deathwatch._operator.memory.core import Core  # noqa: E402
from deathwatch._operator.memory.deathwatches import DeathWatches  # noqa: E402
from deathwatch._operator.passes.wiring import Passes  # noqa: E402
from deathwatch._operator.writing.writer import Writer  # noqa: E402
from deathwatch._policies import default_registry  # noqa: E402
from tests.builders import at, pod, terminated  # noqa: E402
from tests.fakeapi import FakeApi, FakeTimers  # noqa: E402
from tests.unit.test_core import NS, Clock, as_deathwatch, deathwatch_body  # noqa: E402
from tests.writer_driver import fence, standing_by, the_only_writer, workers  # noqa: E402


def controller(writer: Writer, clock: Clock, metrics: Metrics, max_age: float = 3600.0) -> Passes:
    registry = default_registry()
    sinks = config.DeliveryConfig("prod", (
        config.Sink("billing", "https://b", Path("/"), frozenset({State.DEAD}), "structured",
                    frozenset(), 30.0, 2, max_age),
    ))  # fmt: skip
    return Passes(Core(DeathWatches(registry)), writer=writer, metrics=metrics,
                  policies=registry, deliveries=Deliveries(sinks), clock=clock)  # fmt: skip


def died(c: Passes, clock: Clock) -> None:
    c.owners.on_deathwatch(EventType.LISTED, as_deathwatch(deathwatch_body()))
    clock.now = at(2)
    c.pods.on_pod(EventType.MODIFIED, read_pod(pod(ready=True, ready_at=2, node="n1")))
    clock.now = at(50)
    c.pods.on_pod(EventType.MODIFIED, read_pod(pod(ready=False, ready_at=50, phase="Failed",
                                              containers=[terminated(code=7)], node="n1")))  # fmt: skip


async def test_a_death_is_owed_built_from_the_record_and_its_mark_written_back() -> None:
    api = FakeApi()
    api.objects[(DW_PLURAL, NS, "sandboxes")] = deathwatch_body()
    clock, metrics = Clock(), Metrics()
    writer = Writer(
        api, metrics, schedule=FakeTimers(), clock=clock, leadership=the_only_writer(metrics)
    )
    async with workers(writer):
        c = controller(writer, clock, metrics)
        c.owners.on_deathwatch(EventType.LISTED, as_deathwatch(deathwatch_body()))
        clock.now = at(2)
        c.pods.on_pod(EventType.MODIFIED, read_pod(pod(ready=True, ready_at=2, node="n1")))
        box = c.deliveries.sinks["billing"]
        assert box.owed == {}  # Alive: this sink wants Dead only
        died(c, clock)
        ((uid, owed),) = box.owed.items()
        assert owed.state is State.DEAD and owed.sequence == 2  # Pending->Alive, Alive->Dead
        out = c.bridge.compose(uid, "billing", owed)
        assert out is not None and out.id == f"{uid}/dead" and out.sequence == 2
        event = msgspec.json.decode(out.data, type=VerdictDocument)
        assert (event.state, event.cause, event.evidence.exit_code) == (State.DEAD,
                                                                        "ContainerExited", 7)  # fmt: skip
        assert event.origin == "Workload" and "deathwatch.dev/origin" not in event.labels
        await asyncio.wait_for(writer.idle(), 5)
        mark = DeliveryMark(sink="billing", id=out.id, sequence=2, state=State.DEAD,
                            outcome=DeliveryOutcome.DELIVERED, at=clock.now)  # fmt: skip
        c.bridge.delivered(Ended(uid, mark))
        await asyncio.wait_for(writer.idle(), 5)
        assert box.owed == {} and not c.deliveries.owes(uid)
    written = api.status(SV_PLURAL, NS, "sbx-1")
    assert written is not None and written["transitions"] == 2
    assert [(m["sink"], m["id"], m["outcome"]) for m in written["delivery"]] == [
        ("billing", f"{uid}/dead", "Delivered")]  # fmt: skip
    # a restart: restored from the verdict, nothing is owed; without the mark, it would be
    api2 = FakeApi()
    writer2 = Writer(
        api2, Metrics(), schedule=FakeTimers(), clock=clock, leadership=standing_by(Metrics())
    )
    c2 = controller(writer2, clock, Metrics())
    assert c2.verdicts.restore(VerdictObject(NS, "sbx-1", "5", "sandboxes", {}, written))
    assert not c2.deliveries.owes(uid)
    unmarked = {k: v for k, v in written.items() if k != "delivery"}
    m3 = Metrics()
    c3 = controller(Writer(FakeApi(), m3, schedule=FakeTimers(), clock=clock,
                           leadership=the_only_writer(m3)), clock, Metrics())  # fmt: skip
    assert c3.verdicts.restore(VerdictObject(NS, "sbx-1", "5", "sandboxes", {}, unmarked))
    assert c3.deliveries.owes(uid)
    # a standby owing it levels with the leader's mark as its watch shows it
    fence(c3.writer)
    c3.verdicts.on_verdict(
        EventType.MODIFIED, VerdictObject(NS, "sbx-1", "6", "sandboxes", {}, written)
    )
    assert not c3.deliveries.owes(uid)


async def test_a_verdict_owed_to_a_sink_outlives_its_retention_until_the_sinks_max_age() -> None:
    """Retirement waits for what is owed; at the sink's maxAge it is given up, said on the
    verdict (Expired), counted, and the verdict then retires."""
    api = FakeApi()
    api.objects[(DW_PLURAL, NS, "sandboxes")] = deathwatch_body()
    clock, metrics = Clock(), Metrics()
    writer = Writer(
        api, metrics, schedule=FakeTimers(), clock=clock, leadership=the_only_writer(metrics)
    )
    async with workers(writer):
        c = controller(writer, clock, metrics, max_age=7200.0)
        died(c, clock)
        clock.now = at(60)
        c.pods.on_pod(EventType.DELETED, read_pod(pod(ready=False, ready_at=50, phase="Failed",
                                                 containers=[terminated(code=7)], node="n1")))  # fmt: skip
        await asyncio.wait_for(writer.idle(), 5)
        clock.now = at(60 + 3600 + 1)  # past the retention (1 h): still owed, kept
        assert c.retention.retire() == 0 and api.status(SV_PLURAL, NS, "sbx-1") is not None
        clock.now = at(50 + 7200 + 1)  # past the sink's maxAge: given up, said, counted
        assert c.retention.retire() == 0
        await asyncio.wait_for(writer.idle(), 5)
        written = api.status(SV_PLURAL, NS, "sbx-1")
        assert written is not None
        assert [(m["sink"], m["outcome"]) for m in written["delivery"]] == [("billing", "Expired")]
        expired = {"sink": "billing", "outcome": "expired"}
        assert metrics.registry.get_sample_value("deathwatch_delivery_events_total", expired) == 1
        assert c.retention.retire() == 1
        await asyncio.wait_for(writer.idle(), 5)
    assert api.status(SV_PLURAL, NS, "sbx-1") is None
