"""A small HTTP/1.1 server on asyncio whose clients cannot hold more than it allows: the
controller's and the firewall agent's ports, which every pod of the cluster can reach.

What a client may hold, and what happens beyond it (`Limits`):

- **connections from one address**: at most `per_peer` at once. A new one beyond that
  evicts that address's own longest waiter (if it has waited `evict_after`), else it is
  refused (as below): a neighbour pod holding connections competes with itself, never with the
  kubelet's probe or Prometheus, which come from addresses of their own (nginx's
  `limit_conn` per address). A neighbour must bring an address per `per_peer` connections
  to fill the port;
- **requests from one address**: `per_peer_rate` a second, in bursts of `per_peer_burst`
  (a token bucket per address, nginx's `limit_req`). Past it a request waits for its turn
  before it is answered: the client is slowed, not refused, so a flood costs no reconnects
  and their TLS handshakes, and takes from the event loop only what the rate allows. Each
  connection has one request in hand at a time, so the wait is at most `per_peer` turns;
- **connections**: at most `connections` open at once, counted from the moment one is
  accepted (before any TLS work). A new one beyond that evicts the longest waiter of the
  address holding the most, if that address holds at least two more than the newcomer's
  (addresses share a full port evenly: a probe gets in while anyone holds more). Otherwise
  it evicts the connection that has waited longest without being answered (in its TLS
  handshake, still sending its request head, idle between requests), if it has waited at
  least `evict_after` seconds: a request that arrives whole is answered, whoever else holds
  connections. Otherwise the newcomer is
  refused before any handshake: closed at once, or on a plain port, up to `held_still` of
  them, held still, unread, for `head_timeout`, then told 503, so a client that reconnects
  the moment it is refused waits instead of spinning (on a TLS port those held still would
  come back together, each a handshake: measured, p99 +79 ms, so it closes them). A refusal
  costs accept() and close(), never a TLS handshake;
- **time to send a request head**: `head_timeout` for the TLS handshake, then
  `head_timeout` from the connection's start or the previous answer; then it is closed;
- **idle keep-alive**: `idle_timeout`, then closed;
- **size**: a head over `head_bytes`: 431 and closed. A body: 413 and closed (GET and
  HEAD only are served: nothing here takes a body);
- **answering**: the handler has `answer_timeout`, else 503.

What a held connection costs, and that it is given back: about 30 KiB of resident memory
with TLS (a 4 KiB receive buffer, `_SmallTLS`, and OpenSSL's own), 7 KiB without; freed
when it ends, never left for the cycle collector (`_forget`); and once the connections a
port held have fallen to a quarter of their peak (of 64 or more), the C heap's free pages go
back to the system (`heap.give_back`, at most every `TRIM_EVERY` seconds).

Every refusal is counted by kind (`counts`, for the metrics of the process that runs it) and
nothing is logged per connection: a flood must not become a flood of log lines.

The open-files limit: `raise_open_files()` raises the soft limit to the hard one at start
(as Go's runtime does), so that the cap, well below it, leaves the API's connections room.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import ssl
import time
from asyncio import sslproto
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Final
from urllib.parse import unquote

from deathwatch._kube import heap

HEAD_END: Final = b"\r\n\r\n"
TRIM_EVERY: Final = 10.0  # seconds between two returns of the heap's free pages, at most
TRIM_FROM: Final = 64  # connections held at a peak worth returning memory after


@dataclass(frozen=True)
class Limits:
    connections: int = 128
    head_timeout: float = 5.0
    idle_timeout: float = 30.0
    head_bytes: int = 8192
    answer_timeout: float = 20.0
    evict_after: float = 1.0  # a waiter younger than this is not evicted for a newcomer
    # a client needs one or two (a probe, a scrape); a NAT or a host-network scraper shares
    # its address with others, so the default leaves room; a neighbour holding more than this
    # competes only with itself
    per_peer: int = 64
    # a scrape every 15 s, a probe a second: a flood from one address is served at this pace
    per_peer_rate: float = 20.0
    per_peer_burst: int = 40
    # refused connections held still (unread) before they are closed: a plain port's (a TLS
    # port's would be let go together, a burst of handshakes; it closes them at once)
    held_still: int = 0

    def __post_init__(self) -> None:
        if self.connections < 1:
            raise ValueError(f"connections: expected at least 1, got {self.connections}")
        if self.per_peer < 1:
            raise ValueError(f"per_peer: expected at least 1, got {self.per_peer}")
        if not self.per_peer_rate > 0 or self.per_peer_burst < 1:
            raise ValueError(f"per_peer_rate, per_peer_burst: expected a positive rate and a "
                             f"burst of at least 1, got {self.per_peer_rate}, "
                             f"{self.per_peer_burst}")  # fmt: skip
        for name in ("head_timeout", "idle_timeout", "answer_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: expected a positive number, got {getattr(self, name)}")
        if not self.evict_after >= 0:
            raise ValueError(f"evict_after: expected 0 or more seconds, got {self.evict_after}")


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    headers: Mapping[str, str]  # names lower-cased; a repeated header: its last value

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def text(status: int, text: str) -> Response:
        return Response(status, text.encode() + b"\n")


Handler = Callable[[Request], Awaitable[Response]]


class _Conn:
    """One connection: its transport (the TLS one once handshaken), its peer's address, when
    it began its current wait, and whether it is being answered."""

    __slots__ = ("answering", "peer", "since", "task", "transport")

    def __init__(self, transport: asyncio.Transport, peer: str, now: float) -> None:
        self.transport = transport
        self.peer = peer
        self.since = now
        self.answering = False
        self.task: asyncio.Task[None] | None = None


class _Arrival(asyncio.Protocol):
    """Holds a just-accepted connection still (no byte read) until the server admits it."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # noqa: S101 - a TCP server's
        transport.pause_reading()
        self.server._arrived(transport)

    def data_received(self, data: bytes) -> None:
        pass  # a refused client's request, read only so that its close is not a reset


