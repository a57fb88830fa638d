"""The Kubernetes API over HTTPS, asynchronously, on aiohttp (already kopf's transport).

Every request runs on the event loop with a deadline: no thread pool, no thread hop between a
pod event and the write it causes (the `kubernetes` client is synchronous: each call took a
thread and a hop back, and built model objects we never read). One `Rest` per purpose
(writes, watches, the Lease, probes): each has its own connections, so a renewal of the
Lease never waits behind a burst of writes, and a watch never holds a writer's connection.

Credentials come from the `kubernetes` client's configuration loader (kubeconfig or
in-cluster): the CA, a client certificate, or a bearer token read through the loader's own
refresh hook, so a projected ServiceAccount token that rotates is picked up.

A refusal raises `ApiError`, a `kubernetes.client.ApiException` (status, reason, body), so
`kube.status_code`, `retryable` and `api_message` read it like any API failure.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import msgspec
from kubernetes import client

API_TIMEOUT = 30.0  # seconds: the cap of every call (field note: a hung call hides for ever)
CONNECT_TIMEOUT = 10.0
TOKEN_TTL = 30.0  # seconds a bearer token is used before the loader is asked again
MAX_LINE = 64 * 1024 * 1024  # a watch event larger than this is a broken stream, not an object
_encode = msgspec.json.Encoder().encode


class ApiError(client.ApiException):  # type: ignore[misc]
    """The API server refused a request (4xx/5xx): its status, reason and body."""

    def __init__(self, status: int, reason: str, body: bytes) -> None:
        super().__init__(status=status, reason=reason)
        self.body = body.decode(errors="replace")


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
        self._session: aiohttp.ClientSession | None = None
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
            connector = aiohttp.TCPConnector(
                limit=self.connections, ssl=self._ssl(), enable_cleanup_closed=True
            )
            self._session = aiohttp.ClientSession(
                connector=connector, headers={"User-Agent": self.user_agent}
            )
        return self._session

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
        """One request; its body as bytes. Raises ApiError on a refusal, and aiohttp's or
        asyncio's errors when there is no answer (both are the caller's to retry)."""
        data = None if body is None else body if isinstance(body, bytes) else _encode(body)
        session = self._open()
        async with session.request(
            method,
            self.base + path,
            params=params,
            data=data,
            headers=self._headers(content_type if data is not None else None),
            timeout=aiohttp.ClientTimeout(total=deadline, connect=CONNECT_TIMEOUT),
        ) as response:
            payload = await response.read()
            if response.status >= 400:
                raise ApiError(response.status, response.reason or "", payload)
            return payload

    async def get(self, path: str, **params: str | int) -> Any:
        return msgspec.json.decode(await self.request("GET", path, params=params or None))

    @asynccontextmanager
    async def stream(
        self, path: str, params: Mapping[str, str | int], *, inactivity: float
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """A watch: its lines, as they come. `inactivity`: no byte for that long (not even
        a bookmark) ends it with TimeoutError (a connection dropped without a FIN)."""
        limits = aiohttp.ClientTimeout(
            total=None, connect=CONNECT_TIMEOUT, sock_connect=CONNECT_TIMEOUT,
            sock_read=inactivity,
        )  # fmt: skip
        session = self._open()
        async with session.get(
            self.base + path, params=params, headers=self._headers(None), timeout=limits
        ) as response:
            if response.status >= 400:
                raise ApiError(response.status, response.reason or "", await response.read())
            yield _lines(response.content)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            await asyncio.sleep(0)  # let the connector's transports close


async def _lines(content: aiohttp.StreamReader, chunk: int = 1024 * 1024) -> AsyncIterator[bytes]:
    """Lines of any length (aiohttp's own line reader refuses lines over 128 KiB, and an
    object can be MBs), keeping at most the current chunk and one partial line."""
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
            raise ValueError(f"a watch event longer than {MAX_LINE} bytes: the stream is broken")
    if buffer.strip():
        yield buffer
