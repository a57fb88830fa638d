"""The few Kubernetes API calls the agent makes, over the standard library.

The agent lists and watches the sandbox pods of its own node and the Node objects, and keeps
one Lease saying that the node is shielded. A handful of verbs on three resources do not
justify the kubernetes client (and its dependencies) in a privileged hostNetwork image
(docs/adr/0012). Every call has a deadline (`TIMEOUT`, the field notes' 30 s cap); the token
is read again for each call, because projected ServiceAccount tokens rotate. A call keeps its
thread's connection open for the next (an exits write is then one round trip, not a TCP and
TLS handshake and a CA load first: ADR 0028); a watch has a connection of its own. Failures raise
the errors every part of deathwatch shares (deathwatch._kube.errors): `ApiError` for the
API's refusal, `NoAnswer` when no answer came; `collection(path)` is one collection's side
of the list/watch protocol (deathwatch._kube.listwatch), run in the agent's own thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from deathwatch._kube.errors import ApiError, NoAnswer
from deathwatch._kube.listwatch import ListWatch, Output, outputs

TIMEOUT = 30.0
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

__all__ = ["ApiError", "NoAnswer", "NotInCluster"]


class NotInCluster(Exception):
    """The agent was not told where the API is, nor runs where it could find out."""


class Api(Protocol):
    """What the agent needs of the API (KubeApi here; a fake in unit tests)."""

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any: ...

    def get(self, path: str, params: Mapping[str, str | int]) -> bytes: ...

    def lines(
        self, path: str, params: Mapping[str, str | int], seconds: float
    ) -> contextlib.AbstractContextManager[Iterator[bytes]]: ...


@dataclass(frozen=True)
class KubeApi:
    server: str  # https://host:port
    token_file: Path
    ca_file: Path | None
    timeout: float = TIMEOUT
    # each thread's kept connection (http.client's are not to be shared between threads)
    _kept: threading.local = field(default_factory=threading.local, repr=False, compare=False)

    @staticmethod
    def in_cluster() -> KubeApi:
        host, port = (
            os.environ.get("KUBERNETES_SERVICE_HOST"),
            os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
        )
        if not host:
            raise NotInCluster("not in a cluster: KUBERNETES_SERVICE_HOST is not set")
        if ":" in host:
            host = f"[{host}]"
        return KubeApi(
            f"https://{host}:{port}", SERVICE_ACCOUNT / "token", SERVICE_ACCOUNT / "ca.crt"
        )

    def _context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)

    def _headers(self) -> dict[str, str]:
        try:
            token = self.token_file.read_text().strip()
        except OSError as exc:
            raise NoAnswer(f"cannot read the token {self.token_file}: {exc.strerror}") from None
        if not self.server.startswith("https://"):
            raise NotInCluster(f"{self.server}: only https is spoken to the API")
        return {
            "Authorization": f"Bearer {token}",
            "Accept": "application/json",
            "Content-Type": "application/json",
            "User-Agent": "deathwatch-firewall",
        }

    def _connection(self, timeout: float) -> tuple[http.client.HTTPSConnection, bool]:
        """This thread's kept connection (made if there is none), and whether it is new."""
        kept: http.client.HTTPSConnection | None = getattr(self._kept, "connection", None)
        if kept is not None:
            kept.timeout = timeout
            if kept.sock is not None:
                kept.sock.settimeout(timeout)
            return kept, False
        url = urllib.parse.urlsplit(self.server)
        made = http.client.HTTPSConnection(url.hostname or "", url.port or 443, timeout=timeout,
                                           context=self._context())  # fmt: skip
        self._kept.connection = made
        return made, True

    def _drop(self, connection: http.client.HTTPSConnection) -> None:
        connection.close()
        self._kept.connection = None

    def _exchange(
        self, method: str, path: str, body: Mapping[str, Any] | None, timeout: float
    ) -> bytes:
        """One call on this thread's kept connection: the answer's body, or ApiError for a
        refusal. A kept connection the server closed while idle is made again once (the
        request never reached it; a write that did and is sent again meets a 409, which
        every writer here reads as another writer's)."""
        headers = self._headers()
        data = json.dumps(body).encode() if body is not None else None
        while True:
            connection, new = self._connection(timeout)
            try:
                connection.request(method, path, body=data, headers=headers)
                response = connection.getresponse()
                answer = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self._drop(connection)
                if new:
                    raise NoAnswer(f"{method} {path}: {exc}") from None
                continue
            except (OSError, http.client.HTTPException) as exc:  # ssl.SSLError is an OSError
                self._drop(connection)
                raise NoAnswer(f"{method} {path}: {exc}",
                                  timeout=isinstance(exc, TimeoutError)) from None  # fmt: skip
            if response.will_close:
                self._drop(connection)
            if response.status >= 300:
                raise ApiError(response.status, response.reason or "", answer[:4096])
            return answer

    def _request(
        self, method: str, path: str, body: Mapping[str, Any] | None, timeout: float
    ) -> Any:
        request = urllib.request.Request(  # noqa: S310 - https only (_headers checks)
            self.server + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers=self._headers(),
        )
        try:
            return urllib.request.urlopen(request, timeout=timeout, context=self._context())  # noqa: S310
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, str(exc.reason or ""), exc.read()[:4096]) from None
        except (urllib.error.URLError, OSError, ssl.SSLError) as exc:
            reason = getattr(exc, "reason", exc)
            raise NoAnswer(f"{method} {path}: {reason}", timeout=isinstance(
                reason, TimeoutError)) from None  # fmt: skip

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        answer = self._exchange(method, path, body, self.timeout)
        try:
            return json.loads(answer)
        except ValueError as exc:
            raise NoAnswer(f"{method} {path}: unreadable answer: {exc}") from None

    def get(self, path: str, params: Mapping[str, str | int]) -> bytes:
        return self._exchange("GET", path + query(**params), None, self.timeout)

    @contextlib.contextmanager
    def lines(
        self, path: str, params: Mapping[str, str | int], seconds: float
    ) -> Iterator[Iterator[bytes]]:
        """A watch's lines; a silent connection is cut after `seconds` (the socket timeout),
        so nothing waits for ever."""
        with self._request("GET", path + query(**params), None, seconds) as response:
            yield _read_lines(response, path)


