"""Each DeathWatch's counts, kept as sandboxes change instead of recounted.

A DeathWatch's status says how many of its sandboxes are in each state, their flaps and false
positives, the nodes that run live ones with no current firewall, and its last deaths. Each
sandbox contributes `Facts` (decisions.py); when they change, the old ones are taken out and
the new ones put in (`apply`), so publishing a status costs the same with 30 or 30,000
sandboxes (it was a walk over all of them every second: 29 ms a call at 30,000, issue #23).
Pure bookkeeping.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from deathwatch._api.resources import ConditionStatus, DeathWatchKey
from deathwatch._engine.verdict import Evidence, Origin, State
from deathwatch._operator.reporting.decisions import Facts

LAST_DEATHS = 20


@dataclass(slots=True)
class Summary:
    counts: Counter[State] = field(default_factory=Counter)
    flaps: int = 0
    false_positives: int = 0
    deaths: Counter[Origin] = field(default_factory=Counter)  # Dead verdicts by whose doing
    exposed: Counter[str] = field(default_factory=Counter)  # node -> live exposed sandboxes
    # every Dead verdict, oldest first: (declared at, pod name, uid) and its evidence
    _deaths: list[tuple[datetime, str, str]] = field(default_factory=list)
    _evidence: dict[str, Evidence] = field(default_factory=dict)

    def _add(self, f: Facts, sign: int) -> None:
        self.counts[f.state] += sign
        self.flaps += sign * f.flaps
        self.false_positives += sign * int(f.false_positive)
        if f.exposed_on is not None:
            self.exposed[f.exposed_on] += sign
            if self.exposed[f.exposed_on] <= 0:
                del self.exposed[f.exposed_on]
        if f.death is not None:
            self.deaths[f.death.origin] += sign
            entry = (f.death.declared_at, f.death.name, f.death.pod_uid)
            if sign > 0:
                bisect.insort(self._deaths, entry)
                self._evidence[f.death.pod_uid] = f.death
            else:
                i = bisect.bisect_left(self._deaths, entry)
                if i < len(self._deaths) and self._deaths[i] == entry:
                    del self._deaths[i]
                self._evidence.pop(f.death.pod_uid, None)

    @property
    def tracked(self) -> int:
        return sum(self.counts.values())

    def last_deaths(self, n: int = LAST_DEATHS) -> list[Evidence]:
        """The latest deaths, newest first."""
        return [self._evidence[uid] for _, _, uid in reversed(self._deaths[-n:])]

    def uncovered_nodes(self) -> list[str]:
        return sorted(self.exposed)


class Summaries:
    def __init__(self) -> None:
        self._by_deathwatch: dict[DeathWatchKey, Summary] = {}
        self.states: Counter[State] = Counter()  # every tracked sandbox, for the gauges
        self.shields: Counter[ConditionStatus] = Counter()  # live judged ones, likewise
        # live sandboxes per (node, Shielded status, "Audit" or "none"), likewise
        self.nodes: Counter[tuple[str, str]] = Counter()

    def __getitem__(self, key: DeathWatchKey) -> Summary:
        summary = self._by_deathwatch.get(key)
        if summary is None:
            summary = self._by_deathwatch[key] = Summary()
        return summary

    def __iter__(self) -> Iterator[DeathWatchKey]:
        return iter(self._by_deathwatch)

    def apply(self, key: DeathWatchKey, before: Facts | None, after: Facts | None) -> None:
        """A sandbox of `key` changed from `before` to `after` (None: not counted)."""
        if before == after:
            return
        summary = self[key]
        for facts, sign in ((before, -1), (after, 1)):
            if facts is None:
                continue
            summary._add(facts, sign)
            self.states[facts.state] += sign
            if facts.shield is not None:
                self.shields[facts.shield] += sign
            if facts.node is not None:
                shielded = "Audit" if facts.audited else str(facts.shield or "none")
                per_node = (facts.node, shielded)
                self.nodes[per_node] += sign
                if self.nodes[per_node] <= 0:
                    del self.nodes[per_node]

    def drop(self, key: DeathWatchKey) -> None:
        """The DeathWatch is gone (the caller took each of its sandboxes out first)."""
        self._by_deathwatch.pop(key, None)
