"""List and watch one collection (pods, SandboxVerdicts), decoding each event once, for ever.

kubespawner's reflector, as this controller needs it:

- one LIST, in pages, then a WATCH from the list's resourceVersion, with bookmarks. The watch
  resumes from the last version it delivered after the server ends it (`server_timeout`), a
  dropped connection or an error (with backoff); a 410 Gone (the version was compacted away)
  lists again.
- explicit timeouts: each page `rest.API_TIMEOUT`; a watch with no byte at all, not even a
  bookmark, for `inactivity` seconds is a dead connection and is reconnected.
- every object is decoded once, from its bytes, by the collection's typed decoder (msgspec,
  in C, only the fields it declares); nothing is kept here but the version to resume from.
  The sink keeps what it needs.
- a listing tells the sink when it begins and when it is complete: what a complete listing
  did not show no longer exists (deleted while the watch was down or could not resume).

The sink's calls run on the event loop between two reads, in the stream's order; the
reflector yields to the loop every `YIELD_EVERY` objects of a listing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, Protocol, TypeVar

import msgspec
import structlog

from deathwatch._operator.kube import api_message, status_code
from deathwatch._operator.metrics import Metrics
from deathwatch._operator.rest import ApiError, Rest

log = structlog.get_logger("deathwatch.reflector")
T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)
PAGE = 500
YIELD_EVERY = 256
BACKOFF = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
ABSENT_RETRY = 10.0


class Kind(Enum):
    LISTED = "LISTED"  # in a listing: exists now (it may or may not be new)
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


class Undecodable(ValueError):
    """An object the collection's decoder refuses; `who` names it as far as it could be read."""

    def __init__(self, who: str, problem: str) -> None:
        super().__init__(f"{who}: {problem}")
        self.who = who
        self.problem = problem


class Sink(Protocol[T_contra]):
    def listing(self, scope: str | None) -> None:
        """A (re)listing of `scope` (a namespace, None: all) begins."""

    def event(self, kind: Kind, obj: T_contra, received: float, version: str) -> None:
        """One object, decoded; `received` is when its bytes arrived (monotonic), `version`
        its resourceVersion (comparable for one object's states, KEP-5504)."""

    def listed(self, scope: str | None) -> None:
        """The listing of `scope` is complete and the watch follows it."""

    def undecodable(self, error: Undecodable) -> None:
        """An object that could not be decoded (it is skipped)."""


@dataclass(frozen=True)
class Collection(Generic[T]):
    """What to list and watch, and how to read one object: `decode(bytes) -> (object, its
    resourceVersion)`, raising Undecodable (msgspec's decoders take the Raw as it is)."""

    resource: str  # for metrics and logs: "pods", "sandboxverdicts"
    path: str  # "/api/v1/pods", "/api/v1/namespaces/NS/pods", ...
    decode: Callable[[msgspec.Raw], tuple[T, str]]
    scope: str | None = None  # the namespace the path is in (None: all)
    label_selector: str | None = None
    # another project's CRD, which may be installed after we start: a 404 from its list is
    # not an error but "not installed (yet)", checked again every ABSENT_RETRY seconds
    optional: bool = False


class _Event(msgspec.Struct):
    type: str
    object: msgspec.Raw


class _ListMeta(msgspec.Struct, rename="camel"):
    resource_version: str = ""
    continue_: str | None = msgspec.field(name="continue", default=None)


class _Page(msgspec.Struct):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[msgspec.Raw] = msgspec.field(default_factory=list)


class _ObjectMeta(msgspec.Struct, rename="camel"):
    resource_version: str = ""


class _Bookmark(msgspec.Struct):
    metadata: _ObjectMeta = msgspec.field(default_factory=_ObjectMeta)


class _Status(msgspec.Struct):
    code: int = 0
    reason: str = ""
    message: str = ""


_event = msgspec.json.Decoder(_Event).decode
_page = msgspec.json.Decoder(_Page).decode


def page(data: bytes) -> tuple[list[msgspec.Raw], str | None]:
    """A listed page: its items, each to be decoded by its collection, and the token of the
    next page (None: the last)."""
    listed = _page(data)
    return listed.items, listed.metadata.continue_


_bookmark = msgspec.json.Decoder(_Bookmark).decode
_status = msgspec.json.Decoder(_Status).decode


class Absent(Exception):
    """An optional collection's resource is not served (its CRD is not installed)."""


class Expired(Exception):
    """410 Gone: the version to resume from was compacted away: list again."""


