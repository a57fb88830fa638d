"""List and watch one collection, for ever: the protocol written once, and its one driver.

kubespawner's reflector and client-go's, as deathwatch needs them: one LIST, in pages, then a
WATCH from the listing's resourceVersion, with bookmarks; resumed from the last version it
delivered when the server ends the watch (`server_timeout`) or the connection drops; listed
again on 410 Gone (the version was compacted away, or a continue token expired); an optional
collection's 404 is "not installed (yet)", looked for again every `absent_retry` seconds;
every other failure is retried with backoff, but a bug (an error that is neither the API's
nor the network's, errors.retryable) is never retried: it ends the run for its supervisor.

`ListWatch.run` is a generator that says what to do next, and does no I/O: it yields a call
(`Get` a page, open a `Watch`, `Sleep`) and takes its reply, or yields an output for the
consumer (`Listing`, `Item`, `Listed`, `Noted`). `outputs` runs it over a `Transport`, as
an async iterator of outputs: the controller's transport is aiohttp on its event loop, the
firewall agent's urllib in a worker thread. Callers: the controller's reflectors (pods,
verdicts, Sandboxes), a DeathWatch's adoption of its pods (one listing, `follow=False`), the
public client's `watch`, and the agent's Node and sandbox-pod watches.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Generator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Final, Protocol

import msgspec

from deathwatch._kube.backoff import WATCH
from deathwatch._kube.errors import ApiError, NoAnswer, retryable

LISTED: Final = "LISTED"  # the type of an item a listing showed (it exists now)
PAGE: Final = 500
Params = dict[str, str | int]


# --- what the protocol asks of a driver ---------------------------------------------------


class Get(msgspec.Struct, frozen=True):
    """GET the collection with these parameters; reply with the body."""

    params: Params


class Watch(msgspec.Struct, frozen=True):
    """Open a watch with these parameters; reply with each line as it comes, then END."""

    params: Params


class Sleep(msgspec.Struct, frozen=True):
    seconds: float


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NEXT: Final = _Marker("NEXT")  # yielded during a watch: send the next line
END: Final = _Marker("END")  # sent during a watch: the server ended it


# --- what it hands the consumer ------------------------------------------------------------


class Listing(msgspec.Struct, frozen=True):
    """A (re)listing begins: what it does not show by `Listed` no longer exists."""


class Item(msgspec.Struct, frozen=True):
    """One object: `type` is LISTED (shown by a listing), ADDED, MODIFIED or DELETED; `raw`
    its JSON, for the consumer's own typed decoder; `version` its resourceVersion."""

    type: str
    raw: msgspec.Raw
    version: str


class Listed(msgspec.Struct, frozen=True):
    """The listing is complete (`count` items) and the watch follows from `version`."""

    version: str
    count: int


class Noted(msgspec.Struct, frozen=True):
    """For the consumer's logs and metrics: `failed` (retried in `retry_in` seconds),
    `expired` (410: listing again), `absent` (an optional collection is not served),
    `installed` (it is now)."""

    what: str
    error: BaseException | None = None
    retry_in: float | None = None


Output = Listing | Item | Listed | Noted
Call = Get | Watch | Sleep | _Marker
_OUTPUTS: Final = (Listing, Item, Listed, Noted)


# --- the envelopes, decoded once each: only what the protocol reads ------------------------


class _ShardInfo(msgspec.Struct):
    selector: str = ""


class _ListMeta(msgspec.Struct, rename="camel"):
    resource_version: str = ""
    continue_: str | None = msgspec.field(name="continue", default=None)
    shard_info: _ShardInfo | None = None  # KEP-5866: the shard selector the server applied


class _Page(msgspec.Struct):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[msgspec.Raw] = msgspec.field(default_factory=list)


class _Event(msgspec.Struct):
    type: str
    object: msgspec.Raw


class _Meta(msgspec.Struct, rename="camel"):
    resource_version: str = ""


