"""The controller's side of ADR 0038: it reads every release's workloads (and its CRDs), does
not lead before it has, gives way to an older release serving its DeathWatches, and says
each collision once (log, Event, gauge), clearing it when it ends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.leadership.group import Leadership
from deathwatch._operator.leadership.rivals import Rivals, keep_off
from tests.unit.test_releases import obj


class Api:
    """The calls Rivals makes, answered from lists it holds; every POST kept."""

    def __init__(self) -> None:
        self.items: dict[str, list[dict[str, Any]]] = {"deployments": [], "daemonsets": []}
        self.crds: dict[str, dict[str, Any]] = {}
        self.posted: list[dict[str, Any]] = []
        self.fail: Exception | None = None

    async def get(self, path: str, **params: str | int) -> Any:
        if self.fail is not None:
            raise self.fail
        assert params == {"labelSelector": "app.kubernetes.io/part-of=deathwatch"}
        return {"items": self.items[path.rsplit("/", 1)[1]]}

    async def find(self, path: str, deadline: float = 30) -> dict[str, Any] | None:
        return self.crds.get(path.rsplit("/", 1)[1])

    async def request(self, method: str, path: str, **kw: Any) -> bytes:
        assert method == "POST" and path.endswith("/events")
        self.posted.append(kw["body"])
        return b"{}"


async def test_it_does_not_lead_before_it_knows_then_gives_way_to_an_older_release() -> None:
    api, metrics = Api(), Metrics()
    rivals = Rivals(api, metrics, "dw-2", "again-deathwatch-controller",  # type: ignore[arg-type]
                    "dw-2/again-deathwatch-firewall", "dw-2/again")  # fmt: skip
    assert rivals.refusal() is not None and "not been read yet" in str(rivals.refusal())
    api.fail = OSError("connection refused")
    with pytest.raises(OSError):  # the task counts and logs it (run), and reads again
        await rivals.check()
    assert rivals.refusal() is not None  # still not read: still not leading
    api.fail = None
    mine = obj("dw-2", "again", "controller", "2026-12-02T00:00:00Z", controller_id="")
    api.items["deployments"] = [mine]
    await rivals.check()
    assert rivals.refusal() is None and rivals.messages() == []
    first = obj("dw", "prod", "controller", "2026-12-01T00:00:00Z", controller_id="")
    api.items["deployments"] = [first, mine]
    api.crds["deathwatches.deathwatch.dev"] = {
        "metadata": {"annotations": {"deathwatch.dev/release": "dw/prod"}}}  # fmt: skip
    await rivals.check()
    refusal = rivals.refusal()
    assert refusal is not None and "release prod (namespace dw" in refusal
    assert len(rivals.messages()) == 2  # the controller id, and the CRD both apply
    assert [e["reason"] for e in api.posted] == ["ReleaseCollision", "ReleaseCollision"]
    assert api.posted[0]["involvedObject"]["name"] == "again-deathwatch-controller"
    gauge = metrics.release_collisions.labels("controller-id", "dw/prod", "true")
    assert gauge._value.get() == 1
    await rivals.check()
    assert len(api.posted) == 2  # said once, not at every check
    # the older release uninstalled, its CRDs applied by this one: nothing shared
    api.items["deployments"] = [mine]
    api.crds.clear()
    await rivals.check()
    assert rivals.refusal() is None and rivals.messages() == []
    samples = {s.labels["what"] for m in metrics.registry.collect() for s in m.samples
               if s.name == "deathwatch_release_collisions"}  # fmt: skip
    assert samples == set()  # the series removed, not left at 1


class Follower:
    """A part that writes only while this replica leads: what it was told, in order."""

    def __init__(self) -> None:
        self.told: list[str] = []
        self.changed = asyncio.Event()

    def lead(self, term: int | None) -> None:
        self.told.append("lead")
        self.changed.set()

    def standby(self) -> None:
        self.told.append("standby")
        self.changed.set()

    async def told_to(self, what: str) -> None:
        async with asyncio.timeout(2):
            while not self.told or self.told[-1] != what:
                self.changed.clear()
                await self.changed.wait()


class Counted(Rivals):
    """Rivals whose `refusal` counts how often it was asked, and says so."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.asked, self.seen = 0, asyncio.Event()

    def refusal(self) -> str | None:
        self.asked += 1
        self.seen.set()
        return super().refusal()

    async def asked_again(self, times: int) -> None:
        target = self.asked + times
        async with asyncio.timeout(2):
            while self.asked < target:
                self.seen.clear()
                await self.seen.wait()


async def test_without_election_the_only_writer_stands_down_while_an_older_release_serves_it(
) -> None:  # fmt: skip
    """ADR 0038 without leader election (one replica, no Lease, no elector to ask): the app
    stands it down before it begins when the first read refuses it; `keep_off` then leads it
    once nothing stands in its way, and stands it down again (writing nothing: may_write is
    False) when an older release appears."""
    api, metrics = Api(), Metrics()
    rivals = Counted(api, metrics, "dw-2", "again-deathwatch-controller",
                     None)  # fmt: skip
    leadership = Leadership(metrics, "again-0", elected=False)
    follower = Follower()
    leadership.follow(follower)
    mine = obj("dw-2", "again", "controller", "2026-12-02T00:00:00Z", controller_id="")
    first = obj("dw", "prod", "controller", "2026-12-01T00:00:00Z", controller_id="")
    api.items["deployments"] = [first, mine]
    await rivals.check()
    # as the app starts it: refused at the first read, so stood down and never begun
    refused = rivals.refusal()
    assert refused is not None and "release prod (namespace dw" in refused
    leadership.standby(f"refused: {refused}")
    leadership.begin()
    assert not leadership.leading and not leadership.may_write()
    assert follower.told == ["standby"]  # never told to lead
    keeping = asyncio.create_task(keep_off(rivals, leadership, every=0.01))
    try:
        await rivals.asked_again(3)  # asked, and asked again: still refused, still off
        assert not leadership.leading and follower.told == ["standby"]
        api.items["deployments"] = [mine]  # the older release uninstalled
        await rivals.check()
        await follower.told_to("lead")
        assert leadership.leading and leadership.may_write()
        api.items["deployments"] = [first, mine]  # (re)applied: it is the older one
        await rivals.check()
        await follower.told_to("standby")
        assert not leadership.may_write() and follower.told == ["standby", "lead", "standby"]
    finally:
        keeping.cancel()
    assert metrics.leader.labels("again-0")._value.get() == 0