@dataclass
class Reflector(Generic[T]):
    rest: Rest
    collection: Collection[T]
    sink: Sink[T]
    metrics: Metrics
    server_timeout: int = 240  # the API server ends a watch after this (seconds, jittered)
    inactivity: float = 70.0  # no byte for this long: a dead connection
    started: float = field(default_factory=time.monotonic)
    last_activity: float | None = None  # monotonic: anything delivered, bookmarks included
    listings: int = 0  # complete listings so far
    absent: bool = False  # an optional collection found not installed, until it is
    _version: str = ""
    _listed: asyncio.Event = field(default_factory=asyncio.Event)
    _settled: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        """List, then watch, for ever (supervised). Failures are counted, logged and retried
        with backoff; nothing here gives up."""
        failures = 0
        while True:
            try:
                if not self._version:
                    await self._list()
                await self._watch()
                failures = 0  # the server ended it: resume at once
            except asyncio.CancelledError:
                raise
            except Absent:
                if not self.absent:
                    log.info("not installed: checking again periodically",
                             resource=self.collection.resource, path=self.collection.path,
                             every=ABSENT_RETRY)  # fmt: skip
                self.absent = True
                self._settled.set()
                self._version = ""
                await asyncio.sleep(ABSENT_RETRY)
            except Expired as exc:
                self.metrics.relists.labels(self.collection.resource).inc()
                log.warning("a watch could not resume (410 Gone): listing again",
                            resource=self.collection.resource, error=str(exc)[:200])  # fmt: skip
                self._version = ""
            except Exception as exc:
                delay = BACKOFF[min(failures, len(BACKOFF) - 1)]
                failures += 1
                self.metrics.api_errors.labels(
                    f"watch_{self.collection.resource}", status_code(exc)
                ).inc()
                log.warning("watch failed, resuming", resource=self.collection.resource,
                            error=api_message(exc)[:200], retry_in=delay,
                            resume_from=self._version or "a new listing")  # fmt: skip
                await asyncio.sleep(delay)

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

    def _params(self, **more: str | int) -> dict[str, str | int]:
        params: dict[str, str | int] = dict(more)
        if self.collection.label_selector:
            params["labelSelector"] = self.collection.label_selector
        return params

    async def _list(self) -> None:
        c, sink = self.collection, self.sink
        sink.listing(c.scope)
        token: str | None = None
        count = 0
        while True:
            params = self._params(limit=PAGE)
            if token:
                params["continue"] = token
            try:
                data = await self.rest.request("GET", c.path, params=params)
            except ApiError as exc:
                if exc.status == 410:  # the continue token expired: the listing starts over
                    raise Expired(api_message(exc)) from None
                if exc.status == 404 and c.optional:
                    raise Absent(c.path) from None
                raise
            self._seen()
            page = _page(data)
            received = time.monotonic()
            for raw in page.items:
                self._deliver(Kind.LISTED, raw, received)
                count += 1
                if count % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
            token = page.metadata.continue_
            if not token:
                self._version = page.metadata.resource_version
                break
        self.listings += 1
        if self.absent:
            log.info("installed: watching", resource=c.resource, path=c.path)
            self.absent = False
        sink.listed(c.scope)
        self._listed.set()
        self._settled.set()
        log.info("listed", resource=c.resource, scope=c.scope or "all", count=count,
                 resource_version=self._version)  # fmt: skip

    async def _watch(self) -> None:
        c = self.collection
        params = self._params(
            watch="1",
            allowWatchBookmarks="true",
            resourceVersion=self._version,
            timeoutSeconds=self.server_timeout,
        )
        self.metrics.watch_connections.labels(c.resource).inc()
        async with self.rest.stream(c.path, params, inactivity=self.inactivity) as lines:
            async for line in lines:
                self._seen()
                received = time.monotonic()
                try:
                    event = _event(line)
                except msgspec.DecodeError as exc:
                    raise ValueError(f"a watch line that is not an event: {exc}") from None
                if event.type == "BOOKMARK":
                    version = _bookmark(event.object).metadata.resource_version
                    self._version = version or self._version
                elif event.type == "ERROR":
                    status = _status(event.object)
                    if status.code == 410:
                        raise Expired(status.message)
                    raise ApiError(status.code or 500, status.reason, bytes(event.object))
                else:
                    self._deliver(Kind(event.type), event.object, received)

    def _deliver(self, kind: Kind, raw: msgspec.Raw, received: float) -> None:
        try:
            obj, version = self.collection.decode(raw)
        except Undecodable as exc:
            self.sink.undecodable(exc)
            return
        if kind is not Kind.LISTED:
            self._version = version or self._version
        self.metrics.last_event.labels(self.collection.resource).set(time.time())
        self.sink.event(kind, obj, received, version)
