"""What each sink is owed: state and bookkeeping only, no I/O, clocks passed in.

A sink is owed a sandbox's *current* transition when the sink wants its state (and
namespace) and no delivery mark on the verdict covers that transition yet. Only keys are
kept here (the pod uid and the transition's sequence): the event itself is built when it is
sent, from the controller's record of the sandbox, so memory holds no payloads however long a
receiver is down; what was delivered lives on each verdict's status (the API), so a restart
or a new leader loses nothing (ADR 0024).

Order per sandbox: one attempt in flight per sandbox and sink; a newer transition waits for
it, then goes. A transition still owed when the next one comes is *superseded* (counted as
coalesced): Dead and Gone are final, so they are never superseded and never lost; an Alive
or a Suspect may be, when the sandbox moved on before the receiver could be told.

Backoff is the sink's, not the event's: a receiver that is down is down for every event, so
a failure pauses the whole sink (a few seconds at most, or the receiver's Retry-After, to
within the event loop's wake), and events go out again oldest first. While a sink fails, one
attempt is in flight at a time (the probe); the first that ends (delivered, refused) gives the
sink its whole concurrency again, so a receiver back from an outage is drained at its own
pace. A failure the receiver answered (408, 429, 5xx) is a receiver that is there: it is
counted apart from those that never got an answer (`unanswered`, what a dead receiver gives).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from deathwatch._api.resources import DeathWatchKey, DeliveryMark
from deathwatch._engine.verdict import State
from deathwatch._operator.delivery.config import LATE_AFTER, DeliveryConfig, Sink
from deathwatch._operator.delivery.events import Answer, event_id, retry_in


@dataclass(frozen=True, slots=True)
class Ended:
    """An event sent to an end (delivered, refused, given up), for the controller to record
    on its verdict."""

    uid: str
    mark: DeliveryMark


@dataclass(slots=True)
class Owed:
    sequence: int
    state: State
    since: datetime  # when the transition happened: the age of the debt, and maxAge
    deathwatch: DeathWatchKey


@dataclass
class SinkOutbox:
    sink: Sink
    owed: dict[str, Owed] = field(default_factory=dict)
    ready: OrderedDict[str, None] = field(default_factory=OrderedDict)  # oldest first
    # attempts to make again, before anything in `ready`: (when first owed, uid), in order,
    # so that a spell of failed attempts goes out again oldest first, not last failed first
    again: list[tuple[int, str]] = field(default_factory=list)
    tickets: dict[str, int] = field(default_factory=dict)  # uid -> when its event was owed
    _next_ticket: int = 0
    inflight: dict[str, int] = field(default_factory=dict)  # uid -> the sequence being sent
    paused_until: float = 0.0  # monotonic: nothing is taken before (the sink's backoff)
    failures: int = 0  # in a row, answered (408, 429, 5xx) or not
    unanswered: int = 0  # of those, in a row, with no answer at all (refused, timed out, TLS)
    last_error: str | None = None
    coalesced: int = 0  # transitions superseded before they could be delivered

    def owe(self, uid: str, sequence: int, state: State, since: datetime,
            deathwatch: DeathWatchKey) -> bool:  # fmt: skip
        """This transition is owed (a newer one replaces an older). True when one was
        superseded."""
        current = self.owed.get(uid)
        if current is not None and current.sequence >= sequence:
            return False
        superseded = current is not None and self.inflight.get(uid) != current.sequence
        if superseded:
            self.coalesced += 1
        self.owed[uid] = Owed(sequence, state, since, deathwatch)
        if self._queued(uid):
            return superseded  # it keeps its place: the debt is as old as it was
        self._next_ticket += 1
        self.tickets[uid] = self._next_ticket
        if uid not in self.inflight:
            self.ready[uid] = None
        return superseded

    def drop(self, uid: str) -> None:
        """Nothing is owed for it any more (its state is not wanted, it is forgotten)."""
        self.owed.pop(uid, None)
        self._unqueue(uid)
        self.tickets.pop(uid, None)

    def _in_again(self, uid: str) -> int | None:
        """Where `uid` waits in `again` (None: it does not)."""
        ticket = self.tickets.get(uid)
        if ticket is None:
            return None
        i = bisect.bisect_left(self.again, (ticket, uid))
        return i if i < len(self.again) and self.again[i] == (ticket, uid) else None

    def _unqueue(self, uid: str) -> None:
        self.ready.pop(uid, None)
        if (i := self._in_again(uid)) is not None:
            del self.again[i]

    def _queued(self, uid: str) -> bool:
        return uid in self.ready or self._in_again(uid) is not None

    def queued(self) -> list[str]:
        """What waits to be sent, in the order it goes."""
        return [uid for _, uid in self.again] + list(self.ready)

    def take(self, now: float, sendable: Callable[[str], bool] | None = None
             ) -> tuple[str, Owed] | None:  # fmt: skip
        """The next sandbox to send, oldest first: None while paused or full. `sendable`:
        sharded, whether this shard writes the sandbox's slot now (the others stay owed)."""
        if now < self.paused_until or len(self.inflight) >= self.limit:
            return None
        stale, found = [], None
        # lazily: a backlog of thousands is not copied for each attempt
        for uid in itertools.chain([u for _, u in self.again], self.ready):
            owed = self.owed.get(uid)
            if owed is None:
                stale.append(uid)
            elif sendable is None or sendable(uid):
                found = uid, owed
                break
        for uid in stale:
            self._unqueue(uid)
        if found is not None:
            self._unqueue(found[0])
            self.inflight[found[0]] = found[1].sequence
        return found

    @property
    def limit(self) -> int:
        """Attempts in flight at once: the sink's concurrency, or one (the probe) while it
        fails."""
        return 1 if self.failures else self.sink.concurrency

    def wait(self, now: float) -> float | None:
        """Seconds until `take` may return something; None: nothing to send yet."""
        if not (self.ready or self.again) or len(self.inflight) >= self.limit:
            return None
        return max(0.0, self.paused_until - now)

    def ended(self, uid: str, sequence: int) -> None:
        """That attempt ended for good (delivered, refused): the receiver answered."""
        self.failures, self.unanswered, self.last_error = 0, 0, None
        self._release(uid, sequence, settled=True)

    def failed(self, uid: str, sequence: int, answer: Answer | None, error: str, now: float,
               rand: float) -> float:  # fmt: skip
        """That attempt must be made again: the sink pauses (the receiver's Retry-After, or a
        backoff of a few seconds at most) and the sandbox goes first when it resumes. Returns
        the pause."""
        self.failures += 1
        self.unanswered = self.unanswered + 1 if answer is None else 0
        self.last_error = error
        if answer is not None and answer.retry_after is not None:
            # the receiver's own word, and its latest: neither lengthened by an older pause
            # nor cut short by one (an attempt of the same spell that ended later)
            wait = answer.retry_after
            self.paused_until = now + wait
        else:
            wait = retry_in(self.failures, rand)
            self.paused_until = max(self.paused_until, now + wait)
        self._release(uid, sequence, settled=False)
        return wait

    def put_back(self, uid: str) -> None:
        """That attempt was not made (fenced) or its outcome is unknown (cancelled): owed
        again, first. Idempotent."""
        sequence = self.inflight.get(uid)
        if sequence is not None:
            self._release(uid, sequence, settled=False)

    def abandoned(self) -> None:
        """No longer the leader: what was in flight is owed again (its outcome unknown: the
        next leader sends it again, with the same id)."""
        for uid in list(self.inflight):
            self._release(uid, self.inflight[uid], settled=False)

    def _release(self, uid: str, sequence: int, settled: bool) -> None:
        self.inflight.pop(uid, None)
        owed = self.owed.get(uid)
        if owed is None:
            return
        if settled and owed.sequence == sequence:
            del self.owed[uid]
            self.tickets.pop(uid, None)
            return
        self._unqueue(uid)
        if owed.sequence == sequence:  # the same event again: first, in the order owed
            bisect.insort(self.again, (self.tickets[uid], uid))
        else:  # a newer transition came while it was in flight: in turn
            self.ready[uid] = None

    def oldest(self) -> datetime | None:
        return min((o.since for o in self.owed.values()), default=None)


