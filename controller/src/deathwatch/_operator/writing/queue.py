"""The leader's desires waiting to be written: one per object (a newer desire merges into the
waiting one: the latest wins), taken in priority order (Dead verdicts first), one write in
flight per object so they stay in order, and an object waiting out a backoff not taken
before its time. Nothing here talks to the API; the writer's workers take from it."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

from deathwatch._operator.writing.desired import Desired, ObjectKey

Schedule = Callable[[float, Callable[[], None]], object]


class WriteQueue:
    def __init__(self, leading: Callable[[], bool], schedule: Schedule | None = None) -> None:
        """`leading()`: whether anything is taken now (standing by, desires wait here);
        `schedule(delay, fn)`: the retry timer, the event loop's unless a test drives it."""
        self.pending: dict[ObjectKey, Desired] = {}  # the leader's, until written
        self.inflight: set[ObjectKey] = set()
        self._leading = leading
        self._schedule = schedule
        self._queue: asyncio.PriorityQueue[tuple[int, int, ObjectKey]] = asyncio.PriorityQueue()
        self._queued: set[ObjectKey] = set()
        self._backoff: set[ObjectKey] = set()  # waiting out a backoff: not taken before
        self._seq = itertools.count()
        self._idle = asyncio.Event()
        self._idle.set()

    def __len__(self) -> int:
        return len(self.pending) + len(self.inflight)

    def want(self, d: Desired) -> None:
        """`d` to be written: merged into the desire already waiting for its object."""
        key = d.key
        previous = self.pending.get(key)
        self.pending[key] = previous.merged_into(d) if previous else d
        self.enqueue(key)

    def put(self, d: Desired) -> None:
        """`d` in line in place of any desire waiting for its object (a takeover's)."""
        self.pending[d.key] = d
        self.enqueue(d.key)

    def keep(self, d: Desired) -> None:
        """`d` back where it was, with whatever newer desire came meanwhile merged into it."""
        newer = self.pending.get(d.key)
        self.pending[d.key] = d.merged_into(newer) if newer else d

    def enqueue(self, key: ObjectKey) -> None:
        """Its desire in line to be taken, unless it is already in line, in flight or
        waiting out a backoff (taken when that ends), or this replica does not lead."""
        self._idle.clear()
        if key in self._queued or key in self.inflight or key in self._backoff:
            return
        if not self._leading():
            return  # kept pending: `take_over` queues it
        self._queued.add(key)
        self._queue.put_nowait((self.pending[key].priority, next(self._seq), key))

    async def take(self) -> Desired | None:
        """The next desire in line, out of the queue (None: it was written or dropped since
        it was put in line)."""
        _, _, key = await self._queue.get()
        self._queued.discard(key)
        d = self.pending.pop(key, None)
        if d is None:
            self.update_idle()
        return d

    def done(self, key: ObjectKey) -> None:
        """A write of `key` ended: a desire that came meanwhile goes in line."""
        self.inflight.discard(key)
        if key in self.pending and key not in self._backoff:
            self.enqueue(key)
        self.update_idle()

    def retry(self, d: Desired, delay: float) -> None:
        """`d` failed and waits `delay` seconds; newer desires merge into it meanwhile."""
        key = d.key
        self.keep(d)
        self._backoff.add(key)

        def again() -> None:
            self._backoff.discard(key)
            if key in self.pending:
                self.enqueue(key)
            self.update_idle()

        schedule = self._schedule or asyncio.get_running_loop().call_later
        schedule(delay, again)

    def give_up(self, which: Callable[[int | None], bool]) -> list[Desired]:
        """The waiting desires of the slots `which` names, taken out (their slots are no
        longer this shard's); a write in flight ends on its own."""
        given = [d for d in self.pending.values() if d.slot is not None and which(d.slot)]
        for d in given:
            del self.pending[d.key]
        self.update_idle()
        return given

    def update_idle(self) -> None:
        if not self.inflight and not self._backoff and (not self.pending or not self._leading()):
            self._idle.set()

    async def idle(self) -> None:
        """Until everything waiting is written or given up (callers bound the wait)."""
        await self._idle.wait()
