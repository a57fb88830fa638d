"""Leader election and the hot standby, in process: the elector against a fake Lease with a
test clock, and the writer's standby, takeover and fencing against the fake API. The same
behaviour is proven with real processes in the chaos lane (tests/chaos/test_ha.py)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest

from deathwatch._api.resources import DW_PLURAL, SV_PLURAL
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.leadership.group import Leadership
from deathwatch._operator.leadership.leader import Elector, LeaseTimings
from deathwatch._operator.leadership.owner import LeaseOwner
from deathwatch._operator.writing.desired import LOW, URGENT, Desired
from deathwatch._operator.writing.kube import ApiWrites, Fenced
from deathwatch._operator.writing.writer import Writer
from tests.builders import T0
from tests.fakeapi import FakeApi, FakeLease, FakeTimers, Link
from tests.writer_driver import dead_event, fence, lead, standing_by, until, workers

NS = "sandboxes"


def fake_lease() -> FakeLease:
    return FakeApi().lease("deathwatch-system", "deathwatch-controller")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Told:
    """A follower of the elector's Leadership: what it was told, in order."""

    def __init__(self, changes: list[bool]) -> None:
        self.changes = changes

    def lead(self, term: int | None) -> None:
        self.changes.append(True)

    def standby(self) -> None:
        self.changes.append(False)


def elector(
    lease: FakeLease, identity: str, clock: Clock, changes: list[bool] | None = None
) -> Elector:
    metrics = Metrics()
    leadership = Leadership(metrics, identity, elected=True)
    if changes is not None:
        leadership.follow(Told(changes))
    return Elector(
        lease, identity, "deathwatch-controller", "deathwatch-system", metrics,
        leadership=leadership, clock=clock, wall=lambda: T0 + timedelta(seconds=clock.t),
    )  # fmt: skip


async def test_the_first_candidate_acquires_and_the_second_stands_by() -> None:
    lease, clock, changes = fake_lease(), Clock(), list[bool]()
    a, b = elector(lease, "a", clock, changes), elector(lease, "b", clock)
    assert await a._try() is True
    a._renewed_at, a.is_leader = clock(), True
    assert lease.holder == "a"
    assert lease.lease is not None and lease.lease["spec"]["leaseDurationSeconds"] == 15
    assert await b._try() is False
    assert b.leader == "a"
    clock.t += 14.9  # the record has not changed for 14.9 s of b's own clock: still a's
    assert await b._try() is False
    assert await a._try() is True  # a renews: the record changes, b's count starts again
    clock.t += 14.9
    assert await b._try() is False
    assert lease.holder == "a"


async def test_a_silent_leader_is_taken_over_after_the_lease_duration_on_the_standbys_clock() -> (
    None
):
    lease, clock = fake_lease(), Clock()
    a, b = elector(lease, "a", clock), elector(lease, "b", clock)
    assert await a._try()
    assert await b._try() is False  # b sees the record now
    clock.t += 15.0
    assert await b._try() is True
    assert lease.holder == "b"
    assert lease.lease is not None and lease.lease["spec"]["leaseTransitions"] == 1


async def test_a_leader_that_cannot_renew_stops_writing_at_its_renew_deadline() -> None:
    lease, clock, changes = fake_lease(), Clock(), list[bool]()
    a = elector(lease, "a", clock, changes)
    task = asyncio.create_task(a.run())
    try:
        async with asyncio.timeout(5):
            while not a.is_leader:  # noqa: ASYNC110 - its own task flips it; waited with a deadline
                await asyncio.sleep(0.001)
        assert a.may_write() and changes == [True]
        lease.api.down = True  # the API stops answering: no renewal from here on
        clock.t += 9.99
        assert a.may_write()
        clock.t += 0.02  # 10 s since the last renewal, on a's own clock
        assert not a.may_write()  # at once, whatever its loop is doing
        assert a.status()["may_write"] is False
    finally:
        task.cancel()