@dataclass(frozen=True, slots=True)
class Backlog:
    """One DeathWatch's share of one sink's debt (its condition says it)."""

    sink: str
    owed: int
    oldest: datetime | None
    last_error: str | None
    late_after: float = LATE_AFTER  # seconds owed before the Delivered condition says so


class Deliveries:
    """Every sink's outbox; what the controller tells about each sandbox's transitions."""

    def __init__(self, config: DeliveryConfig | None) -> None:
        self.cluster = config.cluster if config else ""
        self.sinks = {s.name: SinkOutbox(s) for s in (config.sinks if config else ())}
        self.wake = asyncio.Event()  # something became owed: the sender's loops look again

    def __bool__(self) -> bool:
        return bool(self.sinks)

    def changed(
        self, uid: str, namespace: str, state: State, sequence: int, since: datetime,
        marks: Mapping[str, DeliveryMark], deathwatch: DeathWatchKey,
    ) -> list[str]:  # fmt: skip
        """A sandbox's current transition, and the marks its verdict carries: owed to each
        sink that wants it and has no mark for it; dropped where it is not (any more).
        Returns the sinks where this superseded a transition still owed."""
        superseded = []
        for name, box in self.sinks.items():
            mark = marks.get(name)
            # the same event (ids: events.py), or a later one the API already holds
            covered = mark is not None and (
                mark.id == event_id(uid, state, sequence) or mark.sequence > sequence
            )
            if box.sink.wants(namespace, state) and not covered:
                if box.owe(uid, sequence, state, since, deathwatch):
                    superseded.append(name)
                self.wake.set()
            else:
                box.drop(uid)
        return superseded

    def forget(self, uid: str) -> None:
        for box in self.sinks.values():
            box.drop(uid)

    def owes(self, uid: str) -> bool:
        return any(uid in box.owed for box in self.sinks.values())

    def expired(self, now: datetime) -> list[tuple[str, str, Owed]]:
        """(sink, uid, owed) owed longer than their sink's maxAge."""
        out = []
        for name, box in self.sinks.items():
            for uid, owed in box.owed.items():
                if (now - owed.since).total_seconds() > box.sink.max_age:
                    out.append((name, uid, owed))
        return out

    def backlogs(self, keys: Iterable[DeathWatchKey]) -> dict[DeathWatchKey, list[Backlog]]:
        """Per DeathWatch, per sink: how much is owed, since when, the sink's last error."""
        wanted = set(keys)
        out: dict[DeathWatchKey, list[Backlog]] = {k: [] for k in wanted}
        for name, box in self.sinks.items():
            counts: dict[DeathWatchKey, tuple[int, datetime | None]] = {}
            for owed in box.owed.values():
                n, oldest = counts.get(owed.deathwatch, (0, None))
                counts[owed.deathwatch] = (n + 1, owed.since if oldest is None
                                           else min(oldest, owed.since))  # fmt: skip
            for key in wanted:
                n, oldest = counts.get(key, (0, None))
                out[key].append(Backlog(name, n, oldest, box.last_error if n else None,
                                        box.sink.late_after))  # fmt: skip
        return out
