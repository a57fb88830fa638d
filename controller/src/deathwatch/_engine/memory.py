"""What the engine remembers of one pod, and the four ways it learns: an observation of the
pod, a container's exit its node heard, its removal from the API, a Suspect window closing on
the clock.

Shared by replay (one `Memory` per pod of a recording) and the operator (one inside each
sandbox's record, records.py): each keeps its memories where it keeps everything else about a
pod, so a pod is forgotten in one place; the deadlines of Suspect windows are kept apart, in
one heap for all pods (`Deadlines`), entries checked against the memory when they come due.
The functions here are the engine's `step` plus the bookkeeping around it; no I/O, no clock
(the caller passes `now`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from datetime import datetime

import msgspec

from deathwatch._engine import engine
from deathwatch._engine.contract import Policies, PolicySettings
from deathwatch._engine.engine import Step, Track
from deathwatch._engine.nodeexit import NodeExit
from deathwatch._engine.podview import PodView
from deathwatch._engine.verdict import Cause, State

_TERMINAL = frozenset({State.DEAD, State.GONE})  # State.terminal, without a property call
_DEFAULT = PolicySettings()


class Memory:
    """The engine's memory of one pod: its Track, the settings it is judged with, whether it
    was observed since the track was made or restored (the engine's `first`), and its latest
    observation while Suspect (what its window is judged on when it closes; only Suspects
    keep one: a PodView per live sandbox was most of the per-pod memory, ADR 0013)."""

    __slots__ = ("last", "seen", "settings", "track")

    def __init__(self, track: Track, settings: PolicySettings | None = None) -> None:
        self.track = track
        # None: restored from a verdict, its DeathWatch not compiled yet (the defaults then)
        self.settings = settings
        self.seen = False
        self.last: PodView | None = None

    def __repr__(self) -> str:
        return f"Memory({self.track.uid} {self.track.state}, seen={self.seen})"


class Deadlines:
    """When each Suspect's window closes: one heap for every pod. An entry is only a hint,
    checked when it comes due against the pod's memory (recovered, dead, re-scheduled or
    forgotten since: skipped), so nothing is ever removed from it by hand."""

    def __init__(self) -> None:
        self._heap: list[tuple[datetime, str]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, deadline: datetime, uid: str) -> None:
        heapq.heappush(self._heap, (deadline, uid))

    def first(self) -> datetime | None:
        """The earliest entry's deadline, current or not (None: empty). Replay's hot path
        asks this before anything else."""
        return self._heap[0][0] if self._heap else None

    def next(self, current: Callable[[datetime, str], bool]) -> datetime | None:
        """The earliest deadline still current (`current(deadline, uid)`); stale entries on
        the way are dropped."""
        heap = self._heap
        while heap:
            deadline, uid = heap[0]
            if current(deadline, uid):
                return deadline
            heapq.heappop(heap)
        return None

    def take(
        self, due: Callable[[datetime], bool], current: Callable[[datetime, str], bool]
    ) -> list[tuple[datetime, str]]:
        """Every current entry whose deadline is `due`, taken off the heap before any is
        judged: an answer with another past deadline waits for the next call (the engine
        refuses one, but nothing here may loop on it)."""
        taken: list[tuple[datetime, str]] = []
        while (deadline := self.next(current)) is not None and due(deadline):
            taken.append(heapq.heappop(self._heap))
        return taken


def is_current(memory: Memory | None, deadline: datetime) -> bool:
    """Whether a deadline entry still stands for this memory (the pod is still Suspect with
    exactly that deadline)."""
    return (
        memory is not None
        and memory.track.state is State.SUSPECT
        and memory.track.deadline == deadline
    )


def restored(track: Track, policies: Policies, deadlines: Deadlines) -> Memory:
    """A memory rebuilt from a persisted verdict (operator restart), its Suspect window
    scheduled. Raises UnknownPolicy (a ValueError) for a policy no longer installed."""
    policies.get(track.policy)
    if track.state is State.SUSPECT and track.deadline is not None:
        deadlines.push(track.deadline, track.uid)
    return Memory(track)


def observe(
    memory: Memory | None,
    pod: PodView,
    now: datetime,
    policies: Policies,
    configured: str,
    settings: PolicySettings,
    deadlines: Deadlines,
    deletion: Cause = Cause.DELETED,
) -> tuple[Memory, Step]:
    """Judge one observation of the pod: a new memory (with the policy `configured` selects)
    if it had none, else its own policy's next step. The memory takes these settings."""
    if memory is None:
        policy = policies.select(pod, configured, settings)
        memory = Memory(engine.new_track(pod, policy, settings), settings)
    else:
        policy = policies.get(memory.track.policy)
        memory.settings = settings
    first = not memory.seen and memory.track.state not in _TERMINAL
    step = engine.step(memory.track, pod, now, policy, settings, first=first, deletion=deletion)
    return memory, _keep(memory, step, pod, deadlines)


def exited(
    memory: Memory,
    pod: PodView,
    exit: NodeExit,
    now: datetime,
    policies: Policies,
    deadlines: Deadlines,
    deletion: Cause = Cause.DELETED,
) -> Step | None:
    """A container's exit as its node heard it, `pod` as the API holds it now. None: the
    exit is not the watched container's, or only the kubelet can tell what it leads to."""
    policy = policies.get(memory.track.policy)
    settings = memory.settings or _DEFAULT
    judged = engine.exited(memory.track, pod, exit, now, policy, settings, deletion=deletion)
    if judged is None:
        return None
    step, reported = judged
    return _keep(memory, step, reported, deadlines)


def remove(
    memory: Memory,
    now: datetime,
    last: PodView | None,
    policies: Policies,
    deadlines: Deadlines,
    deletion: Cause = Cause.DELETED,
) -> Step:
    """The pod is gone from the API (`last`: its final object, if it came with the news)."""
    policy = policies.get(memory.track.policy)
    settings = memory.settings or _DEFAULT
    step = engine.remove(memory.track, now, last, policy, settings, deletion)
    return _keep(memory, step, None, deadlines)


def expire(memory: Memory, now: datetime, policies: Policies, deadlines: Deadlines) -> Step:
    """Judge again with no new observation, at `now`: its Suspect window may have closed."""
    policy = policies.get(memory.track.policy)
    step = engine.expire(memory.track, memory.last, now, policy, memory.settings or _DEFAULT)
    return _keep(memory, step, memory.last, deadlines)


def _keep(memory: Memory, step: Step, pod: PodView | None, deadlines: Deadlines) -> Step:
    track, previous = step.track, memory.track
    if track is previous:
        if step.changed:
            step = msgspec.structs.replace(step, changed=False)
    else:
        memory.track = track
        deadline = track.deadline
        if deadline is not None and previous.deadline != deadline and track.state is State.SUSPECT:
            deadlines.push(deadline, track.uid)
    if track.state in _TERMINAL:
        memory.seen = False  # a verdict's evidence is captured: nothing more to know of it
        memory.last = None
    elif pod is not None:
        memory.seen = True
    if track.state is not State.SUSPECT:
        memory.last = None
    elif pod is not None:
        memory.last = pod
    return step