async def test_a_leader_that_sees_another_holder_stops_at_once() -> None:
    lease, clock, changes = fake_lease(), Clock(), list[bool]()
    a = elector(lease, "a", clock, changes)
    a.timings = LeaseTimings(15, 10, 0.01)
    task = asyncio.create_task(a.run())
    try:
        async with asyncio.timeout(5):
            while not a.is_leader:  # noqa: ASYNC110 - its own task flips it; waited with a deadline
                await asyncio.sleep(0.001)
            assert lease.lease is not None
            lease.lease["spec"]["holderIdentity"] = "intruder"  # e.g. a's process was frozen
            lease.bump()
            while a.is_leader:  # noqa: ASYNC110 - its own task flips it; waited with a deadline
                await asyncio.sleep(0.001)
    finally:
        task.cancel()
    assert changes == [True, False]
    assert not a.may_write()


async def test_a_lost_race_is_a_conflict_not_a_second_leader() -> None:
    """b and c both find a's lease expired and read the same record; b writes first, so c's
    replace carries a stale resourceVersion and is refused: c does not lead."""
    lease, clock = fake_lease(), Clock()
    a, b, c = elector(lease, "a", clock), elector(lease, "b", clock), elector(lease, "c", clock)
    assert await a._try()
    assert await b._try() is False
    assert await c._try() is False
    clock.t += 20
    stale = copy.deepcopy(lease.lease)

    async def reads_before_b_writes() -> dict[str, Any] | None:
        return copy.deepcopy(stale)

    assert await b._try() is True
    c.api = type("Racing", (), {"get": staticmethod(reads_before_b_writes),
                                "replace": lease.replace, "create": lease.create})()  # fmt: skip
    assert await c._try() is False  # its replace was a 409
    assert lease.holder == "b"


async def test_release_hands_over_within_one_retry() -> None:
    lease, clock = fake_lease(), Clock()
    a, b = elector(lease, "a", clock), elector(lease, "b", clock)
    assert await a._try()
    a.is_leader, a._renewed_at = True, clock()
    assert await b._try() is False
    await a.release()
    assert lease.holder is None
    assert lease.lease is not None and lease.lease["spec"]["leaseDurationSeconds"] == 1
    assert not a.may_write()
    clock.t += 2  # b's next try, one retry period later
    assert await b._try() is True


async def _until(probe: Callable[[], bool], within: float = 5) -> None:
    async with asyncio.timeout(within):
        while not probe():  # noqa: ASYNC110 - other tasks flip it; waited with a deadline
            await asyncio.sleep(0.001)


async def test_a_standby_following_the_lease_takes_a_release_at_once() -> None:
    """On the watch, a release is seen the moment it happens: the standby tries then, not at
    its next retry (2 s; the clock here never moves, so only the watch can wake it)."""
    lease, clock = fake_lease(), Clock()
    a, b = elector(lease, "a", clock), elector(lease, "b", clock)
    assert await a._try()
    a.is_leader, a._renewed_at = True, clock()
    tasks = [asyncio.create_task(b.run()), asyncio.create_task(b.watch())]
    try:
        await _until(lambda: b.leader == "a" and bool(lease.watchers))
        await asyncio.sleep(0.05)
        assert not b.is_leader
        await a.release()
        await _until(lambda: b.is_leader, within=0.5)  # its retry period is 2 s
        assert lease.holder == "b"
    finally:
        for t in tasks:
            t.cancel()


