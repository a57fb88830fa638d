"""Whether this replica leads: one answer, asked by every part that writes.

As controller-runtime's manager keeps one leader-election runnable group, the controller keeps
one `Leadership`: the elector (leader.py) tells it, or, without leader election, it leads from
the start. Its followers (the shards' slot ownership, the writer, delivery's sender) are told
in the order they were added when this replica starts leading, with its term, and in the
reverse order when it stops; the status publisher and the verdict watch ask `leading`. A
transition is logged and counted here, once, whoever noticed it first (the elector's renewal,
its fencing timer, the writer finding it may no longer write, shutdown).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

import structlog

from deathwatch._operator.instruments.metrics import Metrics

log = structlog.get_logger("deathwatch.leader")


class Follower(Protocol):
    """A part that acts only while this replica leads."""

    def lead(self, term: int | None) -> object:
        """This replica leads from now on, in `term` (None: no election, one term)."""

    def standby(self) -> None:
        """This replica no longer leads: stop acting; keep what is owed."""


class Leadership:
    def __init__(self, metrics: Metrics, identity: str, *, elected: bool) -> None:
        """`elected`: whether a Lease decides (a standby until the elector says otherwise);
        else this replica is the only one and leads from the start."""
        self.metrics, self.identity, self.elected = metrics, identity, elected
        self.term: int | None = None
        # the elector's, once it fences; until then (and without election) leading is
        # writing: a replica kept off by another release (rivals.py) writes nothing
        self._fence: Callable[[], bool] = lambda: self.leading
        self._followers: list[Follower] = []
        self._owns: Callable[[int | None], bool] = lambda slot: True  # one shard: every slot
        self._leading = asyncio.Event()
        if not elected:
            self._leading.set()
        metrics.leader.labels(identity).set(0 if elected else 1)
        for to in ("leading", "standby"):
            metrics.leader_transitions.labels(to)

    @property
    def leading(self) -> bool:
        return self._leading.is_set()

    def may_write(self) -> bool:
        """Leading, and provably so at this instant (the elector's renew deadline)."""
        return self._fence()

    def fenced_by(self, fence: Callable[[], bool]) -> None:
        self._fence = fence

    def sharded_by(self, owns: Callable[[int | None], bool]) -> None:
        """Sharded: which slots this replica's shard holds now (slot_leases.Ownership)."""
        self._owns = owns

    def writes(self, slot: int | None) -> bool:
        """The one answer to "does this replica write that slot's objects now" (None: not a
        sandbox's): it leads, and its shard holds the slot. Asked by the writer, the sender
        and the node exits' receiver; `may_write` fences each request again as it goes."""
        return self.leading and self._owns(slot)

    def follow(self, *followers: Follower) -> None:
        """Add followers, told of every transition from now on, in this order."""
        self._followers.extend(followers)

    def begin(self) -> None:
        """Without election, once start-up has listed what it must: the followers told that
        this replica leads (it has been leading meanwhile: what start-up wanted is pending).
        Not if it was stood down meanwhile (another release serves its DeathWatches: rivals.py
        leads it once nothing stands in its way)."""
        if self.elected or not self.leading:
            return
        log.info("the only replica: leads", identity=self.identity)
        for follower in self._followers:
            follower.lead(self.term)

    def lead(self, term: int | None, why: str) -> None:
        """This replica leads from now on, in `term`."""
        if self.leading and term == self.term:
            return
        self.term = term
        self._leading.set()
        self._said("leading", why)
        for follower in self._followers:
            follower.lead(term)

    def standby(self, why: str) -> None:
        """This replica stops leading (lost, fenced, released): every follower stops."""
        if not self.leading:
            return
        self._leading.clear()
        self._said("standby", why)
        for follower in reversed(self._followers):
            follower.standby()

    async def wait(self) -> None:
        """Until this replica leads."""
        await self._leading.wait()

    async def within(self, seconds: float) -> bool:
        """Whether this replica leads now, or comes to within `seconds`."""
        if self.leading:
            return True
        try:
            async with asyncio.timeout(seconds):
                await self._leading.wait()
        except TimeoutError:
            return self.leading
        return True

    def _said(self, to: str, why: str) -> None:
        self.metrics.leader.labels(self.identity).set(int(to == "leading"))
        self.metrics.leader_transitions.labels(to).inc()
        log.warning(why, identity=self.identity, leading=to == "leading", term=self.term)
