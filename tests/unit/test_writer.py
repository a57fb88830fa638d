"""The writer's rules, in process, against a fake API and a test-driven retry timer: latest
desire wins, one write in flight per object, Dead first, backoff kept across merges, no retry
of a refusal, Events exactly once: before a verdict that must be created, with (not before)
a verdict that exists, and again from Dead verdicts when writing is taken over (reconcile)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from deathwatch._api.resources import DW_PLURAL, SV_PLURAL
from deathwatch._kube.backoff import WRITE
from deathwatch._operator.writing.desired import LOW, NORMAL, URGENT, Desired
from tests.writer_driver import NS, dead_event, fence, running, settle, until


def sv(name: str, state: str = "Alive", priority: int = NORMAL, **kw: Any) -> Desired:
    return Desired(
        SV_PLURAL,
        NS,
        name,
        status={"state": state, "podUID": f"uid-{name}", **kw},
        create={"metadata": {"name": name, "namespace": NS}, "spec": {}},
        priority=priority,
    )


def key(name: str, plural: str = SV_PLURAL) -> tuple[str, str, str]:
    return (plural, NS, name)


async def test_latest_desire_wins_while_a_write_is_in_flight() -> None:
    async with running() as (writer, api, _):
        api.hold = asyncio.Event()
        writer.want(sv("a", flaps=1))
        await until(lambda: bool(api.calls))  # the create is in flight
        for flaps in (2, 3, 4):
            writer.want(sv("a", flaps=flaps))
        api.hold.set()
        await settle(writer)
    sent = [p["flaps"] for k, p in api.writes if k == key("a")]
    assert sent == [1, 4]
    assert api.status(*key("a")) == {"state": "Alive", "podUID": "uid-a", "flaps": 4}


async def test_a_superseded_desire_still_posts_its_event_and_keeps_its_urgency() -> None:
    async with running(1) as (writer, api, _):
        api.hold = asyncio.Event()
        writer.want(sv("other"))
        await until(lambda: bool(api.calls))  # the one worker is busy
        writer.want(sv("b"))
        dead = sv("a", state="Dead", priority=URGENT)
        dead.events = [dead_event("a")]
        writer.want(dead)
        writer.want(sv("a", state="Dead", flaps=1))  # a later desire, with no Event of its own
        api.hold.set()
        await settle(writer)
    assert [op for op, k in api.calls if k[2] != "other"][:2] == ["create_event", "create"]
    assert list(api.events) == [(NS, "a.uid-a.sandboxdead")]
    assert api.status(*key("a")) == {"state": "Dead", "podUID": "uid-a", "flaps": 1}


async def test_one_write_in_flight_per_object_while_others_proceed() -> None:
    async with running(4) as (writer, api, _):
        api.hold = asyncio.Event()
        for i in range(10):
            writer.want(sv("a", flaps=i))
            writer.want(sv("b", flaps=i))
            await asyncio.sleep(0)
        await until(lambda: {k for _, k in api.calls} == {key("a"), key("b")})
        api.hold.set()
        await settle(writer)
    assert api.most_inflight[key("a")] == api.most_inflight[key("b")] == 1
    assert api.status(*key("a"))["flaps"] == api.status(*key("b"))["flaps"] == 9  # type: ignore[index]


async def test_dead_verdicts_jump_the_queue() -> None:
    async with running(1) as (writer, api, _):
        api.hold = asyncio.Event()
        api.objects[key("w", DW_PLURAL)] = {"metadata": {"name": "w"}}
        writer.want(Desired(DW_PLURAL, NS, "w", status={"tracked": 3}, priority=LOW))
        await until(lambda: bool(api.calls))  # the one worker is busy with the DeathWatch
        writer.want(sv("alive-1"))
        writer.want(sv("alive-2"))
        writer.want(sv("dead-1", state="Dead", priority=URGENT))
        api.hold.set()
        await settle(writer)
    order = [k[2] for op, k in api.calls if op == "create"]
    assert order == ["dead-1", "alive-1", "alive-2"]


async def test_urgency_survives_a_newer_ordinary_desire_for_the_same_object() -> None:
    async with running(1) as (writer, api, _):
        api.hold = asyncio.Event()
        writer.want(sv("a"))
        await until(lambda: bool(api.calls))  # a's Alive write is in flight
        writer.want(sv("b"))
        writer.want(sv("c"))
        writer.want(sv("a", state="Dead", priority=URGENT))
        writer.want(sv("a", state="Dead", flaps=1))  # ordinary, merged into the urgent one
        api.hold.set()
        await settle(writer)
    patched = [(k[2], p["state"]) for k, p in api.writes]
    assert patched == [("a", "Alive"), ("a", "Dead"), ("b", "Alive"), ("c", "Alive")]


async def test_backoff_is_kept_across_merges_and_newer_desires_wait_it_out() -> None:
    async with running() as (writer, api, timers):
        api.fail["replace_status"] = [503, 503, 503]
        writer.want(sv("a", flaps=1))
        await until(lambda: timers.waiting == 1)
        writer.want(sv("a", flaps=2))  # during the backoff: merged, not written at once
        writer.want(sv("a", flaps=3))
        await asyncio.sleep(0.05)
        assert api.operations(key("a")) == ["create", "replace_status"]
        while timers.fire():
            await until(lambda: timers.waiting == 1 or not api.fail["replace_status"])
            await asyncio.sleep(0.01)
        await settle(writer)
    assert timers.delays == list(WRITE[:3])  # 0.2, 0.5, 1.0: never reset by the merges
    assert api.operations(key("a")) == ["create", *["replace_status"] * 4]
    assert api.status(*key("a"))["flaps"] == 3  # type: ignore[index]


async def test_a_refusal_is_not_retried_and_later_desires_are_written() -> None:
    async with running() as (writer, api, timers):
        api.fail["replace_status"] = [422]
        writer.want(sv("a", state="Alive"))
        await settle(writer)
        assert timers.delays == []
        assert writer.metrics.api_errors.labels("replace_verdict_status", "422")._value.get() == 1
        writer.want(sv("a", state="Dead"))
        await settle(writer)
    assert api.status(*key("a"))["state"] == "Dead"  # type: ignore[index]


async def test_events_are_posted_once_and_before_the_verdict_they_announce() -> None:
    async with running() as (writer, api, _):
        d = sv("a", state="Dead", priority=URGENT)
        d.events = [dead_event("a")]
        writer.want(d)
        await settle(writer)
    assert api.operations(key("a")) == ["create", "replace_status"]
    assert [op for op, _ in api.calls] == ["create_event", "create", "replace_status"]
    # a restarted controller repeats the transition: the Event is not posted twice
    async with running() as (writer, api2, _):
        api2.objects, api2.events = api.objects, api.events
        d = sv("a", state="Dead", priority=URGENT)
        d.events = [dead_event("a")]
        writer.want(d)
        await settle(writer)
    assert len(api2.events) == 1
    assert writer.metrics.api_writes.labels("create_event")._value.get() == 0


async def test_a_death_of_an_existing_verdict_costs_one_round_trip() -> None:
    async with running() as (writer, api, _):
        writer.want(sv("a"))
        await settle(writer)
        api.hold = asyncio.Event()
        d = sv("a", state="Dead", priority=URGENT)
        d.events = [dead_event("a")]
        writer.want(d)
        # both requests are in flight at once, neither waits for the other
        await until(lambda: [op for op, _ in api.calls][-2:] in (
            ["replace_status", "create_event"], ["create_event", "replace_status"]))  # fmt: skip
        api.hold.set()
        await settle(writer)
    assert api.status(*key("a"))["state"] == "Dead"  # type: ignore[index]
    assert list(api.events) == [(NS, "a.uid-a.sandboxdead")]


async def test_an_event_that_failed_beside_its_verdict_is_posted_alone() -> None:
    async with running() as (writer, api, timers):
        writer.want(sv("a"))
        await settle(writer)
        api.fail["create_event"] = [503]
        d = sv("a", state="Dead", priority=URGENT)
        d.events = [dead_event("a")]
        writer.want(d)
        await until(lambda: timers.waiting == 1)
        assert api.status(*key("a"))["state"] == "Dead"  # type: ignore[index]
        timers.fire()
        await settle(writer)
    ops = [op for op, _ in api.calls]
    assert ops.count("replace_status") == 2  # Alive, Dead: the retry does not patch again
    assert ops.count("create_event") == 2 and list(api.events) == [(NS, "a.uid-a.sandboxdead")]


async def test_reconciled_events_are_posted_once_and_leave_pending_writes_standing() -> None:
    async with running(1) as (writer, api, _):
        writer.want(sv("a", state="Dead"))
        await settle(writer)
        api.events[(NS, "a.uid-a.sandboxdead")] = {"posted": "earlier"}
        api.hold = asyncio.Event()
        writer.want(sv("other"))
        await until(lambda: bool(api.calls) and api.calls[-1][1][2] == "other")
        writer.want(sv("b", state="Dead"))  # pending behind the busy worker
        writer.reconcile([dead_event("a"), dead_event("b")])
        api.hold.set()
        await settle(writer)
    assert api.status(*key("b"))["state"] == "Dead"  # type: ignore[index]
    assert api.events[(NS, "a.uid-a.sandboxdead")] == {"posted": "earlier"}  # 409: not twice
    assert (NS, "b.uid-b.sandboxdead") in api.events


async def test_an_event_posted_before_a_failure_is_not_posted_again() -> None:
    async with running() as (writer, api, timers):
        api.fail["create"] = [503]
        d = sv("a", state="Dead", priority=URGENT)
        d.events = [dead_event("a")]
        writer.want(d)
        await until(lambda: timers.waiting == 1)
        timers.fire()
        await settle(writer)
    assert [op for op, _ in api.calls] == ["create_event", "create", "create", "replace_status"]


async def test_a_verdict_deleted_behind_our_back_is_created_again() -> None:
    async with running() as (writer, api, timers):
        writer.want(sv("a", flaps=1))
        await settle(writer)
        del api.objects[key("a")]
        writer.want(sv("a", state="Dead", flaps=2))
        await settle(writer)
    assert timers.delays == []
    assert api.operations(key("a")) == [
        "create",
        "replace_status",
        "replace_status",
        "create",
        "replace_status",
    ]
    assert api.status(*key("a"))["flaps"] == 2  # type: ignore[index]


async def test_nothing_is_sent_for_a_status_the_api_already_holds() -> None:
    async with running() as (writer, api, _):
        version = api.put(SV_PLURAL, NS, "a", {"state": "Alive", "podUID": "uid-a"})
        writer.knows(SV_PLURAL, NS, "a", {"state": "Alive", "podUID": "uid-a"}, version)
        writer.want(sv("a"))
        await settle(writer)
        assert api.calls == []
        writer.want(sv("a", flaps=1))
        await settle(writer)
    # the whole status, stamped with the writer's term, at the version it was computed against
    assert api.writes == [(key("a"), {"state": "Alive", "podUID": "uid-a", "flaps": 1, "term": 0})]
    assert [op for op, _ in api.calls] == ["replace_status"]


async def test_a_write_made_meanwhile_by_another_replica_is_read_not_overwritten_blind() -> None:
    async with running() as (writer, api, _):
        writer.want(sv("a", state="Alive"))
        await settle(writer)
        # a replica that has lost the lease writes late; our precondition catches it
        api.put(SV_PLURAL, NS, "a", {"state": "Suspect", "podUID": "uid-a"})
        writer.want(sv("a", state="Dead", flaps=0))
        await settle(writer)
    assert api.status(*key("a")) == {"state": "Dead", "podUID": "uid-a", "flaps": 0}
    assert [op for op, _ in api.calls] == [
        "create", "replace_status", "replace_status", "read_status", "replace_status",
    ]  # fmt: skip
    assert writer.metrics.api_errors.labels("replace_verdict_status", "409")._value.get() == 1


async def test_a_late_write_of_a_replica_that_lost_the_lease_is_refused() -> None:
    """The other side: our write, held up and arriving after someone else's, fails (409)."""
    async with running() as (writer, api, timers):
        writer.want(sv("a", state="Alive"))
        await settle(writer)
        api.hold = asyncio.Event()
        writer.want(sv("a", state="Alive", flaps=1))  # in flight, held in the network...
        await until(lambda: len(api.calls) == 3)
        api.put(SV_PLURAL, NS, "a", {"state": "Dead", "podUID": "uid-a"})  # ...the new leader
        fence(writer)  # and we are fenced meanwhile
        api.hold.set()
        await asyncio.sleep(0.05)
    assert api.status(*key("a")) == {"state": "Dead", "podUID": "uid-a"}  # not undone
    assert timers.delays == []


