"""The firewall agents' coverage as this process last read it (their per-node Leases), and
each sandbox's shield judged from it (the judgement itself is shield.py's, pure).

Claims go stale with no event, so the controller asks once a tick which nodes' shields may
have changed (`changed_nodes`): a node whose claim changed (but for its renewal time) or
went stale, or every node when the Leases became readable or unreadable.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from deathwatch._operator.reporting.shield import (
    NodeCoverage,
    Shield,
    Sighting,
    assess,
    pending,
    read_lease,
    sight,
)


class Coverage:
    def __init__(
        self,
        interval: float,
        started: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        prefix: str | None = None,
    ) -> None:
        self.interval = interval  # how often the Leases are read
        self.clock = clock
        # this release's Leases are PREFIX.NODE (its DaemonSet's name): another release's in
        # the same namespace are not its claims (None: every coverage Lease)
        self.prefix = prefix
        # nodes with a sandbox shielded while its agent has not yet had a whole claim to
        # put its address in the inbound rule: when to judge them again (monotonic)
        self._recheck: dict[str, float] = {}
        self.claims: dict[str, NodeCoverage] = {}
        self.sightings: dict[str, Sighting] = {}
        self.read_at: float | None = None  # monotonic time of the last successful read
        self.started = clock() if started is None else started
        self._node_keys: dict[str, tuple[NodeCoverage, bool] | None] = {}
        self._observed_last: bool | None = None
        # when a node's first sandbox was judged: a node no Lease was read for *since then*
        # is not yet known to have no agent (its agent may have renewed its first Lease
        # after our last read: the demo's first screen was one false SandboxUnshielded per
        # sandbox); it is judged again after the next read
        self._first_judged: dict[str, float] = {}
        self._pending: set[str] = set()

    def read(self, leases: Iterable[Mapping[str, Any]], now: datetime) -> None:
        """The coverage Leases as just listed: each node's renewal noted as first seen."""
        now_mono = self.clock()
        claims: dict[str, NodeCoverage] = {}
        for lease in leases:
            if self.prefix is not None and not str(
                (lease.get("metadata") or {}).get("name") or ""
            ).startswith(f"{self.prefix}."):
                continue  # another release's agent: not this release's claim
            claim = read_lease(lease)
            if claim is not None:
                claims[claim.node] = claim
        cap = self.interval + 1.0
        self.sightings = {
            node: sight(self.sightings.get(node), claim, now, now_mono, cap)
            for node, claim in claims.items()
        }
        self.claims, self.read_at = claims, now_mono

    def observed(self, now_mono: float) -> bool | None:
        """Read lately (True), not for too long (False: then every shield is Unknown rather
        than "exposed"), or not yet since start (None: the shields published before,
        restored with the verdicts, stand until the first read)."""
        grace = max(3 * self.interval, 15.0)
        if self.read_at is None:
            return None if now_mono - self.started <= grace else False
        return now_mono - self.read_at <= grace

    def shield_of(
        self,
        node: str | None,
        ips: tuple[str, ...],
        ports: frozenset[int],
        labels: Mapping[str, str] | None = None,
        addressed_at: float | None = None,
    ) -> Shield | None:
        """A sandbox's shield now; None while nothing has been read since start, or since
        its node's first sandbox when no Lease names that node (judged after the next read:
        `changed_nodes` names it then). `labels`: its pod's; `addressed_at`: when its
        addresses were first seen (this clock)."""
        now_mono = self.clock()
        observed = self.observed(now_mono)
        if observed is None:
            return None
        if node and observed and node not in self.claims:
            first = self._first_judged.setdefault(node, now_mono)
            if self.read_at is not None and self.read_at < first:
                # nothing to say of it yet: a restored shield stands, a new one waits
                self._pending.add(node)
                return None
        claim = self.claims.get(node) if node else None
        due = pending(claim, ips, addressed_at)
        if node and due is not None and due >= now_mono:
            self._recheck[node] = min(self._recheck.get(node, due), due)
        return assess(
            node, ips, ports, claim, self.sightings.get(node) if node else None, now_mono,
            observed, labels, addressed_at,
        )  # fmt: skip

    def claim(self, node: str | None) -> NodeCoverage | None:
        return self.claims.get(node) if node else None

    def _node_key(self, node: str, now_mono: float) -> tuple[NodeCoverage, bool] | None:
        claim, seen = self.claims.get(node), self.sightings.get(node)
        if claim is None or seen is None:
            return None
        stale = seen.age_then + (now_mono - seen.seen_at) > claim.valid_for
        return dataclasses.replace(claim, renew_time="", renewed_at=None), stale

    def changed_nodes(self) -> set[str | None] | None:
        """The nodes whose sandboxes must be judged again since the last call; None: every
        sandbox (the Leases became readable or unreadable). Empty: nothing changed."""
        now_mono = self.clock()
        observed = self.observed(now_mono)
        if observed is None:
            return set()  # not read yet since start: the restored shields stand
        keys = {node: self._node_key(node, now_mono) for node in self.claims}
        changed: set[str | None] = {
            n for n in keys.keys() | self._node_keys.keys() if keys.get(n) != self._node_keys.get(n)
        }
        due = {n for n, at in self._recheck.items() if at < now_mono}
        for n in due:
            del self._recheck[n]
        changed |= due
        read = self.read_at
        settled = {n for n in self._pending if read is not None and read >= self._first_judged[n]}
        self._pending -= settled
        changed |= settled
        everything = observed != self._observed_last
        self._node_keys, self._observed_last = keys, observed
        return None if everything else changed