async def test_a_standby_times_the_holder_from_the_renewal_it_watched() -> None:
    """Expiry counts from when the watch showed the holder's last renewal, and the standby
    tries at that instant: a dead leader's lease is taken after lease_duration, not up to a
    retry period later."""
    lease, clock = fake_lease(), Clock()
    a, b = elector(lease, "a", clock), elector(lease, "b", clock)
    lease.watchers.append(b.seen)  # b follows the lease
    assert await a._try()
    watched_at = clock()
    assert (
        b.seen_lease.takeable_at(b.identity) == watched_at + 15
    )  # the lease's own duration, on b's clock
    clock.t += 1.0
    assert await a._try()  # a renews; b's watch shows it
    assert b.seen_lease.takeable_at(b.identity) == clock() + 15
    # a reading of the same version through another path (a GET) does not restart the count
    clock.t += 5
    b.seen_lease.observe(copy.deepcopy(lease.lease))
    assert b.seen_lease.takeable_at(b.identity) == watched_at + 1.0 + 15


async def test_a_leader_fences_the_moment_the_watch_shows_another_holder() -> None:
    lease, clock, changes = fake_lease(), Clock(), list[bool]()
    a = elector(lease, "a", clock, changes)
    assert await a._try()
    a._set(True, "test")
    a._renewed_at = clock()
    assert lease.lease is not None
    intruded = copy.deepcopy(lease.lease)
    intruded["spec"]["holderIdentity"] = "intruder"
    intruded["metadata"]["resourceVersion"] = "99"
    a.seen("MODIFIED", intruded)
    assert not a.may_write() and changes == [True, False]


async def test_a_failing_watch_is_counted_and_the_elector_keeps_polling() -> None:
    lease, clock = fake_lease(), Clock()
    lease.api.down = True
    a = elector(lease, "a", clock)
    a.timings = LeaseTimings(0.3, 0.2, 0.01)
    task = asyncio.create_task(a.watch())
    try:
        await _until(lambda: a.metrics.api_errors.labels("lease_watch", "503")._value.get() >= 2)
    finally:
        task.cancel()
    lease.api.down = False
    assert await a._try()  # polling is unaffected


def test_the_timings_must_be_ordered() -> None:
    LeaseTimings(15, 10, 2)
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        LeaseTimings(10, 10, 2)


# --- the writer of a standby, a new leader and a fenced one ---------------------------------


def verdict(name: str, state: str, declared: str = "2026-11-29T10:00:05Z", **kw: Any) -> Desired:
    return Desired(
        SV_PLURAL, NS, name,
        status={"state": state, "podUID": f"uid-{name}", "declaredAt": declared, **kw},
        create={"metadata": {"name": name, "namespace": NS}, "spec": {}},
        priority=URGENT if state == "Dead" else 1,
    )  # fmt: skip


@asynccontextmanager
async def standby_writer(api: Any, may_write: Any = lambda: True) -> AsyncIterator[Writer]:
    writer = Writer(
        api, Metrics(), schedule=FakeTimers(), leadership=standing_by(Metrics(), may_write)
    )
    async with workers(writer):
        yield writer


def leaders_objects(api: FakeApi, *names: str) -> None:
    """What the old leader created (its status writes arrive through `observed`)."""
    for name in names:
        api.objects[(SV_PLURAL, NS, name)] = {"metadata": {"name": name, "namespace": NS}}


def leader_wrote(api: FakeApi, standby: Writer, name: str, status: dict[str, Any]) -> None:
    """The leader's status write, in the API and as the standby's watch then shows it."""
    version = api.put(SV_PLURAL, NS, name, {**status, "term": 1})
    standby.observed(SV_PLURAL, NS, name, {**status, "term": 1}, version)


