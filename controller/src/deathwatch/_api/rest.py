"""The Kubernetes API over HTTPS, asynchronously, on aiohttp (already kopf's transport).

Every request runs on the event loop with a deadline: no thread pool, no thread hop between a
pod event and the write it causes (the `kubernetes` client is synchronous: each call took a
thread and a hop back, and built model objects we never read). One `Rest` per purpose
(writes, watches, the Lease, probes): each has its own connections, so a renewal of the
Lease never waits behind a burst of writes, and a watch never holds a writer's connection.

Requests share a bounded pool (`connections`); a watch never does: each opens a connection
of its own, outside the pool, and holds it for as long as it streams. A pool of long watches
is one that N watches fill and the N+1st, and every listing behind it, waits on for ever
(issue #40: three namespaces beside agent-sandbox's Sandboxes were three watches each on a
pool of eight). Waiting for a pooled connection counts against the request's own deadline,
never against the connect timeout, which is the TCP and TLS handshake's alone.

A pool's connections are kept between deaths (ADR 0034): aiohttp closes a connection idle
for 15 s by default, so in a quiet cluster every death's pod read, verdict write and Event
each paid a TCP and TLS handshake (measured: exit -> verdict p50 22 ms with deaths 0.25-1.25 s
apart, 37 ms 20 s apart). Idle connections are kept `keepalive.IDLE_KEPT` seconds, and every
WARM_EVERY seconds `warm` sends as many requests at once as a death needs connections at
once, as client-go's HTTP/2 pings keep its one connection: the next death finds them open (a
busy pool reuses its most recent connection only, and lets the others close).

Credentials come from the `kubernetes` client's configuration loader (kubeconfig or
in-cluster): the CA, a client certificate, or a bearer token read through the loader's own
refresh hook, so a projected ServiceAccount token that rotates is picked up.

A refusal raises `errors.ApiError` (its status, reason and body); no answer, whatever the
network did (refused, reset, timed out, TLS, a stream cut off), raises `errors.NoAnswer`;
nothing else comes out of here but a bug. `transport(path)` is one collection's side of the
list/watch protocol (deathwatch._kube.listwatch) over this client.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import aiohttp
import msgspec
from kubernetes import client

from deathwatch._kube.errors import ApiError, NoAnswer
from deathwatch._kube.keepalive import IDLE_KEPT, WARM_PATH

API_TIMEOUT = 30.0  # seconds: the cap of every call (field note: a hung call hides for ever)
CONNECT_TIMEOUT = 10.0
WARM_EVERY = 30.0  # seconds between a pool's warm-ups (`warm`)
TOKEN_TTL = 30.0  # seconds a bearer token is used before the loader is asked again
MAX_LINE = 64 * 1024 * 1024  # a watch event larger than this is a broken stream, not an object
_encode = msgspec.json.Encoder().encode


# what the network can do to a call: all of it is NoAnswer
_NO_ANSWER = (aiohttp.ClientError, TimeoutError, asyncio.TimeoutError, OSError)


def _unreachable(method: str, path: str, exc: BaseException) -> NoAnswer:
    timeout = isinstance(exc, TimeoutError | asyncio.TimeoutError | aiohttp.ServerTimeoutError)
    said = "no answer in time" if timeout and not str(exc) else str(exc) or type(exc).__name__
    return NoAnswer(f"{method} {path}: {said}", timeout=timeout, reason=said)


class Rest:
    def __init__(
        self,
        configuration: client.Configuration,
        *,
        identity: str,
        purpose: str,
        connections: int = 4,
    ) -> None:
        self.base = str(configuration.host).rstrip("/")
        self.configuration = configuration
        self.connections = connections
        # every request names the replica and its purpose (audit logs tell them apart)
        self.user_agent = f"deathwatch/{identity or 'controller'} ({purpose})"
        self._session: aiohttp.ClientSession | None = None  # requests: the bounded pool
        self._watching: aiohttp.ClientSession | None = None  # watches: a connection each
        self._bearer: str | None = None
        self._token_until = 0.0

    def _ssl(self) -> ssl.SSLContext | bool:
        c = self.configuration
        if not self.base.startswith("https"):
            return False
        context = ssl.create_default_context(cafile=c.ssl_ca_cert or None)
        if not c.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if c.cert_file:
            context.load_cert_chain(c.cert_file, c.key_file)
        return context

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = self._new_session(self.connections)
        return self._session

    def _open_watching(self) -> aiohttp.ClientSession:
        if self._watching is None or self._watching.closed:
            self._watching = self._new_session(0)  # aiohttp: 0 is no limit
        return self._watching

    def _new_session(self, limit: int) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=limit, ssl=self._ssl(), enable_cleanup_closed=True,
                                         keepalive_timeout=IDLE_KEPT)  # fmt: skip
        return aiohttp.ClientSession(connector=connector, headers={"User-Agent": self.user_agent})

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        token = self._token()
        if token:
            headers["Authorization"] = token
        return headers

    def _token(self) -> str | None:
        """The bearer token, through the loader's refresh hook (which re-reads a rotating
        ServiceAccount token when it is due), asked at most every TOKEN_TTL seconds."""
        now = time.monotonic()
        if now >= self._token_until:
            token = self.configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
            self._bearer = str(token) if token else None
            self._token_until = now + TOKEN_TTL
        return self._bearer

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        deadline: float = API_TIMEOUT,
    ) -> bytes:
        """One request; its body as bytes. Raises ApiError on a refusal, NoAnswer when no
        answer came in time (both may be retried; see errors.retryable)."""
        data = None if body is None else body if isinstance(body, bytes) else _encode(body)
        session = self._open()
        try:
            async with session.request(
                method,
                self.base + path,
                params=params,
                data=data,
                headers=self._headers(content_type if data is not None else None),
                timeout=aiohttp.ClientTimeout(total=deadline, sock_connect=CONNECT_TIMEOUT),
            ) as response:
                payload = await response.read()
        except _NO_ANSWER as exc:
            raise _unreachable(method, path, exc) from exc
        if response.status >= 400:
            raise ApiError(response.status, response.reason or "", payload)
        return payload

    async def warm(self, connections: int, deadline: float = 5.0) -> None:
        """`connections` requests at once, each on a connection of its own (kept ones
        reused, missing ones made), so the next burst of as many finds them open. Any answer
        will do, a refusal too (a cluster that withholds /version still answered on the
        connection); raises the first NoAnswer once all have ended."""
        results = await asyncio.gather(
            *(self.request("GET", WARM_PATH, deadline=deadline) for _ in range(connections)),
            return_exceptions=True,
        )  # fmt: skip
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, ApiError):
                raise result

    async def get(self, path: str, **params: str | int) -> Any:
        return msgspec.json.decode(await self.request("GET", path, params=params or None))

    async def find(self, path: str, deadline: float = API_TIMEOUT) -> dict[str, Any] | None:
        """One object, or None where the API says it does not exist (a 404)."""
        try:
            data = await self.request("GET", path, deadline=deadline)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise
        found: dict[str, Any] = msgspec.json.decode(data)
        return found

    @asynccontextmanager
    async def stream(
        self, path: str, params: Mapping[str, str | int], *, inactivity: float
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """A watch: its lines, as they come. `inactivity`: no byte for that long (not even
        a bookmark) ends it with NoAnswer (a connection dropped without a FIN)."""
        limits = aiohttp.ClientTimeout(
            total=None, connect=CONNECT_TIMEOUT, sock_connect=CONNECT_TIMEOUT,
            sock_read=inactivity,
        )  # fmt: skip
        session = self._open_watching()
        try:
            response = await session.get(
                self.base + path, params=params, headers=self._headers(None), timeout=limits
            )
        except _NO_ANSWER as exc:
            raise _unreachable("WATCH", path, exc) from exc
        try:
            if response.status >= 400:
                try:
                    payload = await response.read()
                except _NO_ANSWER as exc:
                    raise _unreachable("WATCH", path, exc) from exc
                raise ApiError(response.status, response.reason or "", payload)
            yield _lines(response.content, path)
        finally:
            response.release()

    def transport(self, path: str, inactivity: float) -> RestTransport:
        """One collection's side of the list/watch protocol, over this client."""
        return RestTransport(self, path, inactivity)

    async def close(self) -> None:
        for session in (self._session, self._watching):
            if session is not None:
                await session.close()
        await asyncio.sleep(0)  # let the connectors' transports close


