"""Where each reflector's objects go: pods, SandboxVerdicts, DeathWatches and agent-sandbox's
Sandboxes to the core, a bug in handling one of them contained (logged with its
traceback, counted, and the next object handled afresh: never a stream torn down and listed
again for one)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import structlog

from deathwatch._api.agent_sandbox import SandboxObject
from deathwatch._api.objects import DeathWatchObject, EventType, Undecodable, Verdict
from deathwatch._api.resources import SV_PLURAL
from deathwatch._engine.podview import PodView
from deathwatch._operator.instruments import gcpauses
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.memory.core import Core
from deathwatch._operator.memory.deathwatches import Change
from deathwatch._operator.passes import owners, pods, verdict_watch
from deathwatch._operator.writing.writer import Writer

log = structlog.get_logger("deathwatch.sinks")


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


class PodSink:
    """The pod reflector's: each event to the core, a bug in one contained."""

    def __init__(self, core: Core, metrics: Metrics) -> None:
        self.core, self.metrics = core, metrics

    def listing(self, scope: str | None) -> None:
        pods.listing(self.core, scope)

    def event(self, kind: EventType, pod: PodView, received: float, version: str) -> None:
        with contained(self.metrics, "pod_event", pod):
            pods.on_pod(self.core, kind, pod, received, version)

    def listed(self, scope: str | None) -> None:
        with contained(self.metrics, "pod_listing", {}):
            pods.listed(self.core, scope)
        # what a listing built lives as long as its pods: out of the collector's reach
        gcpauses.freeze("pod listing")

    def undecodable(self, error: Undecodable) -> None:
        self.core.undecodable(error)


class VerdictSink:
    """The verdict reflector's: its first listing restores the engine's memory; after that,
    what the watch shows is what the API holds (writer.observed), and a relisting that does
    not show a verdict the writer knew says it was deleted meanwhile."""

    def __init__(self, core: Core, writer: Writer, metrics: Metrics) -> None:
        self.core, self.writer, self.metrics = core, writer, metrics
        self.restoring = True
        self.restored = 0
        self.seen: set[tuple[str, str]] = set()

    def listing(self, scope: str | None) -> None:
        self.seen = set()

    def event(self, kind: EventType, verdict: Verdict, received: float, version: str) -> None:
        with contained(self.metrics, "verdict_event", verdict):
            if self.restoring:
                self.restored += verdict_watch.restore(self.core, verdict)
            else:
                if kind is EventType.LISTED:
                    self.seen.add((verdict.namespace, verdict.name))
                verdict_watch.on_verdict(self.core, kind, verdict)

    def listed(self, scope: str | None) -> None:
        if self.restoring:
            self.restoring = False
            log.info("restored verdicts", count=self.restored, scope=scope or "all")
            return
        for plural, namespace, name in self.writer.known(SV_PLURAL, scope):
            if (namespace, name) not in self.seen:
                self.writer.observed(plural, namespace, name, None, "")

    def undecodable(self, error: Undecodable) -> None:
        self.core.undecodable(error)


class DeathWatchSink:
    """A DeathWatch reflector's (one each: a listing's `seen` is its own): each DeathWatch to
    the controller; a new or changed selection to `adopt` (its namespace's pods listed),
    once the first listing is complete (the pods' own first listing follows it: nothing to
    adopt before); a relisting's missing ones were deleted meanwhile."""

    def __init__(self, core: Core, metrics: Metrics) -> None:
        self.core, self.metrics = core, metrics
        self.adopt: Callable[[Change], None] | None = None  # set once pods may be adopted
        self.seen: set[tuple[str, str]] = set()

    def listing(self, scope: str | None) -> None:
        self.seen = set()

    def event(self, kind: EventType, dw: DeathWatchObject, received: float, version: str) -> None:
        change = None
        with contained(self.metrics, "deathwatch_event", dw):
            if kind is EventType.LISTED:
                self.seen.add(dw.key)
            change = owners.on_deathwatch(self.core, kind, dw)
        if change is not None and self.adopt is not None:
            self.adopt(change)

    def listed(self, scope: str | None) -> None:
        gone = [key for key in self.core.deathwatches
                if (scope is None or key[0] == scope) and key not in self.seen]  # fmt: skip
        for key in gone:
            log.info("deathwatch deleted while unwatched", namespace=key[0], deathwatch=key[1])
            with contained(self.metrics, "deathwatch_listing", {}):
                owners.drop_deathwatch(self.core, key)
        log.info("deathwatches listed", scope=scope or "all", count=len(self.seen))

    def undecodable(self, error: Undecodable) -> None:
        self.core.undecodable(error)


class AgentSandboxSink:
    """The Sandbox reflector's: each Sandbox to the controller; a relisting's missing ones
    were deleted meanwhile."""

    def __init__(self, core: Core, metrics: Metrics) -> None:
        self.core, self.metrics = core, metrics
        self.seen: set[tuple[str, str]] = set()

    def listing(self, scope: str | None) -> None:
        self.seen = set()

    def event(self, kind: EventType, sandbox: SandboxObject, received: float, version: str) -> None:
        with contained(self.metrics, "sandbox_event", sandbox):
            if kind is EventType.LISTED:
                self.seen.add((sandbox.namespace, sandbox.name))
            owners.on_agent_sandbox(self.core, kind, sandbox)

    def listed(self, scope: str | None) -> None:
        self.core.agent_sandboxes.relisted(scope, self.seen)
        log.info("agent-sandbox Sandboxes listed", scope=scope or "all", count=len(self.seen))

    def undecodable(self, error: Undecodable) -> None:
        self.core.undecodable(error)
