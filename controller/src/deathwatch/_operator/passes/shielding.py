"""The firewall agents' coverage Leases, and each live sandbox's Shielded judged again when
its node's claim changes or goes stale with no event (once a tick). Free functions on the
Core; no I/O (the Leases are read by reads.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from deathwatch._engine.engine import Step
from deathwatch._operator.memory.core import Core


def on_coverage(core: Core, leases: Iterable[Mapping[str, Any]]) -> None:
    if core.coverage is not None:
        core.coverage.read(leases, core.clock())


def reshield(core: Core) -> None:
    """Judge again the live sandboxes on the nodes whose claim changed or expired (all of
    them when the Leases became readable or unreadable); a verdict is written for each
    shield that changed."""
    if core.coverage is None:
        return
    nodes = core.coverage.changed_nodes()
    if nodes is not None and not nodes:
        return
    records = list(core.records) if nodes is None else core.records.on_nodes(nodes)
    for record in records:
        track = record.track
        rules = core.deathwatches.get(record.deathwatch)
        if track is None or rules is None or not record.persisted:
            continue
        if track.state.terminal and record.shield is not None:
            continue
        record.judged_for = None  # judge it afresh
        shield = core.shield(record, rules)
        if shield != record.shield:
            core.settle(Step(track), record, rules, shield=shield)