def _read_lines(response: Any, path: str) -> Iterator[bytes]:
    try:
        yield from response
    except (OSError, ValueError) as exc:  # a cut chunked read, a timeout
        raise NoAnswer(f"watch {path}: {exc}") from None


def query(**params: str | int) -> str:
    kept = {k: v for k, v in params.items() if v}
    return "?" + urllib.parse.urlencode(kept) if kept else ""


class ThreadTransport:
    """One collection's side of the list/watch protocol for an agent thread. That thread
    runs an event loop of its own for the protocol's driver, and nothing else: so the
    blocking calls are made right in it (no executor, whose threads the interpreter would
    wait for at exit, a watch read holding the agent's SIGTERM up for minutes). A backoff
    wakes at once when the agent stops."""

    def __init__(self, api: Api, path: str, stop: threading.Event, inactivity: float) -> None:
        self.api, self.path, self.stop, self.inactivity = api, path, stop, inactivity

    async def get(self, params: Mapping[str, str | int]) -> bytes:
        return self.api.get(self.path, params)

    @contextlib.asynccontextmanager
    async def stream(self, params: Mapping[str, str | int]) -> AsyncIterator[AsyncIterator[bytes]]:
        with self.api.lines(self.path, params, self.inactivity) as lines:
            yield _each(lines)

    async def sleep(self, seconds: float) -> None:
        self.stop.wait(seconds)


async def _each(lines: Iterator[bytes]) -> AsyncIterator[bytes]:
    for line in lines:
        yield line


def follow(
    protocol: ListWatch,
    transport: ThreadTransport,
    handle: Callable[[Output], bool],
) -> None:
    """Run the protocol in this thread until `handle` says stop (returns False) or the
    transport's stop event is set. What the protocol raises (a bug: the API's and the
    network's failures are its own to retry) is the caller's."""

    async def run() -> None:
        async for out in outputs(protocol, transport):
            if not handle(out) or transport.stop.is_set():
                return

    asyncio.run(run())