async def test_a_standby_writes_nothing_and_on_takeover_only_what_differs() -> None:
    api = FakeApi()
    leaders_objects(api, "a", "b", "c")
    async with standby_writer(api) as w:
        dead = verdict("a", "Dead", declared="2026-11-29T10:00:05.120000Z")
        dead.events = [dead_event("a")]
        w.want(dead)
        w.want(verdict("b", "Dead"))
        w.want(verdict("c", "Alive"))
        await asyncio.sleep(0.05)
        assert api.calls == []  # standing by: nothing sent
        # the leader's writes, as the standby's watch sees them: a and c as we would have
        # written them, but with the leader's own times; b only as Alive so far
        leader_wrote(
            api, w, "a",
            {"state": "Dead", "podUID": "uid-a", "declaredAt": "2026-11-29T10:00:05.090000Z"},
        )  # fmt: skip
        leader_wrote(
            api, w, "c", {"state": "Alive", "podUID": "uid-c", "declaredAt": "2026-11-29T10:00:04Z"}
        )
        leader_wrote(api, w, "b", {"state": "Alive", "podUID": "uid-b"})
        assert w.backlog == 1  # only b is still owed (kept as a digest, not a document)
        owed = lead(w)  # the leader is gone: take over
        assert owed == [(SV_PLURAL, NS, "b")]
        w.want(verdict("b", "Dead"))  # what the controller does with it: says it again
        await asyncio.wait_for(w.idle(), 5)
    assert [(op, k[2]) for op, k in api.calls] == [("replace_status", "b")]  # nothing else
    assert api.events == {}  # a's Event went out with a's verdict, from the old leader


async def test_a_new_leader_posts_the_event_the_old_one_may_have_missed() -> None:
    api = FakeApi()
    leaders_objects(api, "a")
    async with standby_writer(api) as w:
        dead = verdict("a", "Dead")
        dead.events = [dead_event("a")]
        w.want(dead)
        leader_wrote(api, w, "a", {"state": "Alive", "podUID": "uid-a"})  # not yet Dead
        assert lead(w) == [(SV_PLURAL, NS, "a")]
        w.want(verdict("a", "Dead"))  # said again by the controller; the Event waited for it
        await asyncio.wait_for(w.idle(), 5)
    assert sorted(op for op, _ in api.calls) == ["create_event", "replace_status"]


async def test_a_new_leader_posts_the_event_lost_between_the_old_ones_two_writes() -> None:
    # the old leader's Dead verdict landed, its Event did not (a crash in between): the
    # standby's own desire was settled by the verdict; taking over reconciles the Event
    api = FakeApi()
    leaders_objects(api, "a")
    async with standby_writer(api) as w:
        dead = verdict("a", "Dead")
        dead.events = [dead_event("a")]
        w.want(dead)
        leader_wrote(
            api,
            w,
            "a",
            {"state": "Dead", "podUID": "uid-a", "declaredAt": "2026-11-29T10:00:04.980000Z"},
        )  # its own time
        assert w.backlog == 0  # settled by what the old leader wrote
        w.reconcile([dead_event("a")])  # what App does on takeover (controller.unannounced_deaths)
        lead(w)
        await asyncio.wait_for(w.idle(), 5)
    assert [op for op, _ in api.calls] == ["create_event"]
    assert list(api.events) == [(NS, "a.uid-a.sandboxdead")]


async def test_a_fenced_leader_sends_nothing_more_and_keeps_its_queue() -> None:
    api, allowed = FakeApi(), [True]
    api.objects[(SV_PLURAL, NS, "a")] = {"metadata": {"name": "a"}}
    writer = Writer(
        api, Metrics(), schedule=FakeTimers(), leadership=Leadership(Metrics(), "a", elected=False)
    )
    writer.leadership.fenced_by(lambda: allowed[0])
    async with workers(writer):
        writer.want(verdict("a", "Alive"))
        await asyncio.wait_for(writer.idle(), 5)
        allowed[0] = False  # the renew deadline passed
        writer.want(verdict("a", "Dead"))
        await asyncio.sleep(0.05)
        assert not writer.leading
        assert writer.backlog == 1  # kept, not flushed
        assert [k[2] for k, _ in api.writes] == ["a"]  # only the Alive write went out


