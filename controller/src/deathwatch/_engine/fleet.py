"""A set of tracked pods and their Suspect deadlines: the engine's state, held for a caller.

Shared by replay (fed from a recording) and the operator (fed from watches); both decide
what to do with the returned steps. Not thread-safe: the operator uses it from its event
loop only.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from datetime import datetime

import msgspec

from deathwatch._engine import engine
from deathwatch._engine.contract import Policies, PolicySettings
from deathwatch._engine.engine import Step, Track
from deathwatch._engine.podview import PodView
from deathwatch._engine.verdict import Cause, State

_TERMINAL = frozenset({State.DEAD, State.GONE})  # State.terminal, without a property call


class Fleet:
    def __init__(self, registry: Policies) -> None:
        self.registry = registry
        self.tracks: dict[str, Track] = {}
        # Pods observed since their track was made or restored and not yet Dead or Gone (the
        # engine's `first` is a pod's first observation)
        self.seen: set[str] = set()
        # The latest observation of each Suspect: what it is judged on when its window closes.
        # Only Suspects keep one (a pod turns Suspect on an observation, kept from then on):
        # a PodView for every live sandbox was most of the per-pod memory (ADR 0013).
        self.suspects: dict[str, PodView] = {}
        self._settings: dict[str, PolicySettings] = {}
        self._deadlines: list[tuple[datetime, str]] = []
        # Suspects whose window could not be judged (uid, error): the caller reports them
        self.failures: list[tuple[str, Exception]] = []

    def __len__(self) -> int:
        return len(self.tracks)

    def __iter__(self) -> Iterator[Track]:
        return iter(self.tracks.values())

    def get(self, uid: str) -> Track | None:
        return self.tracks.get(uid)

    def restore(self, track: Track, settings: PolicySettings) -> None:
        """Adopt a track rebuilt from a persisted verdict (operator restart)."""
        self.registry.get(track.policy)  # fail loudly on a policy that no longer exists
        self.tracks[track.uid] = track
        self._settings[track.uid] = settings
        self._schedule(track)

    def observe(
        self,
        pod: PodView,
        now: datetime,
        configured_policy: str,
        settings: PolicySettings,
        deletion: Cause = Cause.DELETED,
    ) -> Step:
        track = self.tracks.get(pod.uid)
        if track is None:
            policy = self.registry.select(pod, configured_policy, settings)
            track = engine.new_track(pod, policy, settings)
        else:
            policy = self.registry.get(track.policy)
        first = pod.uid not in self.seen and track.state not in _TERMINAL
        if self._settings.get(pod.uid) is not settings:
            self._settings[pod.uid] = settings
        step = engine.step(track, pod, now, policy, settings, first=first, deletion=deletion)
        return self._keep(step, pod)

    def remove(
        self, uid: str, now: datetime, last: PodView | None, deletion: Cause = Cause.DELETED
    ) -> Step | None:
        """The pod is gone from the API. Returns None for a pod never tracked."""
        track = self.tracks.get(uid)
        if track is None:
            return None
        policy = self.registry.get(track.policy)
        step = engine.remove(track, now, last, policy, self._settings[uid], deletion)
        return self._keep(step, None)

    def forget(self, uid: str) -> Track | None:
        """Drop a track entirely (its verdict has been retired)."""
        self._settings.pop(uid, None)
        self.seen.discard(uid)
        self.suspects.pop(uid, None)
        return self.tracks.pop(uid, None)

    def next_deadline(self) -> datetime | None:
        while self._deadlines:
            deadline, uid = self._deadlines[0]
            track = self.tracks.get(uid)
            if track is not None and track.state is State.SUSPECT and track.deadline == deadline:
                return deadline
            heapq.heappop(self._deadlines)  # stale entry: recovered, dead, or re-scheduled
        return None

    def expire_due(self, now: datetime) -> list[Step]:
        """Live use: judge every Suspect whose deadline has come, at `now`."""
        return self._expire(lambda deadline: deadline <= now, lambda deadline: now)

    def expire_before(self, clock: datetime) -> list[Step]:
        """Replay: windows that closed before `clock` are judged at their own deadline, as a
        live controller's timer would have; a recovery stamped exactly at the deadline wins."""
        if not self._deadlines or self._deadlines[0][0] >= clock:
            return []  # the common case, checked without a call (replay's hot path)
        return self._expire(lambda deadline: deadline < clock, lambda deadline: deadline)

    def _expire(
        self, is_due: Callable[[datetime], bool], at: Callable[[datetime], datetime]
    ) -> list[Step]:
        """Judge each due entry on its own: one that fails (a bug, not a policy's error, which
        the engine contains) is set aside in `failures` and the others are still judged."""
        due: list[tuple[datetime, str]] = []
        while (deadline := self.next_deadline()) is not None and is_due(deadline):
            # taken before judging: an answer with another past deadline waits for the next
            # call (the engine refuses one, but nothing here may loop on it)
            due.append(heapq.heappop(self._deadlines))
        steps: list[Step] = []
        for deadline, uid in due:
            try:
                track = self.tracks[uid]
                policy = self.registry.get(track.policy)
                last = self.suspects.get(uid)
                step = engine.expire(track, last, at(deadline), policy, self._settings[uid])
                steps.append(self._keep(step, last))
            except Exception as exc:
                self.failures.append((uid, exc))
        return steps

    def _keep(self, step: Step, pod: PodView | None) -> Step:
        track = step.track
        previous = self.tracks.get(track.uid)
        if track is previous:
            if step.changed:
                step = msgspec.structs.replace(step, changed=False)
        else:
            self.tracks[track.uid] = track
            if track.deadline is not None and (
                previous is None or previous.deadline != track.deadline
            ):
                self._schedule(track)
        if track.state in _TERMINAL:
            # a verdict's evidence is captured: nothing more to know about the pod
            self.seen.discard(track.uid)
        elif pod is not None:
            self.seen.add(track.uid)
        if track.state is not State.SUSPECT:
            self.suspects.pop(track.uid, None)
        elif pod is not None:
            self.suspects[track.uid] = pod
        return step

    def _schedule(self, track: Track) -> None:
        if track.state is State.SUSPECT and track.deadline is not None:
            heapq.heappush(self._deadlines, (track.deadline, track.uid))
