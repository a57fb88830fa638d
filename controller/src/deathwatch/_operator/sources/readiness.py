"""What /readyz says: the API's reachability as the probe last read it, whether the pod
streams are alive (an event or a bookmark within `stale_after`), the firewall's coverage,
and, in its details, every stream's age, task restarts, who leads, the write backlog and the
agent-sandbox watch. Built from state the loops keep: no API call per request, so hammering
the endpoint costs the controller nothing (the field notes: it is unauthenticated)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from deathwatch._api.resources import to_document
from deathwatch._operator.sources.reflector import Reflector


@dataclass
class Readiness:
    """What the probe loop last read of the API (reads.probe)."""

    api_reachable: bool | None = None
    api_error: str | None = None
    checked_at: datetime | None = None


@dataclass
class Streams:
    """The reflectors, by what they keep: the pod streams decide whether the controller's
    view is fresh."""

    stale_after: float
    pods: list[Reflector[Any]] = field(default_factory=list)
    verdicts: list[Reflector[Any]] = field(default_factory=list)
    deathwatches: list[Reflector[Any]] = field(default_factory=list)
    agent_sandboxes: list[Reflector[Any]] = field(default_factory=list)
    node_exits: list[Reflector[Any]] = field(default_factory=list)  # the nodes' exits Leases
    evictions: list[Reflector[Any]] = field(default_factory=list)  # the kubelet's Evicted Events

    def fresh(self) -> bool | None:
        """Every pod stream delivered something (an event or a bookmark) lately; None before
        there is any."""
        if not self.pods:
            return None
        return all(r.age() < self.stale_after for r in self.pods)

    @property
    def every(self) -> list[Reflector[Any]]:
        return [*self.verdicts, *self.deathwatches, *self.agent_sandboxes, *self.pods,
                *self.node_exits, *self.evictions]  # fmt: skip

    def not_open(self) -> dict[str, str]:
        """The collections not listed within their deadline, each with its last error."""
        return {r.name: r.last_error or "no answer yet" for r in self.every if r.overdue}

    def ages(self) -> dict[str, float]:
        """Each collection's oldest stream, in seconds since it last delivered anything."""
        ages: dict[str, float] = {}
        present = [r for r in self.agent_sandboxes if not r.absent]
        for reflector in (*self.pods, *self.verdicts, *self.deathwatches, *present,
                          *self.node_exits, *self.evictions):  # fmt: skip
            name = reflector.collection.resource
            ages[name] = round(max(ages.get(name, 0.0), reflector.age()), 1)
        return ages

    def agent_sandbox_state(self) -> str:
        if not self.agent_sandboxes:
            return "off"
        if any(r.absent for r in self.agent_sandboxes):
            return "not installed"
        if not all(r.listings for r in self.agent_sandboxes):
            return "not listed yet"
        if all(r.streaming for r in self.agent_sandboxes):
            return "watching"
        return "listed; its watch is reconnecting"


def report(readiness: Readiness, streams: Streams, parts: Callable[[], dict[str, Any]]
           ) -> tuple[bool, dict[str, Any]]:  # fmt: skip
    """Ready or not, and why: `parts()` gives the controller's side (firewall reading,
    tracked, failing policies, leader, backlog, task restarts)."""
    p = parts()
    firewall = p.pop("firewall")
    coverage = firewall.coverage() if firewall else None
    not_open = streams.not_open()
    releases = p.get("releases")
    checks = {
        "api_reachable": bool(readiness.api_reachable),
        "watches_open": not not_open,
        "watches_fresh": streams.fresh(),
        "firewall_covered": firewall.covered if firewall else None,
        # False while another release's controller serves these DeathWatches and this one
        # gives way (ADR 0038): /readyz says so (the controller has no readiness probe: a
        # dependency's outage must not unroute its metrics)
        "not_refused": None if releases is None else releases["refused"] is None,
    }
    details = {
        "watches_not_open": not_open,
        "watch_stream_age_seconds": streams.ages(),
        **p,
        "api_error": readiness.api_error,
        "api_checked_at": readiness.checked_at.isoformat() if readiness.checked_at else None,
        "firewall": to_document(coverage) if coverage else None,
        "agent_sandbox": streams.agent_sandbox_state(),
    }
    ok = all(v is not False for v in checks.values())
    return ok, {**checks, "details": details}
