"""The firewall agents' coverage as this process last read it (their per-node Leases), and
each sandbox's shield judged from it (the judgement itself is shield.py's, pure).

Claims go stale with no event, so the controller asks once a tick which nodes' shields may
have changed (`changed_nodes`): a node whose claim changed (but for its renewal time) or
went stale, or every node when the Leases became readable or unreadable.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from deathwatch._operator.shield import NodeCoverage, Shield, Sighting, judge, read_lease, sight


class Coverage:
    def __init__(self, interval: float, started: float | None = None) -> None:
        self.interval = interval  # how often the Leases are read
        self.claims: dict[str, NodeCoverage] = {}
        self.sightings: dict[str, Sighting] = {}
        self.read_at: float | None = None  # monotonic time of the last successful read
        self.started = time.monotonic() if started is None else started
        self._node_keys: dict[str, tuple[NodeCoverage, bool] | None] = {}
        self._observed_last: bool | None = None

    def read(self, leases: Iterable[Mapping[str, Any]], now: datetime) -> None:
        """The coverage Leases as just listed: each node's renewal noted as first seen."""
        now_mono = time.monotonic()
        claims: dict[str, NodeCoverage] = {}
        for lease in leases:
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

    def judge(self, node: str | None, ips: tuple[str, ...], ports: frozenset[int]) -> Shield | None:
        """A sandbox's shield now; None while nothing has been read since start."""
        now_mono = time.monotonic()
        observed = self.observed(now_mono)
        if observed is None:
            return None
        return judge(
            node, ips, ports, self.claims.get(node) if node else None,
            self.sightings.get(node) if node else None, now_mono, observed,
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
        now_mono = time.monotonic()
        observed = self.observed(now_mono)
        if observed is None:
            return set()  # not read yet since start: the restored shields stand
        keys = {node: self._node_key(node, now_mono) for node in self.claims}
        changed: set[str | None] = {
            n for n in keys.keys() | self._node_keys.keys() if keys.get(n) != self._node_keys.get(n)
        }
        everything = observed != self._observed_last
        self._node_keys, self._observed_last = keys, observed
        return None if everything else changed
