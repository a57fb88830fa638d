"""The chaos lane's proxy does what its faults claim, on real sockets: partitions hold bytes
without losing or refusing them, one way or both, heal lets them through, reset is a RST."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from hack.localcluster.chaosproxy import ChaosProxy


@pytest.fixture
def echo() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=lambda c=conn: _echo(c), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    server.close()


def _echo(conn: socket.socket) -> None:
    with conn, contextlib.suppress(OSError):  # the proxy aborting us is part of the tests
        while data := conn.recv(65536):
            conn.sendall(data)


@pytest.fixture
def proxy(echo: int) -> Iterator[ChaosProxy]:
    p = ChaosProxy(echo).start()
    yield p
    p.stop()


def client(proxy: ChaosProxy) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    s.settimeout(0.5)
    return s


def test_bytes_pass_both_ways(proxy: ChaosProxy) -> None:
    with client(proxy) as s:
        s.sendall(b"hello")
        assert s.recv(100) == b"hello"


@pytest.mark.parametrize("direction", ["both", "up", "down"])
def test_a_partition_holds_bytes_and_heal_delivers_them(proxy: ChaosProxy, direction: str) -> None:
    with client(proxy) as s:
        s.sendall(b"before")
        assert s.recv(100) == b"before"
        proxy.partition(direction)  # type: ignore[arg-type]
        s.sendall(b"during")
        with pytest.raises(TimeoutError):
            s.recv(100)  # nothing comes back: no error, no FIN, nothing
        proxy.heal()
        s.settimeout(5)
        assert s.recv(100) == b"during"


def test_a_new_connection_goes_nowhere_during_a_partition(proxy: ChaosProxy) -> None:
    proxy.partition()
    with client(proxy) as s:
        s.sendall(b"x")
        with pytest.raises(TimeoutError):
            s.recv(100)
        proxy.heal()
        s.settimeout(5)
        assert s.recv(100) == b"x"


def test_reset_aborts_every_open_connection(proxy: ChaosProxy) -> None:
    with client(proxy) as a, client(proxy) as b:
        for s in (a, b):
            s.sendall(b"ping")
            assert s.recv(100) == b"ping"
        assert proxy.reset() == 2
        for s in (a, b):
            s.settimeout(5)
            with pytest.raises(ConnectionResetError):
                s.recv(100)
    with client(proxy) as s:  # and the proxy still serves new ones
        s.sendall(b"new")
        assert s.recv(100) == b"new"