async def test_a_status_is_replaced_whole_so_nothing_of_an_earlier_one_survives() -> None:
    async with running() as (writer, api, _):
        writer.want(sv("a", state="Suspect", deadline="2026-11-29T10:01:00Z"))
        await settle(writer)
        writer.want(sv("a", state="Alive"))
        await settle(writer)
    assert api.status(*key("a")) == {"state": "Alive", "podUID": "uid-a"}


async def test_delete_spares_a_newer_pod_of_the_same_name() -> None:
    async with running() as (writer, api, _):
        writer.want(sv("a"))
        await settle(writer)
        api.put(SV_PLURAL, NS, "a", {"state": "Alive", "podUID": "uid-a2"})  # a newer pod's
        writer.want(Desired(SV_PLURAL, NS, "a", delete="uid-a", priority=LOW))
        await settle(writer)
        assert key("a") in api.objects  # the 409 was read: not ours to delete
        writer.want(Desired(SV_PLURAL, NS, "a", delete="uid-a2", priority=LOW))
        await settle(writer)
    assert key("a") not in api.objects


async def test_a_refused_status_is_logged_once_and_not_sent_again_until_it_changes() -> None:
    """A DeathWatch stored under an older CRD whose status the current CRD refuses (422):
    never a loop of the same refused write, once a second, for ever."""
    async with running() as (writer, api, timers):
        api.objects[key("w", DW_PLURAL)] = {"metadata": {"name": "w"}}
        api.fail["replace_status"] = [422]
        invalid = {"conditions": [{"type": "Ready", "status": "False", "reason": "InvalidSpec"}]}
        for _ in range(5):  # the publish loop wants it every second
            writer.want(Desired(DW_PLURAL, NS, "w", status=invalid, priority=LOW))
            await settle(writer)
        assert api.operations(key("w", DW_PLURAL)) == ["read_status", "replace_status"]
        assert writer.metrics.writes_refused.labels(DW_PLURAL, "422")._value.get() == 1
        writer.want(Desired(DW_PLURAL, NS, "w", status={"tracked": 1}, priority=LOW))
        await settle(writer)
    assert timers.delays == []
    assert api.status(*key("w", DW_PLURAL)) == {"tracked": 1}  # a different one is tried