class RestTransport:
    """A collection's GET, watch and backoff sleep: listwatch.Transport over a Rest."""

    def __init__(self, rest: Rest, path: str, inactivity: float) -> None:
        self.rest, self.path, self.inactivity = rest, path, inactivity

    async def get(self, params: Mapping[str, str | int]) -> bytes:
        return await self.rest.request("GET", self.path, params=params)

    def stream(
        self, params: Mapping[str, str | int]
    ) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        return self.rest.stream(self.path, params, inactivity=self.inactivity)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


async def _lines(
    content: aiohttp.StreamReader, path: str, chunk: int = 1024 * 1024
) -> AsyncIterator[bytes]:
    """Lines of any length (aiohttp's own line reader refuses lines over 128 KiB, and an
    object can be MBs), keeping at most the current chunk and one partial line. A stream
    cut off (or silent past its inactivity limit) ends with NoAnswer."""
    try:
        async for line in _split(content, chunk):
            yield line
    except _NO_ANSWER as exc:
        raise _unreachable("WATCH", path, exc) from exc


async def _split(content: aiohttp.StreamReader, chunk: int) -> AsyncIterator[bytes]:
    buffer = b""
    async for data in content.iter_chunked(chunk):
        buffer = buffer + data if buffer else data
        start = 0
        end = buffer.find(b"\n")
        while end >= 0:
            if end > start:
                yield buffer[start:end]
            start = end + 1
            end = buffer.find(b"\n", start)
        buffer = buffer[start:]
        if len(buffer) > MAX_LINE:
            raise NoAnswer(f"a watch event longer than {MAX_LINE} bytes: the stream is broken")
    if buffer.strip():
        yield buffer
