"""Prometheus metrics of the operator: every family (families.py) in one registry of its
own, so tests can read it in isolation, and the series started at 0 before their first use."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry

from deathwatch._engine.verdict import DEAD_CAUSES, Cause, origin_of
from deathwatch._operator.instruments.declare import build
from deathwatch._operator.instruments.families import (
    ApiFamilies,
    DeliveryFamilies,
    NodeFamilies,
    ProcessFamilies,
    VerdictFamilies,
)


class Metrics(VerdictFamilies, NodeFamilies, ApiFamilies, ProcessFamilies, DeliveryFamilies):
    """The controller's metrics, each declared once in its family (families.py): built in one
    registry of their own at construction, so tests read them in isolation."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        build(self, self.registry)
        self._death_nodes: set[str] = set()

    def sinks_known(self, names: Iterable[str]) -> None:
        """Every sink's series from the start, at 0 (a first refusal must show in increase())."""
        for name in names:
            for outcome in ("delivered", "refused", "expired"):
                self.delivery_events.labels(name, outcome)
            self.delivery_coalesced.labels(name)
            self.delivery_backlog.labels(name).set(0)
            self.delivery_oldest.labels(name).set(0)

    def death(self, node: str, cause: Cause) -> None:
        self.node_seen(node)
        self.deaths.labels(node, str(cause), str(origin_of(cause))).inc()

    def node_seen(self, node: str) -> None:
        """Start a node's death counters at 0 the first time a sandbox is seen on it: increase()
        ignores a series' first sample, so deaths that create their own series (a whole node
        dying between two scrapes) would never show in a rate or fire an alert."""
        if node not in self._death_nodes:
            self._death_nodes.add(node)
            for cause in DEAD_CAUSES:
                self.deaths.labels(node, str(cause), str(origin_of(cause)))

    def policies_known(self, names: Iterable[str]) -> None:
        """Start every policy's counters at 0: a policy's first error must show in increase()."""
        for name in names:
            for counter in (self.policy_errors, self.flaps, self.false_positives, self.ready_drops,
                            self.node_exit_disputes, self.sidecar_restarts):  # fmt: skip
                counter.labels(name)
        for outcome in ("judged", "not-watched", "kubelet", "gone", "unread", "busy", "settled"):
            self.node_exits.labels(outcome)