def test_failures_are_labelled_by_kind() -> None:
    """What the network does becomes NoAnswer in the API client (rest.py); each failure
    is labelled for the metrics by kind, and only the API's and the network's may pass."""
    import aiohttp

    from deathwatch._api.rest import _unreachable
    from deathwatch._kube.errors import ApiError, label, retryable

    def no_answer(exc: BaseException) -> BaseException:
        return _unreachable("GET", "/api/v1/pods", exc)

    cases: dict[BaseException, str] = {
        ApiError(409, "Conflict"): "409",
        ApiError(503, "Service Unavailable", b"{}"): "503",
        no_answer(TimeoutError()): "timeout",
        no_answer(aiohttp.ServerTimeoutError("read")): "timeout",
        no_answer(
            aiohttp.ClientConnectorError(
                aiohttp.client_reqrep.ConnectionKey("h", 1, True, True, None, None, None),
                OSError("refused"),
            )
        ): "connection",
        no_answer(aiohttp.ServerDisconnectedError()): "connection",
        no_answer(aiohttp.ClientPayloadError("cut")): "connection",
        no_answer(ConnectionResetError()): "connection",
        ValueError("x"): "ValueError",
    }
    assert {exc: label(exc) for exc in cases} == cases
    assert retryable(no_answer(TimeoutError())) and retryable(ApiError(503))
    assert not retryable(ApiError(422)) and not retryable(KeyError("status"))