class _Versioned(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


class _Status(msgspec.Struct):
    code: int = 0
    reason: str = ""


_page = msgspec.json.Decoder(_Page).decode
_event = msgspec.json.Decoder(_Event).decode
_versioned = msgspec.json.Decoder(_Versioned).decode
_status = msgspec.json.Decoder(_Status).decode


def version_of(raw: msgspec.Raw | bytes) -> str:
    """An object's resourceVersion, read from its JSON without decoding the rest."""
    try:
        return _versioned(raw).metadata.resource_version
    except (msgspec.DecodeError, msgspec.ValidationError):
        return ""


def page(data: bytes) -> tuple[list[msgspec.Raw], str | None, str]:
    """A listed page: its items, the next page's token (None: the last), its version."""
    listed = _page(data)
    return listed.items, listed.metadata.continue_, listed.metadata.resource_version


def shard_echo(data: bytes) -> str | None:
    """The shard selector a sharded list says it applied (None: it says none: the server
    did not filter, its gate off or too old to know the parameter)."""
    info = _page(data).metadata.shard_info
    return info.selector if info is not None else None


class _Absent(Exception):
    pass


# --- the protocol ----------------------------------------------------------------------------


class ListWatch:
    """The state of one collection's list-then-watch, and the protocol that moves it."""

    def __init__(
        self,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        shard_selector: str | None = None,
        page_size: int = PAGE,
        server_timeout: int = 240,
        backoff: tuple[float, ...] = WATCH,
        optional: bool = False,
        absent_retry: float = 10.0,
        follow: bool = True,
        fatal: Callable[[BaseException], bool] = lambda exc: False,
        attempts: int | None = None,
    ) -> None:
        """`shard_selector`: KEP-5866's `shardSelector`, sent with every list and watch; what
        the server echoed at the last listing is `echo` (None: not applied: the caller must
        filter). `optional`: a 404 of its listing means "not installed". `follow=False`: one
        complete listing, then the run ends. `fatal(exc)`: an error that ends the run (a
        client that must not wait on a 403). `attempts`: failures in a row after which the
        last is raised (None: never)."""
        self.selectors: Params = {}
        if label_selector:
            self.selectors["labelSelector"] = label_selector
        if field_selector:
            self.selectors["fieldSelector"] = field_selector
        if shard_selector:
            self.selectors["shardSelector"] = shard_selector
        self.echo: str | None = None  # the shard selector the last listing says it applied
        self.page_size = page_size
        self.server_timeout = server_timeout
        self.backoff = backoff
        self.optional = optional
        self.absent_retry = absent_retry
        self.follow = follow
        self.fatal = fatal
        self.attempts = attempts
        self.version = ""  # where the watch resumes from ("": list first)
        self.listings = 0  # complete listings so far
        self.absent = False  # an optional collection not served, until it is

    def run(self) -> Generator[Call | Output, bytes | _Marker | None, None]:
        failures = 0
        while True:
            try:
                if not self.version:
                    yield from self._list()
                    if not self.follow:
                        return
                yield from self._watch()
                failures = 0  # the server ended the watch: resume at once
            except _Absent:
                if not self.absent:
                    yield Noted("absent")
                self.absent = True
                self.version = ""
                yield Sleep(self.absent_retry)
            except Exception as exc:
                if isinstance(exc, ApiError) and exc.gone:
                    yield Noted("expired", exc)
                    self.version = ""  # list again, at once
                    continue
                failures += 1
                if not retryable(exc) or self.fatal(exc):
                    raise
                if self.attempts is not None and failures >= self.attempts:
                    raise
                delay = self.backoff[min(failures, len(self.backoff)) - 1]
                yield Noted("failed", exc, delay)
                yield Sleep(delay)

    def _list(self) -> Generator[Call | Output, bytes | _Marker | None, None]:
        yield Listing()
        token: str | None = None
        count = 0
        while True:
            params = {**self.selectors, "limit": self.page_size}
            if token:
                params["continue"] = token
            try:
                data = yield Get(params)
            except ApiError as exc:
                if exc.not_found and self.optional:
                    raise _Absent from None
                raise
            assert isinstance(data, bytes)  # noqa: S101 - the driver replies to a Get with bytes
            items, token, version = page(data)
            if "shardSelector" in self.selectors and not token:
                self.echo = shard_echo(data)
            for raw in items:
                yield Item(LISTED, raw, version_of(raw))
                count += 1
            if not token:
                self.version = version
                break
        self.listings += 1
        if self.absent:
            self.absent = False
            yield Noted("installed")
        yield Listed(self.version, count)

    def _watch(self) -> Generator[Call | Output, bytes | _Marker | None, None]:
        params: Params = {
            **self.selectors,
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": self.version,
            "timeoutSeconds": self.server_timeout,
        }
        line = yield Watch(params)
        while line is not END:
            assert isinstance(line, bytes)  # noqa: S101 - the driver sends lines, then END
            try:
                event = _event(line)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise NoAnswer(f"a watch line that is not an event: {exc}") from None
            if event.type == "BOOKMARK":
                self.version = version_of(event.object) or self.version
            elif event.type == "ERROR":
                status = _status(event.object)
                raise ApiError(status.code or 500, status.reason, bytes(event.object))
            else:
                version = version_of(event.object)
                self.version = version or self.version
                yield Item(event.type, event.object, version)
            line = yield NEXT


# --- the one driver ----------------------------------------------------------------------------


class Transport(Protocol):
    """How one side talks to the API about one collection. Failures raise errors.ApiError
    (a refusal) or errors.NoAnswer (no answer), nothing else but a bug."""

    async def get(self, params: Mapping[str, str | int]) -> bytes: ...

    def stream(
        self, params: Mapping[str, str | int]
    ) -> AbstractAsyncContextManager[AsyncIterator[bytes]]: ...

    async def sleep(self, seconds: float) -> None: ...


_DONE: Final = _Marker("DONE")  # the protocol returned (one listing, `follow=False`)
_Gen = Generator[Call | Output, bytes | _Marker | None, None]


def _send(gen: _Gen, reply: bytes | _Marker | None) -> Call | Output:
    try:
        return gen.send(reply)
    except StopIteration:
        return _DONE


def _throw(gen: _Gen, exc: Exception) -> Call | Output:
    try:
        return gen.throw(exc)
    except StopIteration:
        return _DONE


async def outputs(listwatch: ListWatch, transport: Transport) -> AsyncIterator[Output]:
    """Run the protocol over `transport`: its outputs, for ever (or, `follow=False`, until one
    listing is complete). The consumer's work between two outputs runs before the next I/O;
    what the protocol raises (a bug, a fatal error) ends the iteration with it."""
    gen = listwatch.run()
    call = _send(gen, None)
    while call is not _DONE:
        if isinstance(call, _OUTPUTS):
            yield call
            call = _send(gen, None)
        elif isinstance(call, Get):
            try:
                body = await transport.get(call.params)
            except Exception as exc:
                call = _throw(gen, exc)
            else:
                call = _send(gen, body)
        elif isinstance(call, Sleep):
            await transport.sleep(call.seconds)
            call = _send(gen, None)
        elif isinstance(call, Watch):
            failure: Exception | None = None
            outs: list[Output] = []
            async with _opened(transport, call.params) as lines:
                if isinstance(lines, Exception):
                    failure = lines
                else:
                    while True:
                        try:
                            line: bytes | _Marker = await anext(lines)
                        except StopAsyncIteration:
                            line = END
                        except Exception as exc:  # the stream broke off
                            failure = exc
                            break
                        call = _send(gen, line)
                        while isinstance(call, _OUTPUTS):
                            outs.append(call)
                            call = _send(gen, None)
                        if call is not NEXT or line is END:
                            break  # ended, or the protocol moved on (an ERROR event)
                        for out in outs:
                            yield out
                        outs.clear()
            for out in outs:
                yield out
            if failure is not None:
                call = _throw(gen, failure)
        else:  # pragma: no cover - the protocol yields nothing else
            raise TypeError(f"unknown call {call!r}")


@asynccontextmanager
async def _opened(
    transport: Transport, params: Params
) -> AsyncIterator[AsyncIterator[bytes] | Exception]:
    """The watch stream, or the error that kept it from opening. Only the opening is caught
    here: what the body raises (the protocol's own error) passes through, the stream closed."""
    stream = transport.stream(params)
    try:
        lines = await stream.__aenter__()
    except Exception as exc:
        yield exc
        return
    try:
        yield aiter(lines)
    except BaseException as exc:
        if not await stream.__aexit__(type(exc), exc, exc.__traceback__):
            raise
    else:
        await stream.__aexit__(None, None, None)