class _SmallTLS(sslproto.SSLProtocol):
    """asyncio's TLS protocol, reading 4 KiB at a time instead of 256 KiB.

    asyncio allocates and zero-fills `max_size` bytes per TLS connection when it is accepted.
    A held connection cost 284 KiB of resident memory (measured, 500 held), so 1,024 held
    slots were 280 MiB: past the firewall agent's 128 MiB limit. A request head is at most
    8 KiB (`Limits.head_bytes`); a longer read is only more reads of the socket."""

    max_size = 4 * 1024


async def _start_tls(
    loop: asyncio.AbstractEventLoop,
    transport: asyncio.Transport,
    protocol: asyncio.BaseProtocol,
    context: ssl.SSLContext,
    handshake_timeout: float,
) -> asyncio.Transport:
    """`loop.start_tls(server_side=True)`, with `_SmallTLS` as the TLS protocol (asyncio has
    no parameter for the buffer). The same steps as BaseEventLoop.start_tls."""
    waiter = loop.create_future()
    # typeshed says int; asyncio takes any positive number of seconds (start_tls does)
    tls = _SmallTLS(
        loop, protocol, context, waiter, server_side=True, call_connection_made=False,
        ssl_handshake_timeout=handshake_timeout,  # type: ignore[arg-type]
    )  # fmt: skip
    transport.pause_reading()  # no data_received() before connection_made()
    transport.set_protocol(tls)
    made = loop.call_soon(tls.connection_made, transport)
    resumed = loop.call_soon(transport.resume_reading)
    try:
        await waiter
    except BaseException:
        transport.close()
        made.cancel()
        resumed.cancel()
        raise
    finally:
        # the waiter holds a failed handshake's exception, whose traceback holds this frame
        del waiter
    return tls._app_transport  # what start_tls returns