async def test_a_bug_in_a_write_is_never_retried() -> None:
    """A programming error is no API failure: refused at once, said with its traceback,
    counted, and not sent again until the status changes (issue #30)."""
    async with running() as (writer, api, timers):
        api.fail["create"].append(KeyError("metadata"))
        writer.want(sv("a"))
        await settle(writer)
        assert timers.delays == []
        assert writer.metrics.writes_refused.labels(SV_PLURAL, "KeyError")._value.get() == 1
        writer.want(sv("a"))  # the same again: not sent
        await settle(writer)
        assert api.operations(key("a")) == ["create"]


@pytest.mark.parametrize("status", [404])
async def test_a_deathwatch_that_is_gone_is_not_retried(status: int) -> None:
    async with running() as (writer, api, timers):
        writer.want(Desired(DW_PLURAL, NS, "gone", status={"tracked": 0}, priority=LOW))
        await settle(writer)
    assert timers.delays == []
    # never seen, so its version is read first (no blind write): it is gone, nothing more
    assert api.operations(key("gone", DW_PLURAL)) == ["read_status"]


async def test_a_verdicts_latency_is_measured_once_when_the_api_first_holds_it_dead() -> None:
    """A Dead verdict is written again (its pod's deletion time, a new leader's rewrite): its
    latency counted then again would be the time since the death, not how long the verdict
    took (a drained pod's deletion 4 s later read as a 4 s verdict and fired the alert)."""
    drop = datetime.now(UTC) - timedelta(seconds=1)

    def dead(name: str, **kw: Any) -> Desired:
        d = sv(name, state="Dead", priority=URGENT, **kw)
        d.ready_drop_at = drop
        return d

    async with running() as (writer, api, _):
        writer.want(dead("a"))
        await settle(writer)
        writer.want(dead("a", podDeletedAt="x"))
        await settle(writer)
        # one already Dead when this replica first saw it (listed at start, a takeover)
        writer.knows(SV_PLURAL, NS, "b", {"state": "Dead", "podUID": "uid-b"}, "7")
        api.put(SV_PLURAL, NS, "b", {"state": "Dead", "podUID": "uid-b"})
        writer.knows(SV_PLURAL, NS, "b", {"state": "Dead", "podUID": "uid-b"},
                     api.version(SV_PLURAL, NS, "b"))  # fmt: skip
        writer.want(dead("b", podDeletedAt="x"))
        await settle(writer)
        count = writer.metrics.registry.get_sample_value("deathwatch_verdict_latency_seconds_count")
    assert [p.get("podDeletedAt") for k, p in api.writes if k == key("a")] == [None, "x"]
    assert [p.get("podDeletedAt") for k, p in api.writes if k == key("b")] == ["x"]
    assert count == 1


