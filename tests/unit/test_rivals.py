"""The controller's side of ADR 0038: it reads every release's workloads (and its CRDs), does
not lead before it has, gives way to an older release serving its DeathWatches, and says
each collision once (log, Event, gauge), clearing it when it ends."""

from __future__ import annotations

from typing import Any

import pytest

from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.leadership.rivals import Rivals
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