def _forget(exc: BaseException | None) -> None:
    """Drop the tracebacks of a swallowed exception and of those it chains.

    An exception raised out of a future or a stream holds, through its traceback, the frames
    that hold the future, the stream or the exception itself: a reference cycle. Each
    connection it ended then stayed in memory (its TLS objects, its stream, ~50 objects) until
    a full collection, which a process of many long-lived objects seldom runs: a slowloris
    grew the process by what every connection it ever made held. Measured: 500 held TLS
    connections cut, four times over, +16 MiB each time without this."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        exc = exc.__context__


class _Refused(Exception):
    def __init__(self, status: int, kind: str) -> None:
        self.status, self.kind = status, kind


@dataclass
class Server:
    """Serve `handler` on one listener within `limits`; `tls`: a context for HTTPS."""

    handler: Handler
    limits: Limits = field(default_factory=Limits)
    tls: ssl.SSLContext | None = None
    counts: Counter[str] = field(default_factory=Counter)  # refusals and evictions, by kind
    _conns: dict[int, _Conn] = field(default_factory=dict)  # in order of their last wait
    _peers: dict[str, dict[int, _Conn]] = field(default_factory=dict)  # the same, by address
    # each address's bucket: (tokens, when counted); kept after its connections end (a client
    # reconnecting gets no fresh burst), dropped once full again
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)
    heap_returns: int = 0  # times the heap's free pages went back after a peak
    _still: dict[int, asyncio.Transport] = field(default_factory=dict)  # refused, not yet closed
    _high: int = 0  # connections held at the peak since the heap was last trimmed
    _trimmed: float = float("-inf")
    _trimming: asyncio.Task[bool] | None = None
    _server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the port (0 given: the one the kernel chose)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Arrival(self), host, port, backlog=512)
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    @property
    def held_still_now(self) -> int:
        """Refused connections held still, not yet closed."""
        return len(self._still)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns.values()):
            conn.transport.abort()
            if conn.task is not None:
                conn.task.cancel()
        for transport in list(self._still.values()):
            transport.abort()
        self._still.clear()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    # --- admission ---------------------------------------------------------------------------

    def _admit(self, transport: asyncio.Transport) -> _Conn | None:
        now = time.monotonic()
        peername = transport.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) and peername else "?"
        mine = self._peers.get(peer, {})
        # first its own address's share, then the port's: the longest waiter not being
        # answered makes room; dict order is the order each began its current wait (a
        # connection moves to the end when it waits again)
        for held, cap in ((mine, self.limits.per_peer), (self._conns, self.limits.connections)):
            if len(held) < cap:
                continue
            victim = self._fattest_waiter(len(mine)) if held is self._conns else None
            if victim is None:
                victim = next((c for c in held.values() if not c.answering), None)
                if victim is None or now - victim.since < self.limits.evict_after:
                    return None
            self._drop(victim, "evicted")
        conn = _Conn(transport, peer, now)
        self._conns[id(conn)] = conn
        self._peers.setdefault(peer, {})[id(conn)] = conn
        self._high = max(self._high, len(self._conns))
        return conn

    def _fattest_waiter(self, holding: int) -> _Conn | None:
        """The port full, for a newcomer whose address holds `holding`: the longest waiter
        of the address holding the most, if that is at least two more, whatever its age.
        Addresses share a full port evenly: a probe or a scrape (one connection) always gets
        in while any address holds more, however young its connections (a scan of the
        addresses, only when the port is full)."""
        fattest = max(self._peers.values(), key=len, default={})
        if len(fattest) < holding + 2:
            return None
        return next((c for c in fattest.values() if not c.answering), None)

    def _turn(self, peer: str) -> float:
        """Take this address's next turn: seconds until it comes (0: now)."""
        limits, now = self.limits, time.monotonic()
        tokens, then = self._buckets.get(peer, (float(limits.per_peer_burst), now))
        tokens = min(float(limits.per_peer_burst), tokens + (now - then) * limits.per_peer_rate)
        self._buckets[peer] = (tokens - 1, now)
        if len(self._buckets) > 4 * limits.connections:  # amortised: once per that many peers
            self._refilled(now)
        return max(0.0, (1 - tokens) / limits.per_peer_rate)

    def _refilled(self, now: float) -> None:
        """Drop the buckets that are full again; past twice the cap still, the oldest (an
        address forgotten starts with a full burst: thousands of addresses are needed)."""
        limits = self.limits
        for peer, (tokens, then) in list(self._buckets.items()):
            if tokens + (now - then) * limits.per_peer_rate >= limits.per_peer_burst:
                del self._buckets[peer]
        for peer in list(self._buckets)[: max(0, len(self._buckets) - 2 * limits.connections)]:
            del self._buckets[peer]

    def _forget_conn(self, conn: _Conn) -> bool:
        """No longer held; False if it was not."""
        mine = self._peers.get(conn.peer)
        if mine is not None:
            mine.pop(id(conn), None)
            if not mine:
                del self._peers[conn.peer]
        held = self._conns.pop(id(conn), None) is not None
        self._after_a_peak()
        return held

    def _after_a_peak(self) -> None:
        """The connections of a peak gone (to a quarter of it): their memory given back."""
        now = time.monotonic()
        if (self._high < TRIM_FROM or len(self._conns) > self._high // 4
                or now - self._trimmed < TRIM_EVERY or self._trimming is not None):  # fmt: skip
            return
        self._trimmed, self._high = now, len(self._conns)
        self._trimming = asyncio.ensure_future(asyncio.to_thread(heap.give_back))
        self._trimming.add_done_callback(self._trimmed_heap)

    def _trimmed_heap(self, task: asyncio.Task[bool]) -> None:
        self._trimming = None
        if not task.cancelled() and task.exception() is None and task.result():
            self.heap_returns += 1

    def _drop(self, conn: _Conn, kind: str) -> None:
        self.counts[kind] += 1
        self._forget_conn(conn)
        conn.transport.abort()
        if conn.task is not None and conn.task is not asyncio.current_task():
            conn.task.cancel()

    def _arrived(self, transport: asyncio.Transport) -> None:
        conn = self._admit(transport)
        if conn is None:
            self.counts["busy"] += 1
            limits = self.limits
            if len(self._still) < limits.held_still:
                # held still, unread, then closed: a client that reconnects the moment it is
                # refused (a flood, a slowloris past its share) waits instead of spinning.
                # Closed at once, one address's 275 connections cost the health port's
                # thread 43 % of a core in accepts and closes
                self._still[id(transport)] = transport
                asyncio.get_running_loop().call_later(limits.head_timeout, self._refuse, transport)
            else:
                self._refuse(transport)
            return
        conn.task = asyncio.ensure_future(self._run(conn, transport))

    def _refuse(self, transport: asyncio.Transport) -> None:
        self._still.pop(id(transport), None)
        if self.tls is not None or transport.is_closing():
            transport.abort()
            return
        # a plain client is told why, for the price of a write: what it sent is read (and
        # dropped) first, as a close with unread data is a reset that loses the answer; the
        # client closes on our end of file, or is cut at the head deadline
        with contextlib.suppress(Exception):
            transport.resume_reading()
            transport.write(_render(Response.text(503, "busy"), close=True))
            transport.write_eof()
        asyncio.get_running_loop().call_later(self.limits.head_timeout, transport.abort)

    def _waiting(self, conn: _Conn) -> None:
        """The connection waits for a request again: it is the newest waiter now."""
        conn.answering = False
        conn.since = time.monotonic()
        self._conns.pop(id(conn), None)
        self._conns[id(conn)] = conn
        mine = self._peers[conn.peer]
        mine.pop(id(conn), None)
        mine[id(conn)] = conn

    # --- one connection --------------------------------------------------------------------------

    async def _run(self, conn: _Conn, raw: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=self.limits.head_bytes + len(HEAD_END), loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        try:
            transport: asyncio.Transport = raw
            if self.tls is not None:
                try:
                    tls = await _start_tls(loop, raw, protocol, self.tls, self.limits.head_timeout)
                except (ConnectionError, OSError, ssl.SSLError, TimeoutError) as exc:
                    _forget(exc)
                    self.counts["handshake"] += 1
                    return
                transport = conn.transport = tls
            else:
                raw.set_protocol(protocol)
            protocol.connection_made(transport)
            if self.tls is None:
                raw.resume_reading()
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            await self._converse(conn, reader, writer)
        except (asyncio.CancelledError, ConnectionError, ssl.SSLError, OSError) as exc:
            _forget(exc)  # evicted, or the client went away
        finally:
            if self._forget_conn(conn):
                conn.transport.abort()

    async def _converse(
        self, conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        limits = self.limits
        first = True
        while True:
            try:
                head = await self._head(reader, writer, first)
            except _Refused as refused:
                _forget(refused)
                self.counts[refused.kind] += 1
                if refused.status:
                    conn.answering = True
                    writer.write(_render(Response.text(refused.status, refused.kind), close=True))
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(limits.head_timeout):
                            await writer.drain()
                return
            if head is None:
                return  # the client closed between requests
            first = False
            conn.answering = True
            wait = self._turn(conn.peer)
            if wait > 0:
                self.counts["paced"] += 1
                await asyncio.sleep(wait)
            request, close = head
            try:
                async with asyncio.timeout(limits.answer_timeout):
                    response = await self.handler(request)
            except TimeoutError as exc:
                _forget(exc)
                self.counts["answer_timeout"] += 1
                response = Response.text(503, "no answer in time")
            length = len(response.body)
            if request.method == "HEAD":
                response = Response(response.status, b"", response.content_type, response.headers)
            writer.write(_render(response, close, length))
            try:
                async with asyncio.timeout(limits.head_timeout):
                    await writer.drain()
            except TimeoutError as exc:
                _forget(exc)
                self.counts["slow_reader"] += 1
                return
            if close:
                return
            self._waiting(conn)

    async def _head(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, first: bool
    ) -> tuple[Request, bool] | None:
        """The next request's head: the first within head_timeout of the connection's start
        (its TLS handshake had one of its own); a later one may idle first, up to
        idle_timeout, then has head_timeout from its first byte."""
        limits = self.limits
        start = b""
        if not first:
            try:
                async with asyncio.timeout(limits.idle_timeout):
                    start = await reader.read(1)
            except TimeoutError:
                raise _Refused(0, "idle") from None
            if not start:
                return None
        try:
            async with asyncio.timeout(limits.head_timeout):
                raw = start + await reader.readuntil(HEAD_END)
        except TimeoutError:
            raise _Refused(408, "head_timeout") from None
        except asyncio.LimitOverrunError:
            raise _Refused(431, "head_too_large") from None
        except asyncio.IncompleteReadError as exc:
            if not exc.partial and not start:
                return None
            raise _Refused(0, "incomplete") from None
        if len(raw) > limits.head_bytes + len(HEAD_END):
            raise _Refused(431, "head_too_large")
        return _parse(raw)


def _parse(raw: bytes) -> tuple[Request, bool]:
    try:
        text = raw.decode("latin-1")
        line, *rest = text[: -len(HEAD_END)].split("\r\n")
        method, target, version = line.split(" ")
    except ValueError:
        raise _Refused(400, "bad_request") from None
    if version not in ("HTTP/1.1", "HTTP/1.0") or not target.startswith("/"):
        raise _Refused(400, "bad_request")
    headers: dict[str, str] = {}
    for item in rest:
        name, sep, value = item.partition(":")
        if not sep or not name or name != name.strip():
            raise _Refused(400, "bad_request")
        headers[name.lower()] = value.strip()
    if method not in ("GET", "HEAD"):
        raise _Refused(405, "method")
    if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
        raise _Refused(413, "body")
    path, _, query = target.partition("?")
    connection = headers.get("connection", "").lower()
    close = connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive")
    return Request(method, unquote(path), query, headers), close


def _render(response: Response, close: bool, length: int | None = None) -> bytes:
    try:
        phrase = HTTPStatus(response.status).phrase
    except ValueError:
        phrase = ""
    lines = [
        f"HTTP/1.1 {response.status} {phrase}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body) if length is None else length}",
        *(f"{k}: {v}" for k, v in response.headers),
        "Connection: close" if close else "Connection: keep-alive",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + response.body


def connection_cap(wanted: int, open_files: int, reserve: int = 512) -> int:
    """At most `wanted` connections, and at most half of the descriptors `reserve` leaves
    (the other half: as many refused connections held still): the API's connections, the
    watches, the process's files and the health port (64, and 256 held still) always have
    room."""
    return max(16, min(wanted, (open_files - reserve) // 2))


def raise_open_files() -> tuple[int, int]:
    """The soft open-files limit raised to the hard one (Go's runtime does the same at start;
    containerd 2.x leaves a Python process 1,024). Returns (soft, hard) as they are now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)
