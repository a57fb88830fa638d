"""One collection (pods, SandboxVerdicts, agent-sandbox's Sandboxes) kept by its own
reflector, for ever: the list/watch protocol (deathwatch._kube.listwatch, written once for
every part of deathwatch) over the controller's API client, each object decoded once, from
its bytes, by the collection's typed decoder (msgspec, in C, only the fields it declares),
and handed to a receiver. Nothing is kept here but the protocol's state (the version to resume
from) and when the stream last delivered anything.

Explicit timeouts: each page `rest.API_TIMEOUT`; a watch with no byte at all, not even a
bookmark, for `inactivity` seconds is a dead connection and is reconnected. A listing tells
the receiver when it begins and when it is complete: what a complete listing did not show no
longer exists (deleted while the watch was down or could not resume). Failures are counted
(`deathwatch_api_errors_total{operation="watch_<resource>"}`), logged and retried with
backoff; a bug is not retried (it ends the run, for its supervisor to restart and report).

The receiver's calls run on the event loop between two reads, in the stream's order; the
reflector yields to the loop every `YIELD_EVERY` objects of a listing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import msgspec
import structlog

from deathwatch._api.objects import EventType, Undecodable
from deathwatch._api.rest import Rest
from deathwatch._kube.errors import describe, label
from deathwatch._kube.listwatch import Item, Listed, Listing, ListWatch, Noted, outputs
from deathwatch._operator.instruments.metrics import Metrics

log = structlog.get_logger("deathwatch.reflector")
T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)
YIELD_EVERY = 256
ABSENT_RETRY = 10.0
# a collection not listed this long after its reflector began is named in /readyz, a metric
# (deathwatch_watch_not_open) and a log line: start-up waits for it, never silently
OPEN_DEADLINE = 30.0


class Receiver(Protocol[T_contra]):
    def listing(self, scope: str | None) -> None:
        """A (re)listing of `scope` (a namespace, None: all) begins."""

    def event(self, kind: EventType, obj: T_contra, received: float, version: str) -> None:
        """One object, decoded; `received` is when its bytes arrived (monotonic), `version`
        its resourceVersion (comparable for one object's states, KEP-5504)."""

    def listed(self, scope: str | None) -> None:
        """The listing of `scope` is complete and the watch follows it."""

    def undecodable(self, error: Undecodable) -> None:
        """An object that could not be decoded (it is skipped)."""


@dataclass(frozen=True)
class Collection(Generic[T]):
    """What to list and watch, and how to read one object: `decode(bytes) -> object`,
    raising Undecodable (msgspec's decoders take the Raw as it is)."""

    resource: str  # for metrics and logs: "pods", "sandboxverdicts"
    path: str  # "/api/v1/pods", "/api/v1/namespaces/NS/pods", ...
    decode: Callable[[msgspec.Raw], T]
    scope: str | None = None  # the namespace the path is in (None: all)
    label_selector: str | None = None
    shard_selector: str | None = None  # KEP-5866 (sharding.selector): this shard's pods only
    field_selector: str | None = None  # the API server's filter: "reason=Evicted" (Events)
    # another project's CRD, which may be installed after we start: a 404 from its list is
    # not an error but "not installed (yet)", checked again every ABSENT_RETRY seconds
    optional: bool = False


_TYPES = {t.value: t for t in EventType}


@dataclass
class Reflector(Generic[T]):
    rest: Rest
    collection: Collection[T]
    receiver: Receiver[T]
    metrics: Metrics
    server_timeout: int = 240  # the API server ends a watch after this (seconds, jittered)
    inactivity: float = 70.0  # no byte for this long: a dead connection
    open_deadline: float = OPEN_DEADLINE  # not listed by then: named (/readyz, metric, log)
    started: float = field(default_factory=time.monotonic)
    last_activity: float | None = None  # monotonic: anything delivered, bookmarks included
    streaming: bool = False  # a watch is open now (not between a failure and its retry)
    server_filtered: bool | None = None  # sharded: the server applied the shard selector
    overdue: bool = False  # not listed within OPEN_DEADLINE of its start (until it is)
    last_error: str | None = None  # the last failure to list or watch, for /readyz
    _deadline: asyncio.TimerHandle | None = None
    _listed: asyncio.Event = field(default_factory=asyncio.Event)
    _settled: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        c = self.collection
        self.protocol = ListWatch(
            label_selector=c.label_selector, shard_selector=c.shard_selector,
            field_selector=c.field_selector, server_timeout=self.server_timeout,
            optional=c.optional, absent_retry=ABSENT_RETRY,
        )  # fmt: skip

    @property
    def listings(self) -> int:
        """Complete listings so far."""
        return self.protocol.listings

    @property
    def absent(self) -> bool:
        """An optional collection found not installed, until it is."""
        return self.protocol.absent

    @property
    def name(self) -> str:
        """What /readyz and the logs call it: `pods in team-a`, `sandboxverdicts (all)`."""
        c = self.collection
        where = f"in {c.scope}" if c.scope else "(all)"
        chosen = c.label_selector or c.field_selector
        selector = f" [{chosen}]" if chosen else ""
        return f"{c.resource} {where}{selector}"

    async def run(self) -> None:
        """List, then watch, for ever (supervised)."""
        c, receiver = self.collection, self.receiver
        if not self._settled.is_set() and self._deadline is None:
            self._deadline = asyncio.get_running_loop().call_later(
                max(0.0, self.open_deadline - (time.monotonic() - self.started)), self._overdue
            )
        transport = _Activity(self, self.rest.transport(c.path, self.inactivity))
        count = 0
        async for out in outputs(self.protocol, transport):
            if isinstance(out, Item):
                self._deliver(out)
                if out.type == "LISTED":
                    count += 1
                    if count % YIELD_EVERY == 0:
                        await asyncio.sleep(0)
            elif isinstance(out, Listing):
                count = 0
                receiver.listing(c.scope)
            elif isinstance(out, Listed):
                if c.shard_selector:
                    self._echoed(self.protocol.echo == c.shard_selector)
                receiver.listed(c.scope)
                self._listed.set()
                self._opened()
                log.info("listed", resource=c.resource, scope=c.scope or "all", count=out.count,
                         resource_version=out.version)  # fmt: skip
            else:
                self._noted(out)

    def _echoed(self, applied: bool) -> None:
        """Sharded: whether the API server said it applied our selector (KEP-5866); either
        way the filter runs here too (the controller's `mine`)."""
        self.metrics.shard_server_filtered.set(1 if applied else 0)
        if applied != self.server_filtered:
            self.server_filtered = applied
            log.info("shard selector " + ("applied by the API server" if applied else
                     "not applied by the API server: filtered here"),
                     resource=self.collection.resource, echo=self.protocol.echo)  # fmt: skip

    def _noted(self, note: Noted) -> None:
        c = self.collection
        if note.error is not None:
            self.last_error = describe(note.error)[:200]
        if note.what == "failed" and note.error is not None:
            self.metrics.api_errors.labels(f"watch_{c.resource}", label(note.error)).inc()
            log.warning("watch failed, resuming", resource=c.resource,
                        error=describe(note.error)[:200], retry_in=note.retry_in,
                        resume_from=self.protocol.version or "a new listing")  # fmt: skip
        elif note.what == "expired":
            self.metrics.relists.labels(c.resource).inc()
            log.warning("a watch could not resume (410 Gone): listing again",
                        resource=c.resource,
                        error=describe(note.error)[:200] if note.error else None)  # fmt: skip
        elif note.what == "absent":
            self._opened()
            log.info("not installed: checking again periodically", resource=c.resource,
                     path=c.path, every=ABSENT_RETRY)  # fmt: skip
        elif note.what == "installed":
            log.info("installed: watching", resource=c.resource, path=c.path)

    def _overdue(self) -> None:
        """Its deadline passed with no listing: said, where people and alerts look."""
        if self._settled.is_set():
            return
        self.overdue = True
        c = self.collection
        self.metrics.watch_not_open.labels(c.resource, c.scope or "").set(1)
        log.error("watch not open within its deadline: start-up waits for it",
                  watch=self.name, waited=self.open_deadline,
                  error=self.last_error or "none yet: no answer")  # fmt: skip

    def _opened(self) -> None:
        """Listed (or an optional collection found absent): open, at last or as usual."""
        if self._deadline is not None:
            self._deadline.cancel()
        if self.overdue:
            self.overdue = False
            c = self.collection
            self.metrics.watch_not_open.labels(c.resource, c.scope or "").set(0)
            log.info("watch open after its deadline", watch=self.name,
                     after=round(time.monotonic() - self.started, 1))  # fmt: skip
        self._settled.set()

    async def listed(self) -> None:
        """Wait for the first complete listing."""
        await self._listed.wait()

    async def settled(self) -> None:
        """Wait for the first complete listing, or (optional) for it to be found absent."""
        await self._settled.wait()

    def age(self) -> float:
        """Seconds since the stream last delivered anything (since start, if never)."""
        return time.monotonic() - (self.last_activity or self.started)

    def _seen(self) -> None:
        self.last_activity = time.monotonic()
        self.metrics.watch_activity.labels(self.collection.resource).set(time.time())

    def _deliver(self, item: Item) -> None:
        try:
            obj = self.collection.decode(item.raw)
        except Undecodable as exc:
            self.receiver.undecodable(exc)
            return
        self.metrics.last_event.labels(self.collection.resource).set(time.time())
        self.receiver.event(_TYPES[item.type], obj, time.monotonic(), item.version)


class _Activity:
    """The collection's transport, noting every byte that comes (pages, lines, bookmarks)
    for the stream's age, and every watch opened."""

    def __init__(self, reflector: Reflector[T], inner: Any) -> None:
        self.reflector, self.inner = reflector, inner

    async def get(self, params: Mapping[str, str | int]) -> bytes:
        body: bytes = await self.inner.get(params)
        self.reflector._seen()
        return body

    @asynccontextmanager
    async def stream(self, params: Mapping[str, str | int]) -> AsyncIterator[AsyncIterator[bytes]]:
        self.reflector.metrics.watch_connections.labels(self.reflector.collection.resource).inc()
        async with self.inner.stream(params) as lines:
            self.reflector.streaming = True
            try:
                yield self._noting(lines)
            finally:
                self.reflector.streaming = False

    async def _noting(self, lines: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for line in lines:
            self.reflector._seen()
            yield line

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)