async def test_the_check_is_made_again_right_before_each_request_goes_out() -> None:
    class Rest:
        def __init__(self) -> None:
            self.sent: list[str] = []

        async def request(self, method: str, path: str, **_: Any) -> bytes:
            self.sent.append(f"{method} {path}")
            return b'{"metadata": {"resourceVersion": "7"}}'

    rest, allowed = Rest(), [True]
    writes = ApiWrites(rest, may_write=lambda: allowed[0], field_manager="replica-a")  # type: ignore[arg-type]
    assert await writes.replace_status(SV_PLURAL, NS, "a", {}, "6") == "7"
    allowed[0] = False
    for call in (
        writes.replace_status(SV_PLURAL, NS, "a", {}, "7"),
        writes.create(SV_PLURAL, NS, {}),
        writes.delete(SV_PLURAL, NS, "a", "7"),
        writes.create_event(NS, {}),
    ):
        with pytest.raises(Fenced):
            await call
    assert rest.sent == [
        f"PUT /apis/deathwatch.dev/v1alpha1/namespaces/{NS}/sandboxverdicts/a/status"
    ]


# --- fencing: no write of an earlier term lands over a later one's (ADR 0011) -----------------


def dw(status: dict[str, Any]) -> Desired:
    return Desired(DW_PLURAL, NS, "sandboxes", status=status, priority=LOW)


async def test_a_leader_that_never_saw_an_object_reads_its_version_before_writing() -> None:
    """It took the Lease before its watch delivered the DeathWatch (a leader ignores its own
    watch): its first status write must still carry a precondition, never go blind."""
    api = FakeApi()
    api.objects[(DW_PLURAL, NS, "sandboxes")] = {"metadata": {"name": "sandboxes"}, "spec": {}}
    async with standby_writer(api) as w:
        lead(w, 1)
        w.want(dw({"tracked": 0, "leader": "a"}))
        await asyncio.wait_for(w.idle(), 5)
    assert [op for op, _ in api.calls] == ["read_status", "replace_status"]


async def test_a_held_first_write_of_the_old_leader_cannot_land_over_the_new_leaders() -> None:
    """The HA lane's race, in process: the old leader's first DeathWatch write is held in a
    partition; the new leader takes over and writes; the partition heals: the held write is
    refused (409), and the object keeps the new leader's status."""
    api = FakeApi()
    key = (DW_PLURAL, NS, "sandboxes")
    api.objects[key] = {"metadata": {"name": "sandboxes"}, "spec": {}}
    link_a = Link(api)
    a = Writer(link_a, Metrics(), schedule=FakeTimers(), leadership=standing_by(Metrics()))
    b = Writer(api, Metrics(), schedule=FakeTimers(), leadership=standing_by(Metrics()))
    async with workers(a), workers(b):
        lead(a, 1)  # a leads before its watch showed it the DeathWatch
        link_a.partition()
        a.want(dw({"tracked": 2, "alive": 2, "leader": "a"}))
        await until(lambda: link_a.waiting == 1)  # a's write (or its read) is in flight
        fence(a)  # fenced at its renew deadline
        b.observed(DW_PLURAL, NS, "sandboxes", {}, api.version(*key))  # b watched it
        lead(b, 2)
        b.want(dw({"tracked": 2, "dead": 2, "leader": "b"}))
        await asyncio.wait_for(b.idle(), 5)
        link_a.heal()
        await until(lambda: link_a.waiting == 0)
        await until(lambda: not a.queue.inflight)
    assert api.status(*key) == {"tracked": 2, "dead": 2, "leader": "b"}
    assert api.term(*key) == 2


