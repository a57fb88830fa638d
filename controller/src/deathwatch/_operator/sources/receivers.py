"""Where each reflector's objects go: pods, SandboxVerdicts, DeathWatches, agent-sandbox's
Sandboxes and the kubelet's Evicted Events to their passes, a bug in handling one of them
contained (logged with its traceback, counted, and the next object handled afresh: never a
stream torn down and listed again for one)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import structlog

from deathwatch._api.agent_sandbox import SandboxObject
from deathwatch._api.objects import (
    DeathWatchObject,
    EventType,
    EvictionNotice,
    Undecodable,
    VerdictObject,
)
from deathwatch._engine.podview import PodView
from deathwatch._operator.instruments import gcpauses
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.memory.deathwatches import Revised
from deathwatch._operator.passes.owners import OwnerPass
from deathwatch._operator.passes.pods import PodPass
from deathwatch._operator.passes.verdict_watch import VerdictPass

log = structlog.get_logger("deathwatch.receivers")


@contextlib.contextmanager
def contained(metrics: Metrics, handler: str, body: Any) -> Iterator[None]:
    """A bug in handling one object is logged with its traceback and counted
    (`deathwatch_handler_errors_total{handler}`); the caller carries on with the next."""
    try:
        yield
    except Exception:
        metrics.handler_errors.labels(handler).inc()
        meta = body.get("metadata") or {} if isinstance(body, Mapping) else {}
        who = (meta.get("namespace"), meta.get("name")) if meta else (
            getattr(body, "namespace", None), getattr(body, "name", None)
        )  # fmt: skip
        log.exception("event not handled", handler=handler, namespace=who[0], name=who[1])


class Malformed:
    """Objects a watch could not decode: each said once (a bad object in every relisting
    would say so every time), and skipped."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, error: Undecodable) -> None:
        if error.who not in self.seen:
            self.seen.add(error.who)
            log.warning("object skipped: malformed", object=error.who, error=error.problem)


class PodReceiver:
    """The pod reflector's: each event to the pod pass, a bug in one contained."""

    def __init__(self, pods: PodPass, malformed: Malformed, metrics: Metrics) -> None:
        self.pods, self.undecodable, self.metrics = pods, malformed, metrics

    def listing(self, scope: str | None) -> None:
        self.pods.listing(scope)

    def event(self, kind: EventType, pod: PodView, received: float, version: str) -> None:
        with contained(self.metrics, "pod_event", pod):
            self.pods.on_pod(kind, pod, received, version)

    def listed(self, scope: str | None) -> None:
        with contained(self.metrics, "pod_listing", {}):
            self.pods.listed(scope)
        # what a listing built lives as long as its pods: out of the collector's reach
        gcpauses.freeze("pod listing")


class VerdictReceiver:
    """The verdict reflector's: its first listing to the pass's `restore` (the engine's
    memory rebuilt); after that each event to `on_verdict`, and each complete relisting, with
    what it showed, to `relisted` (what it did not show was deleted meanwhile)."""

    def __init__(self, verdicts: VerdictPass, malformed: Malformed, metrics: Metrics) -> None:
        self.verdicts, self.metrics = verdicts, metrics
        self.undecodable = malformed
        self.restoring = True
        self.restored = 0
        self.seen: set[tuple[str, str]] = set()

    def listing(self, scope: str | None) -> None:
        self.seen = set()

    def event(self, kind: EventType, verdict: VerdictObject, received: float, version: str) -> None:
        with contained(self.metrics, "verdict_event", verdict):
            if self.restoring:
                self.restored += self.verdicts.restore(verdict)
            else:
                if kind is EventType.LISTED:
                    self.seen.add((verdict.namespace, verdict.name))
                self.verdicts.on_verdict(kind, verdict)

    def listed(self, scope: str | None) -> None:
        if self.restoring:
            self.restoring = False
            log.info("restored verdicts", count=self.restored, scope=scope or "all")
            return
        with contained(self.metrics, "verdict_listing", {}):
            self.verdicts.relisted(scope, self.seen)


class DeathWatchReceiver:
    """A DeathWatch reflector's (one each: a listing's `seen` is its own): each DeathWatch to
    the owners' pass; a new or changed selection to `adopt` (its namespace's pods listed),
    once the first listing is complete (the pods' own first listing follows it: nothing to
    adopt before); each complete listing, with what it showed, to the pass."""

    def __init__(self, owners: OwnerPass, malformed: Malformed, metrics: Metrics) -> None:
        self.owners, self.metrics = owners, metrics
        self.undecodable = malformed
        self.adopt: Callable[[Revised], None] | None = None  # set once pods may be adopted
        self.seen: set[tuple[str, str]] = set()

    def listing(self, scope: str | None) -> None:
        self.seen = set()

    def event(self, kind: EventType, dw: DeathWatchObject, received: float, version: str) -> None:
        change = None
        with contained(self.metrics, "deathwatch_event", dw):
            if kind is EventType.LISTED:
                self.seen.add(dw.key)
            change = self.owners.on_deathwatch(kind, dw)
        if change is not None and self.adopt is not None:
            self.adopt(change)

    def listed(self, scope: str | None) -> None:
        with contained(self.metrics, "deathwatch_listing", {}):
            self.owners.deathwatches_listed(scope, self.seen)


class AgentSandboxReceiver:
    """The Sandbox reflector's: each Sandbox to the owners' pass, and each complete listing,
    with what it showed."""

    def __init__(self, owners: OwnerPass, malformed: Malformed, metrics: Metrics) -> None:
        self.owners, self.metrics = owners, metrics
        self.undecodable = malformed
        self.seen: set[tuple[str, str]] = set()

    def listing(self, scope: str | None) -> None:
        self.seen = set()

    def event(self, kind: EventType, sandbox: SandboxObject, received: float, version: str) -> None:
        with contained(self.metrics, "sandbox_event", sandbox):
            if kind is EventType.LISTED:
                self.seen.add((sandbox.namespace, sandbox.name))
            self.owners.on_agent_sandbox(kind, sandbox)

    def listed(self, scope: str | None) -> None:
        with contained(self.metrics, "sandbox_listing", {}):
            self.owners.sandboxes_listed(scope, self.seen)


class EvictionReceiver:
    """The kubelet's Evicted Events' reflector: each to the pod pass (a deletion of one says
    nothing: the pod keeps the word), a bug in one contained."""

    def __init__(self, pods: PodPass, malformed: Malformed, metrics: Metrics) -> None:
        self.pods, self.undecodable, self.metrics = pods, malformed, metrics

    def listing(self, scope: str | None) -> None:
        pass

    def event(self, kind: EventType, notice: EvictionNotice, received: float, version: str) -> None:
        if kind is EventType.DELETED:
            return
        with contained(self.metrics, "eviction_event", notice):
            self.pods.evicted(notice)

    def listed(self, scope: str | None) -> None:
        pass