async def test_a_slot_this_shard_does_not_own_is_owed_and_written_once_it_is_gained() -> None:
    """Sharding: a desire for a slot not owned is owed (nothing sent), as a standby owes;
    gaining the slot returns it to be said; giving a slot up turns what is pending into debts
    and nothing more of it is sent, even a desire already queued."""
    owned: set[int] = {1}
    async with running() as (writer, api, _):
        writer.leadership.sharded_by(lambda slot: slot is None or slot in owned)
        a, b = sv("a"), sv("b")
        a.slot, b.slot = 1, 2
        writer.want(a)
        writer.want(b)
        await settle(writer)
        assert [k[2] for _, k in api.calls if k[2] in ("a", "b")] == ["a", "a"]  # create, status
        owned.add(2)
        assert writer.gained(frozenset({2})) == [key("b")]
        b2 = sv("b")
        b2.slot = 2
        writer.want(b2)
        await settle(writer)
        assert api.status(*key("b")) == {"state": "Alive", "podUID": "uid-b"}
        # given up: a queued desire is not sent, it is owed
        api.hold = asyncio.Event()
        c1, a2 = sv("c"), sv("a", state="Dead", priority=URGENT)
        c1.slot, a2.slot = 3, 1
        writer.want(c1)  # slot 3: owed
        owned.discard(1)
        writer.gave_up(frozenset({1}))
        writer.want(a2)
        api.hold.set()
        await settle(writer)
        assert api.status(*key("a")) == {"state": "Alive", "podUID": "uid-a"}
        assert writer.backlog == 2  # a's Dead and c, owed to whoever owns 1 and 3