async def test_a_new_terms_first_write_moves_the_version_even_if_it_says_nothing_new() -> None:
    """The no-op trap: a write that changes nothing leaves the resourceVersion where it was,
    so an earlier term's held write with that precondition would still land. The term stamp
    makes a new term's first write to any object a change."""
    api = FakeApi()
    key = (SV_PLURAL, NS, "a")
    old = api.put(SV_PLURAL, NS, "a", {"state": "Alive", "podUID": "uid-a", "term": 1})
    async with standby_writer(api) as b:
        # what b believes differs from what the API holds (a lagging or lossy view): the
        # write it sends says exactly what the object already says
        b.knows(SV_PLURAL, NS, "a", {"state": "Suspect", "podUID": "uid-a"}, old)
        lead(b, 2)
        b.want(verdict("a", "Alive"))
        await asyncio.wait_for(b.idle(), 5)
    assert api.version(*key) != old  # moved: a held write with precondition `old` is refused
    assert api.term(*key) == 2


async def test_a_write_of_another_term_seen_while_leading_is_counted_and_taken_as_known() -> None:
    api = FakeApi()
    version = api.put(SV_PLURAL, NS, "a", {"state": "Alive", "podUID": "uid-a", "term": 2})
    async with standby_writer(api) as w:
        w.observed(SV_PLURAL, NS, "a", {"state": "Alive", "podUID": "uid-a", "term": 2}, version)
        lead(w, 2)
        w.observed(SV_PLURAL, NS, "a", {"state": "Alive", "podUID": "uid-a", "term": 2}, version)
        assert w.metrics.foreign_writes.labels(SV_PLURAL)._value.get() == 0  # our own
        late = api.put(SV_PLURAL, NS, "a", {"state": "Suspect", "podUID": "uid-a", "term": 1})
        w.observed(SV_PLURAL, NS, "a", {"state": "Suspect", "podUID": "uid-a", "term": 1}, late)
        assert w.metrics.foreign_writes.labels(SV_PLURAL)._value.get() == 1
        w.want(verdict("a", "Dead"))  # written on top of what landed, not refused as stale
        await asyncio.wait_for(w.idle(), 5)
    assert api.status(SV_PLURAL, NS, "a") == {
        "state": "Dead", "podUID": "uid-a", "declaredAt": "2026-11-29T10:00:05Z",
    }  # fmt: skip
    assert [op for op, _ in api.calls] == ["replace_status"]


async def test_a_release_that_meets_its_own_late_renewal_reads_again_and_releases() -> None:
    """A renewal of the leader's own that lands between the release's read and its write
    makes the write a 409: the release reads again and clears the holder (once it gave up on
    the first 409, and the Lease stayed held by a process that was gone)."""
    lease, clock = fake_lease(), Clock()
    a = elector(lease, "a", clock)
    assert await a._try()
    a.is_leader, a._renewed_at = True, clock()
    reads = 0

    async def get_then_renewed() -> dict[str, Any] | None:
        nonlocal reads
        reads += 1
        current = await lease.get()
        if reads == 1:  # the held renewal lands right after this read
            lease.bump()
        return current

    a.api = type("Late", (), {"get": staticmethod(get_then_renewed), "replace": lease.replace,
                              "create": lease.create})()  # fmt: skip
    await a.release()
    assert reads == 2
    assert lease.holder is None


async def test_after_the_election_task_is_cancelled_no_renewal_follows_the_release() -> None:
    """Shutdown's order (app.stop): the supervised election loop is cancelled and awaited,
    then the Lease released; time passing after that takes nothing back."""
    from deathwatch._operator.instruments.supervisor import Supervisor

    lease, clock = fake_lease(), Clock()
    a = elector(lease, "a", clock)
    a.timings = LeaseTimings(lease_duration=1.5, renew_deadline=1.0, retry_period=0.01)
    supervisor = Supervisor(a.metrics)
    supervisor.start("leader-election", a.run)
    await _until(lambda: a.is_leader)
    await supervisor.cancel("leader-election")
    await a.release()
    assert lease.holder is None
    await asyncio.sleep(0.1)  # ten retry periods: nothing renews any more
    assert lease.holder is None
    assert "leader-election" not in supervisor._running
    await supervisor.stop()


