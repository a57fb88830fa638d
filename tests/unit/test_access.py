"""Who may read an endpoint (deathwatch._kube.access): TokenReview then SubjectAccessReview,
each decision cached, one review per token at a time, and a budget of reviews that a flood
of made-up tokens cannot exceed. Against a fake API that answers like the real one (the
real one: tests/apiserver/test_ports.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from deathwatch._kube.access import ACCESS_REVIEWS, TOKEN_REVIEWS, Access, Grant, bearer
from deathwatch._kube.errors import NoAnswer

USERS = {
    "prometheus-token": {"username": "system:serviceaccount:monitoring:prometheus",
                         "uid": "u-1", "groups": ["system:serviceaccounts"]},
    "nobody-token": {"username": "system:serviceaccount:sandboxes:default", "groups": []},
}  # fmt: skip
READERS = {"system:serviceaccount:monitoring:prometheus"}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class FakeReviews:
    """The API server's two reviews: tokens it knows, users that may get /metrics."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.down = False
        self.gate: asyncio.Event | None = None

    async def post(self, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self.calls.append((path, dict(body)))
        if self.gate is not None:
            await self.gate.wait()
        if self.down:
            raise NoAnswer("POST: connection refused")
        if path == TOKEN_REVIEWS:
            user = USERS.get(body["spec"]["token"])
            return {"status": {"authenticated": True, "user": user} if user else {}}
        assert path == ACCESS_REVIEWS
        spec = body["spec"]
        ok = spec["user"] in READERS and spec["nonResourceAttributes"]["verb"] == "get"
        return {"status": {"allowed": ok}}

    @property
    def reviews(self) -> int:
        return sum(path == TOKEN_REVIEWS for path, _ in self.calls)


def access(api: FakeReviews, clock: Clock, **kw: Any) -> Access:
    return Access(api.post, clock=clock, **kw)


def test_only_a_bearer_header_carries_a_token() -> None:
    assert bearer("Bearer abc") == "abc" and bearer("bearer  abc ") == "abc"
    assert bearer(None) is None and bearer("Basic abc") is None and bearer("Bearer ") is None


async def test_decisions_and_what_each_costs_the_api() -> None:
    api, clock = FakeReviews(), Clock()
    gate = access(api, clock)
    assert await gate.check(None, "/metrics") is Grant.UNAUTHENTICATED
    assert api.calls == []  # no token: no call
    assert await gate.check("Bearer made-up", "/metrics") is Grant.UNAUTHENTICATED
    assert await gate.check("Bearer nobody-token", "/metrics") is Grant.FORBIDDEN
    assert await gate.check("Bearer prometheus-token", "/metrics") is Grant.ALLOWED
    sar = next(b for p, b in api.calls if p == ACCESS_REVIEWS and b["spec"].get("uid") == "u-1")
    assert sar["spec"]["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
    assert sar["spec"]["groups"] == ["system:serviceaccounts"]
    calls = len(api.calls)
    for _ in range(50):  # every later scrape: from the cache
        assert await gate.check("Bearer prometheus-token", "/metrics") is Grant.ALLOWED
        assert await gate.check("Bearer made-up", "/metrics") is Grant.UNAUTHENTICATED
    assert len(api.calls) == calls
    clock.t += 31  # refusals are remembered for 30 s, an allowance for 300 s
    assert await gate.check("Bearer made-up", "/metrics") is Grant.UNAUTHENTICATED
    assert await gate.check("Bearer prometheus-token", "/metrics") is Grant.ALLOWED
    assert api.reviews == 4
    clock.t += 300
    assert await gate.check("Bearer prometheus-token", "/metrics") is Grant.ALLOWED
    await gate.settled()  # reviewed again in the background: a known reader
    assert api.reviews == 5
    # another path is its own decision
    assert await gate.check("Bearer prometheus-token", "/readyz") is Grant.ALLOWED
    assert api.reviews == 6


async def test_a_flood_of_made_up_tokens_costs_the_api_its_budget_and_no_more() -> None:
    api, clock = FakeReviews(), Clock()
    gate = access(api, clock, per_second=5.0, burst=10)
    assert await gate.check("Bearer prometheus-token", "/metrics") is Grant.ALLOWED
    decisions = [await gate.check(f"Bearer fake-{i}", "/metrics") for i in range(1000)]
    assert api.reviews == 10  # the burst: Prometheus's and nine made-up ones
    assert decisions.count(Grant.BUSY) == 991
    clock.t += 2.0  # two seconds refill ten
    decisions = [await gate.check(f"Bearer more-{i}", "/metrics") for i in range(1000)]
    assert api.reviews == 20 and decisions.count(Grant.BUSY) == 990
    # a decision already cached is not held up by the spent budget
    assert await gate.check("Bearer prometheus-token", "/metrics") is Grant.ALLOWED
    assert api.reviews == 20
    assert gate.decisions["busy"] == 991 + 990


async def test_a_known_reader_is_never_held_up_by_its_decision_expiring() -> None:
    """Prometheus's decision expires in the middle of a flood: it is answered from the expired
    allowance while it is reviewed again in the background, from the known readers' own
    budget. A refusal ends the allowance; an API server that does not answer extends it, up
    to `stale_for` past its expiry. A reader never allowed before gets no such favour."""
    api, clock = FakeReviews(), Clock()
    gate = access(api, clock, per_second=5.0, burst=10, stale_for=600.0)
    assert await gate.check("Bearer prometheus-token", "/metrics") is Grant.ALLOWED
    clock.t += 301  # its decision has expired
    flood = [await gate.check(f"Bearer fake-{i}", "/metrics") for i in range(500)]
    assert flood.count(Grant.BUSY) == 490  # the shared budget: spent
    assert await gate.check("Bearer prometheus-token", "/metrics") is Grant.ALLOWED
    await gate.settled()
    assert api.reviews == 1 + 10 + 1  # renewed in the background, despite the flood
    assert gate.decisions["stale"] == 1
    assert await gate.check("Bearer nobody-token", "/metrics") is Grant.BUSY
    # the API server stops answering: the allowance holds for stale_for past its expiry
    clock.t += 301
    api.down = True
    for _ in range(3):
        assert await gate.check("Bearer prometheus-token", "/metrics") is Grant.ALLOWED
        await gate.settled()
        clock.t += 1.0
    clock.t += 600
    assert await gate.check("Bearer prometheus-token", "/metrics") is Grant.UNAVAILABLE
    api.down = False
    assert await gate.check("Bearer prometheus-token", "/metrics") is Grant.ALLOWED
    # revoked: the renewal is refused, and the allowance ends there
    READERS.discard("system:serviceaccount:monitoring:prometheus")
    try:
        clock.t += 301
        assert await gate.check("Bearer prometheus-token", "/metrics") is Grant.ALLOWED
        await gate.settled()
        assert await gate.check("Bearer prometheus-token", "/metrics") is Grant.FORBIDDEN
    finally:
        READERS.add("system:serviceaccount:monitoring:prometheus")


async def test_one_review_per_token_at_a_time_and_at_most_two_in_flight() -> None:
    api, clock = FakeReviews(), Clock()
    api.gate = asyncio.Event()
    gate = access(api, clock, concurrent=2)
    same = [asyncio.create_task(gate.check("Bearer prometheus-token", "/metrics"))
            for _ in range(20)]  # fmt: skip
    other = asyncio.create_task(gate.check("Bearer nobody-token", "/metrics"))
    async with asyncio.timeout(5):
        while api.reviews < 2:  # noqa: ASYNC110 - the two reviews begun, polled with a deadline
            await asyncio.sleep(0)
    # a third token while two reviews are in flight: busy at once, not queued
    assert await gate.check("Bearer third", "/metrics") is Grant.BUSY
    api.gate.set()
    assert {await t for t in same} == {Grant.ALLOWED}
    assert await other is Grant.FORBIDDEN
    assert api.reviews == 2


async def test_an_api_that_does_not_answer_is_unavailable_and_not_remembered() -> None:
    api, clock = FakeReviews(), Clock()
    gate = access(api, clock)
    api.down = True
    assert await gate.check("Bearer prometheus-token", "/metrics") is Grant.UNAVAILABLE
    assert gate.last_failure is not None and "connection refused" in gate.last_failure
    assert Grant.UNAVAILABLE.status == 503 and Grant.BUSY.status == 503
    api.down = False
    assert await gate.check("Bearer prometheus-token", "/metrics") is Grant.ALLOWED


async def test_the_cache_keeps_its_size() -> None:
    api, clock = FakeReviews(), Clock()
    gate = access(api, clock, entries=3, per_second=1000, burst=1000)
    for i in range(10):
        await gate.check(f"Bearer fake-{i}", "/metrics")
    assert len(gate._cache) == 3
