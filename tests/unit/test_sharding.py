"""The shard a pod belongs to: the hash (Go's hash/fnv on the same vectors; the apiserver
lane asks Go itself), the slots each of N shards owns, and the selector as the API server
writes it back."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deathwatch._operator.shards import slots

# `go run` of hash/fnv.New64a over these strings (tests/apiserver/test_shards.py runs it live)
GO_FNV1A64 = {
    "": 0xCBF29CE484222325,
    "a": 0xAF63DC4C8601EC8C,
    "foobar": 0x85944171F73967E8,
    "3f1c2a9e-8b7d-4c6e-9f10-2a3b4c5d6e7f": 0x51B7BCB5B376665A,
    "00000000-0000-0000-0000-000000000000": 0x7C384C6218F299F1,
    "ffffffff-ffff-ffff-ffff-ffffffffffff": 0x7718F1B2F3CDD331,
    "team-a": 0xDE90A3717D1252D6,
    "ü": 0x0AC20A07B71807EA,
}


def test_the_hash_is_gos_fnv1a64_and_the_slot_its_top_six_bits() -> None:
    for value, expected in GO_FNV1A64.items():
        assert slots.fnv1a64(value) == expected, value
    assert slots.slot_of("3f1c2a9e-8b7d-4c6e-9f10-2a3b4c5d6e7f") == 0x51B7BCB5B376665A >> 58


@pytest.mark.parametrize("shards", [1, 2, 3, 4, 5, 7, 64])
def test_n_shards_partition_the_slots_in_runs(shards: int) -> None:
    owned = [slots.assign(i, shards) for i in range(shards)]
    assert sorted(s for o in owned for s in o) == list(range(64))  # each slot exactly once
    assert all(len(slots.runs(o)) == 1 for o in owned)  # one range each: one shardRange()
    assert max(map(len, owned)) - min(map(len, owned)) <= 1
    with pytest.raises(ValueError, match="expected 0 <= shard < shards"):
        slots.assign(shards, shards)


def test_the_selector_is_what_the_api_server_echoes() -> None:
    assert slots.selector(range(64)) == ""
    assert slots.selector(slots.assign(0, 2)) == (
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"
    )
    assert slots.selector(slots.assign(3, 4)) == (
        "shardRange(object.metadata.uid, '0xc000000000000000', '0x10000000000000000')"
    )
    # a reshard's holes: one range per run, joined as the server joins them
    assert slots.selector({0, 1, 5}) == (
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x0800000000000000') || "
        "shardRange(object.metadata.uid, '0x1400000000000000', '0x1800000000000000')"
    )


@given(st.frozensets(st.integers(0, 63)))
def test_slots_read_back_from_their_description(owned: frozenset[int]) -> None:
    assert slots.parse(slots.describe(owned)) == owned


@given(st.uuids())
def test_a_uid_is_in_the_range_of_its_slot(uid: object) -> None:
    text = str(uid)
    slot = slots.slot_of(text)
    low, high = slot << 58, (slot + 1) << 58
    assert low <= slots.fnv1a64(text) < high


def test_a_bad_slot_description_names_the_part() -> None:
    with pytest.raises(ValueError, match="'64' is outside 0-63"):
        slots.parse("0-3,64")
    with pytest.raises(ValueError, match="'x' is not a slot"):
        slots.parse("x")


# --- who owns which slots: the shards' Leases (slot_claims.py) -----------------------------------

from deathwatch._operator.shards.slot_claims import (  # noqa: E402
    ALL,
    SlotClaim,
    Spec,
    claim_annotations,
    handover,
    read_claim,
)


def lease(
    name: str, spec: Spec, owned: frozenset[int], holder: str | None = "p"
) -> dict[str, object]:
    return {"metadata": {"name": name, "annotations": claim_annotations(spec, owned)},
            "spec": {"holderIdentity": holder}}  # fmt: skip


def claims(*leases: tuple[dict[str, object], bool]) -> list[SlotClaim]:
    out = [read_claim(body, live) for body, live in leases]
    assert all(c is not None for c in out)
    return [c for c in out if c is not None]


def test_a_lease_says_its_shard_epoch_and_slots_and_reads_back() -> None:
    body = lease("dw-shard-1", Spec(1, 3, 7), frozenset(range(21, 30)))
    c = read_claim(body, True)
    assert c == SlotClaim("dw-shard-1", "p", 1, 3, 7, frozenset(range(21, 30)), True)
    released = read_claim(lease("dw-shard-1", Spec(1, 3, 7), frozenset(), holder=None), True)
    assert released is not None and released.live is False  # released: claims nothing
    assert read_claim({"metadata": {"name": "someone-elses"}}, True) is None
    assert read_claim({"metadata": {"annotations": {"deathwatch.dev/shard": "5/3",
                                                    "deathwatch.dev/epoch": "1"}}}, True) is None  # fmt: skip


def test_a_shard_gains_what_nobody_live_claims_and_waits_for_the_rest() -> None:
    me = Spec(1, 4, 2)  # slots 16-31
    old0 = lease("dw-shard-0", Spec(0, 3, 1), frozenset(range(0, 21)))  # old epoch: 0-20
    d = handover(me, frozenset(), claims((old0, True)), "dw-shard-1")
    assert d.gain == frozenset(range(21, 32)) and set(d.waiting) == set(range(16, 21))
    # the old owner's Lease expired (or it gave them up): gained
    d = handover(me, d.gain, claims((old0, False)), "dw-shard-1")
    assert d.gain == frozenset(range(16, 21)) and d.waiting == {}


def test_an_older_epoch_gives_up_what_a_live_newer_shard_is_assigned_and_gains_nothing_of_it() -> (
    None
):
    me = Spec(0, 3, 1)  # 0-20, epoch 1
    owned = frozenset(range(0, 21))
    newer1 = lease("dw-shard-1", Spec(1, 4, 2), frozenset(range(21, 32)))  # 16-31 assigned
    d = handover(me, owned, claims((newer1, True)), "dw-shard-0")
    assert d.give_up == frozenset(range(16, 21)) and d.gain == frozenset()
    # the newer shard not live yet: keep writing them
    assert handover(me, owned, claims((newer1, False)), "dw-shard-0").give_up == frozenset()


def test_one_shard_owns_everything_and_a_misconfigured_reshard_gains_nothing_contested() -> None:
    solo = Spec()
    assert solo.slots == ALL and solo.lease("deathwatch-controller") == "deathwatch-controller"
    assert handover(solo, frozenset(), [], "deathwatch-controller").gain == ALL
    assert Spec(2, 3).lease("deathwatch-controller") == "deathwatch-controller-shard-2"
    me = Spec(0, 2, 5)  # 0-31
    stray = lease("dw-shard-1", Spec(1, 4, 5), frozenset())  # same epoch, another count
    d = handover(me, frozenset(), claims((stray, True)), "dw-shard-0")
    assert d.conflict is not None and "same epoch 5" in d.conflict
    assert d.gain == frozenset(range(0, 16))  # 16-31 is also the stray's: not taken
    with pytest.raises(ValueError, match="expected 0 <= shard < shards"):
        Spec(3, 3)


@given(st.integers(1, 8), st.integers(1, 8))
def test_through_any_reshard_no_slot_ever_has_two_owners(before: int, after: int) -> None:
    """Every shard of both configs deciding in turn, the old ones giving up before the new
    ones gain (the Lease says it between): at no step do two live leases own one slot, and
    in the end the new shards own all 64."""
    old = {f"old-{i}": (Spec(i, before, 1), assign_all(i, before)) for i in range(before)}
    new = {f"new-{i}": (Spec(i, after, 2), frozenset[int]()) for i in range(after)}
    state = {**old, **new}
    for _ in range(4):
        for name in list(state):
            spec, owned = state[name]
            seen = claims(*((lease(n, s, o), True) for n, (s, o) in state.items()))
            d = handover(spec, owned, seen, name)
            state[name] = (spec, (owned - d.give_up) | d.gain)
            owners = [s for _, o in state.values() for s in o]
            assert len(owners) == len(set(owners)), state
    assert sorted(s for n, (_, o) in state.items() if n.startswith("new") for s in o) == list(
        range(64)
    )


def assign_all(i: int, n: int) -> frozenset[int]:
    return Spec(i, n).slots


# --- a shard's controller: its slots only, verdicts labelled, its part of the status ---------

from deathwatch._api.objects import EventType  # noqa: E402
from deathwatch._api.resources import DW_PLURAL, SV_PLURAL  # noqa: E402
from deathwatch._engine.podview import read_pod  # noqa: E402
from deathwatch._operator.instruments.metrics import Metrics  # noqa: E402
from deathwatch._operator.memory.core import Core  # noqa: E402
from deathwatch._operator.memory.deathwatches import DeathWatches  # noqa: E402
from deathwatch._operator.passes import publishing  # noqa: E402
from deathwatch._operator.passes.wiring import Passes  # noqa: E402
from deathwatch._operator.shards.filter import ShardFilter  # noqa: E402
from deathwatch._operator.shards.slots import assign, slot_of  # noqa: E402
from deathwatch._operator.writing.writer import Writer  # noqa: E402
from deathwatch._policies import default_registry  # noqa: E402
from tests.builders import at, pod  # noqa: E402
from tests.fakeapi import FakeApi, FakeTimers  # noqa: E402
from tests.unit.test_core import NS, Clock, as_deathwatch, deathwatch_body  # noqa: E402
from tests.writer_driver import the_only_writer, workers  # noqa: E402


def uids_in(slots: frozenset[int], n: int) -> list[str]:
    """n pod uids whose slots are in `slots`."""
    found: list[str] = []
    i = 0
    while len(found) < n:
        uid = f"uid-{i:05d}"
        if slot_of(uid) in slots:
            found.append(uid)
        i += 1
    return found


def shard_controller(api: FakeApi, index: int, count: int, clock: Clock) -> tuple[Passes, Writer]:
    spec = Spec(index, count, 3)
    owned = spec.slots
    metrics = Metrics()
    leadership = the_only_writer(metrics)
    leadership.sharded_by(lambda slot: slot is None or slot in owned)
    writer = Writer(api, metrics, schedule=FakeTimers(), clock=clock, leadership=leadership)
    registry = default_registry()
    c = Passes(Core(DeathWatches(registry), shards=ShardFilter(spec, lambda: owned)),
               writer=writer, metrics=Metrics(), policies=registry, clock=clock)  # fmt: skip
    return c, writer


async def test_each_shard_judges_its_slots_labels_its_verdicts_and_shard_0_sums_the_parts() -> None:
    api, clock = FakeApi(), Clock()
    api.objects[(DW_PLURAL, NS, "sandboxes")] = deathwatch_body()
    (c0, w0), (c1, w1) = shard_controller(api, 0, 2, clock), shard_controller(api, 1, 2, clock)
    mine0, mine1 = uids_in(assign(0, 2), 3), uids_in(assign(1, 2), 2)
    async with workers(w0), workers(w1):
        for c in (c0, c1):
            c.owners.on_deathwatch(EventType.LISTED, as_deathwatch(deathwatch_body()))
        clock.now = at(2)
        for i, uid in enumerate(mine0 + mine1):
            for c in (c0, c1):  # every shard's watch, as if the server filtered nothing
                c.pods.on_pod(EventType.MODIFIED, read_pod(pod(uid=uid, name=f"sbx-{i}")))
        assert {r.uid for r in c0.core.records} == set(mine0)
        assert {r.uid for r in c1.core.records} == set(mine1)
        assert c0.metrics.registry.get_sample_value("deathwatch_shard_filtered_total",
                                                    {"where": "pods"}) == 2  # fmt: skip
        await asyncio.wait_for(asyncio.gather(w0.idle(), w1.idle()), 5)
        for i, uid in enumerate(mine0 + mine1):
            labels = api.labels(SV_PLURAL, NS, f"sbx-{i}")
            assert labels["deathwatch.dev/slot"] == str(slot_of(uid)), labels
        # each its part; shard 0 the totals, from the part shard 1 wrote (as kopf shows it)
        c1.status.publish(publishing.Liveness(leader=lambda: "pod-1"))
        await asyncio.wait_for(w1.idle(), 5)
        c0.owners.on_deathwatch(
            EventType.LISTED,
            as_deathwatch({**deathwatch_body(), "status": api.status(DW_PLURAL, NS, "sandboxes")}),
        )
        c0.status.publish(publishing.Liveness(leader=lambda: "pod-0"))
        await asyncio.wait_for(w0.idle(), 5)
    status = api.status(DW_PLURAL, NS, "sandboxes")
    assert status is not None
    assert [(p["shard"], p["tracked"], p["leader"]) for p in status["shards"]] == [
        (0, 3, "pod-0"), (1, 2, "pod-1")]  # fmt: skip
    assert (status["tracked"], status["alive"], status["leader"]) == (5, 5, "0=pod-0 1=pod-1")
    assert [op for op, k in api.calls if k[0] == DW_PLURAL] == ["apply_status", "apply_status"]


async def test_a_shards_counts_are_written_at_most_every_part_every_and_its_leader_at_once() -> (
    None
):
    """#43: three shards under churn wrote the DeathWatch's status three times a second. A
    shard other than 0 writes its counts at most every PART_EVERY (shard 0's totals are
    then right within that and a second); a new leader or new slots at once."""
    api, clock = FakeApi(), Clock()
    api.objects[(DW_PLURAL, NS, "sandboxes")] = deathwatch_body()
    c1, w1 = shard_controller(api, 1, 2, clock)
    uids = iter(enumerate(uids_in(assign(1, 2), 6)))

    def writes() -> int:
        return sum(1 for op, k in api.calls if op == "apply_status" and k[0] == DW_PLURAL)

    async def publish(leader: str = "pod-1") -> int:
        c1.status.publish(publishing.Liveness(leader=lambda: leader))
        await asyncio.wait_for(w1.idle(), 5)
        return writes()

    async with workers(w1):
        c1.owners.on_deathwatch(EventType.LISTED, as_deathwatch(deathwatch_body()))
        clock.now = at(2)

        def one_more() -> None:
            i, uid = next(uids)
            c1.pods.on_pod(EventType.MODIFIED, read_pod(pod(uid=uid, name=f"sbx-{i}")))

        one_more()
        assert await publish() == 1
        for second in range(1, 5):  # a sandbox more every second: not written before 5 s
            clock.now = at(2 + second)
            one_more()
            assert await publish() == 1, second
        clock.now = at(2 + 5)
        assert await publish() == 2
        part = api.status(DW_PLURAL, NS, "sandboxes")["shards"][0]  # type: ignore[index]
        assert (part["shard"], part["tracked"]) == (1, 5)
        clock.now = at(2 + 6)
        assert await publish("pod-1b") == 3  # another leader: said at once
        assert await publish("pod-1b") == 3  # and nothing new: nothing written


async def test_a_standby_times_the_other_leases_so_on_taking_over_it_waits_only_what_is_left() -> (
    None
):
    """A Lease first seen counts as just renewed. A standby reads the shards' Leases too, so a
    dead holder's Lease (here: a one-shard release's, left behind) has been timed by the time
    it leads, and is not waited out again from zero (seen: 15 s more per leader change)."""
    from deathwatch._operator.instruments.metrics import Metrics
    from deathwatch._operator.leadership.group import Leadership
    from deathwatch._operator.shards.slot_leases import Ownership

    t = [100.0]
    left = {**lease("dw", Spec(0, 1, 0), ALL, holder="gone"),
            "spec": {"holderIdentity": "gone", "leaseDurationSeconds": 15}}  # fmt: skip
    left["metadata"] = {**left["metadata"], "resourceVersion": "7"}  # type: ignore[dict-item]

    def replica() -> tuple[Ownership, Leadership]:
        metrics = Metrics()
        leadership = Leadership(metrics, "me", elected=True)
        mine = Ownership(Spec(0, 2, 5), "dw-shard-0", "ns", metrics, 2.0, leadership,
                         clock=lambda: t[0])  # fmt: skip
        leadership.follow(mine)
        return mine, leadership

    class Rest:
        reads = 0

        async def request(self, method: str, path: str, **_: object) -> bytes:
            Rest.reads += 1
            return json.dumps({"items": [left]}).encode()

    warm, warm_lead = replica()
    warm.retry_period = 0.001
    loop = asyncio.create_task(warm.run(Rest()))  # type: ignore[arg-type]
    async with asyncio.timeout(5):
        while Rest.reads < 2:  # noqa: ASYNC110 - standing by, its loop reads them all the same
            await asyncio.sleep(0.001)
    loop.cancel()
    assert warm.owned == frozenset()  # timed, nothing gained
    t[0] += 15.0
    cold, cold_lead = replica()
    warm_lead.lead(1, "test")
    cold_lead.lead(1, "test")
    warm_step, cold_step = warm.step([left]), cold.step([left])
    assert warm_step is not None and warm_step.gain == Spec(0, 2, 5).slots
    assert cold_step is not None and cold_step.gain == frozenset()  # first seen: 15 s more