class Owner(LeaseOwner):
    """The Lease's Deployment as a dict in memory (None: deleted)."""

    def __init__(self, metrics: Metrics) -> None:
        super().__init__(None, "deathwatch-system", "deathwatch-controller", metrics)  # type: ignore[arg-type]
        self.deployment: dict[str, Any] | None = {"metadata": {"uid": "u-1"}}

    async def _read(self) -> dict[str, Any] | None:
        return copy.deepcopy(self.deployment)


async def test_the_lease_belongs_to_its_deployment_and_is_not_made_again_once_that_is_gone() -> (
    None
):
    """An uninstall deletes the Deployment, and the garbage collector its Lease: a replica of
    that Deployment never creates the Lease again (it would claim every slot while its
    successors take them); while the Deployment exists, a deleted Lease is made again, in a
    new term."""
    lease, clock = fake_lease(), Clock()
    a = elector(lease, "a", clock)
    a.owner = owner = Owner(a.metrics)
    await owner.learn()
    assert await a._try()
    a._set(True, "test")
    assert lease.lease is not None
    assert lease.lease["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": "deathwatch-controller",
            "uid": "u-1",
        }
    ]
    assert await a._try()  # a renewal keeps it
    assert lease.lease["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    # a person deletes the Lease: the leader stands down, then makes it again, a new term
    terms: list[int | None] = []
    a.leadership.follow(type("T", (), {"lead": lambda s, t: terms.append(t),
                                        "standby": lambda s: terms.append(None)})())  # fmt: skip
    a.seen("DELETED", None)
    assert not a.is_leader and terms == [None]
    del lease.api.objects[lease.key]
    assert await a._try()
    a._set(True, "test")
    assert terms == [None, 0]
    # the Deployment is deleted, then its Lease: the leader stands down and makes nothing
    owner.deployment = None
    del lease.api.objects[lease.key]
    assert await a._try() is False
    assert not a.is_leader and lease.lease is None
    assert a._orphaned  # its next try waits a retry period: never a loop of reads
    # a Deployment of the same name made again (a reinstall) is another owner: not this one's
    owner.deployment = {"metadata": {"uid": "u-2"}}
    assert await a._try() is False and lease.lease is None
    # being deleted in the foreground (Argo CD's prune): it stands until its pods are gone,
    # and it is gone as far as its Lease goes
    owner.deployment = {"metadata": {"uid": "u-1", "deletionTimestamp": "2026-12-06T00:00:00Z"}}
    assert await a._try() is False and lease.lease is None
    owner.deployment = {"metadata": {"uid": "u-1"}}
    assert await a._try() is True  # standing again (a person deleted only the Lease)


async def test_an_owner_that_cannot_be_read_is_said_and_the_lease_works_without_one() -> None:
    lease, clock = fake_lease(), Clock()
    a = elector(lease, "a", clock)
    a.owner = owner = Owner(a.metrics)
    owner.deployment = None
    await owner.learn()
    assert owner.reference is None and owner.error is not None
    assert "not found" in owner.error
    assert await a._try()
    assert lease.lease is not None and "ownerReferences" not in lease.lease["metadata"]
    assert a.status()["owner"]["error"] == owner.error


async def test_a_refused_replica_never_leads_and_a_leader_refused_stops_at_once() -> None:
    """ADR 0038: another release's controller, applied first, serves these DeathWatches: a
    replica of the later release never takes the Lease, and one that leads stops at its next
    try, before the other's verdicts could see a second writer."""
    lease, clock, changes = fake_lease(), Clock(), list[bool]()
    refused: list[str | None] = ["controller id '' is served by the controller of release x"]
    a = elector(lease, "a", clock, changes)
    a.refusal = lambda: refused[0]
    assert await a._try() is False
    assert lease.lease is None  # not even created
    refused[0] = None
    assert await a._try() is True
    a._set(True, "acquired")
    assert changes == [True]
    refused[0] = "refused again"
    assert await a._try() is False
    assert a.is_leader is False and changes == [True, False]
