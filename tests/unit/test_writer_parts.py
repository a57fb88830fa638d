"""The writer's parts on their own seams: the leader's queue (writing/queue.py) and the
standby's debts (writing/debts.py). The writer over them: test_writer.py, test_leader.py."""

from __future__ import annotations

import asyncio

from deathwatch._api.resources import EventReason
from deathwatch._operator.reporting.pod_events import KubeEvent
from deathwatch._operator.writing.debts import Debts
from deathwatch._operator.writing.desired import LOW, NORMAL, URGENT, Desired
from deathwatch._operator.writing.queue import WriteQueue
from deathwatch._operator.writing.status_writes import Held, gist
from tests.fakeapi import FakeTimers

NS = "sandboxes"


def desired(name: str, state: str = "Alive", priority: int = NORMAL, slot: int | None = None,
            events: list[KubeEvent] | None = None) -> Desired:  # fmt: skip
    return Desired("sandboxverdicts", NS, name, status={"state": state}, priority=priority,
                   slot=slot, events=list(events or []))  # fmt: skip


def event(name: str, reason: EventReason = EventReason.SANDBOX_DEAD) -> KubeEvent:
    return KubeEvent(NS, name, f"uid-{name}", reason, "said")


async def test_the_queue_takes_dead_first_and_the_latest_desire_of_each_object() -> None:
    queue = WriteQueue(lambda: True)
    queue.want(desired("a"))
    queue.want(desired("b"))
    queue.want(desired("a", "Suspect"))  # merges into a's: one desire, the latest
    queue.want(desired("c", "Dead", priority=URGENT))
    taken = [await queue.take() for _ in range(3)]
    assert [(d.name, d.status) for d in taken if d] == [
        ("c", {"state": "Dead"}), ("a", {"state": "Suspect"}), ("b", {"state": "Alive"}),
    ]  # fmt: skip
    assert len(queue) == 0


async def test_one_write_in_flight_per_object_and_a_newer_desire_after_it() -> None:
    queue = WriteQueue(lambda: True)
    queue.want(desired("a"))
    first = await queue.take()
    assert first is not None
    queue.inflight.add(first.key)
    queue.want(desired("a", "Dead"))  # while the first is in flight: waits
    assert queue._queue.empty()
    queue.done(first.key)  # the write ended: the newer one goes in line
    second = await asyncio.wait_for(queue.take(), 1)
    assert second is not None and second.status == {"state": "Dead"}


async def test_a_failed_desire_waits_out_its_backoff_and_merges_newer_ones() -> None:
    timers = FakeTimers()
    queue = WriteQueue(lambda: True, timers)
    queue.want(desired("a", events=[event("a")]))
    d = await queue.take()
    assert d is not None
    queue.retry(d, 2.0)
    queue.want(desired("a", "Dead"))  # merged into the waiting one, not in line before 2 s
    assert queue._queue.empty()
    timers.fire()
    again = await asyncio.wait_for(queue.take(), 1)
    assert again is not None and again.status == {"state": "Dead"}
    assert again.events == [event("a")]  # the failed desire's Event is still owed


async def test_standing_by_nothing_is_in_line_and_the_queue_is_idle() -> None:
    leading = False
    queue = WriteQueue(lambda: leading)
    queue.want(desired("a"))
    assert queue._queue.empty() and "a" in {k[2] for k in queue.pending}
    queue.update_idle()  # as the writer does when it stands down
    await asyncio.wait_for(queue.idle(), 1)  # nothing it could write now: idle
    leading = True
    queue.enqueue(("sandboxverdicts", NS, "a"))
    assert (await queue.take()) is not None


async def test_slots_given_up_take_their_desires_out() -> None:
    queue = WriteQueue(lambda: True)
    queue.want(desired("a", slot=1))
    queue.want(desired("b", slot=2))
    queue.want(desired("c"))  # not a sandbox's: no slot, never given up
    given = queue.give_up(lambda slot: slot == 1)
    assert [d.name for d in given] == ["a"]
    assert sorted(k[2] for k in queue.pending) == ["b", "c"]


def test_debts_merge_their_events_keep_the_urgency_and_are_settled_by_the_leader() -> None:
    debts = Debts()
    debts.owe(desired("a", "Dead", priority=URGENT, events=[event("a")]))
    debts.owe(
        desired(
            "a",
            "Dead",
            priority=LOW,
            events=[event("a"), event("a", EventReason.NODE_EXIT_DISPUTED)],
        )
    )
    debts.owe(desired("b", "Alive"))
    assert len(debts) == 2
    held = {("sandboxverdicts", NS, "b"): Held(gist({"state": "Alive"}), "7")}
    debts.settle(("sandboxverdicts", NS, "b"), held[("sandboxverdicts", NS, "b")])
    assert len(debts) == 1
    ((key, debt),) = debts.take(lambda slot: True, held)
    assert key == ("sandboxverdicts", NS, "a")
    assert debt.priority == URGENT
    assert debt.events == [event("a"), event("a", EventReason.NODE_EXIT_DISPUTED)]
    assert len(debts) == 0


def test_a_takeover_takes_only_what_the_api_does_not_hold_or_has_events_to_post() -> None:
    debts = Debts()
    debts.owe(desired("held", "Dead", slot=1))  # the leader wrote it; its watch not seen yet
    debts.owe(desired("owed", "Dead", slot=1))
    debts.owe(desired("other-slot", "Dead", slot=2))
    held = {("sandboxverdicts", NS, "held"): Held(gist({"state": "Dead"}), "9")}
    taken = debts.take(lambda slot: slot == 1, held)
    assert [key[2] for key, _ in taken] == ["owed"]
    assert len(debts) == 1  # the other slot's, still owed
