"""A TCP proxy between a client (the controller) and kube-apiserver that fails on command, for
the chaos lane. TLS passes through untouched (the apiserver's certificate names 127.0.0.1).

    proxy = ChaosProxy(apiserver_port).start()     # then point a kubeconfig at proxy.port
    proxy.partition()          # both ways: bytes wait, nothing is lost or refused (a network
                               #   partition as TCP sees it: the kernel buffers fill, senders
                               #   block, no FIN, no RST); new connections hang the same way
    proxy.partition("up")      # client -> server only: requests vanish, the watch keeps coming
    proxy.partition("down")    # server -> client only
    proxy.heal()               # everything waiting flows again
    proxy.reset()              # every open connection is aborted with a TCP RST
    proxy.stop()

It runs its own event loop in a thread, so synchronous tests drive it directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

Direction = Literal["up", "down"]


@dataclass(eq=False)  # identity: links live in a set
class _Link:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class ChaosProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.connections = 0  # accepted so far
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._open: dict[Direction, asyncio.Event] = {}
        self._links: set[_Link] = set()

    # --- control, from any thread --------------------------------------------------------

    def start(self) -> ChaosProxy:
        self._thread.start()
        self._call(self._start())
        return self

    def partition(self, direction: Literal["both", "up", "down"] = "both") -> None:
        self._call(self._set(direction, closed=True))

    def heal(self) -> None:
        self._call(self._set("both", closed=False))

    def reset(self) -> int:
        """Abort every open connection with a RST; returns how many there were."""
        aborted: int = self._call(self._reset())
        return aborted

    def stop(self) -> None:
        if self._thread.is_alive():
            self._call(self._stop())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    # --- the proxy itself, on its loop -------------------------------------------------------

    async def _start(self) -> None:
        self._open = {"up": asyncio.Event(), "down": asyncio.Event()}
        for gate in self._open.values():
            gate.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _set(self, direction: Literal["both", "up", "down"], closed: bool) -> None:
        for name, gate in self._open.items():
            if direction in ("both", name):
                if closed:
                    gate.clear()
                else:
                    gate.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        # like a partitioned network, a new connection goes nowhere while the way is shut
        await self._open["up"].wait()
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _abort(writer)
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        link.tasks = [
            asyncio.create_task(self._pump(reader, up_writer, "up", link)),
            asyncio.create_task(self._pump(up_reader, writer, "down", link)),
        ]

    async def _pump(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        direction: Direction,
        link: _Link,
    ) -> None:
        gate = self._open[direction]
        try:
            while True:
                await gate.wait()  # closed: stop reading, so the sender's buffers fill
                data = await source.read(65536)
                if not data:
                    break
                await gate.wait()
                sink.write(data)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                sink.close()
            self._links.discard(link)

    async def _reset(self) -> int:
        links = list(self._links)
        for link in links:
            for task in link.tasks:
                task.cancel()
            _abort(link.client)
            _abort(link.server)
        self._links.clear()
        return len(links)

    async def _stop(self) -> None:
        await self._reset()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with a RST rather than a FIN: what a crashed middlebox or peer sends."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(Exception):
        writer.transport.abort()
