"""The bounded HTTP server (deathwatch._kube.serving) on real sockets: what a client may hold
and what happens beyond it. Each limit is made small so the test takes fractions of a second;
every wait has a deadline."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from deathwatch._kube.ports import PortsCollector
from deathwatch._kube.serving import (
    Handler,
    Limits,
    Request,
    Response,
    Server,
    raise_open_files,
)
from deathwatch._kube.tls import CertificateError, Serving

FAST = Limits(connections=4, head_timeout=0.3, idle_timeout=0.3, head_bytes=512,
              answer_timeout=1.0)  # fmt: skip


async def hello(request: Request) -> Response:
    return Response.text(200, f"hello {request.path}")


@asynccontextmanager
async def serving(
    handler: Handler = hello, limits: Limits = FAST, tls: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[Server, int]]:
    server = Server(handler, limits, tls)
    port = await server.start("127.0.0.1", 0)
    try:
        yield server, port
    finally:
        await server.close()


async def connect(
    port: int, tls: bool = False
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    context = None
    if tls:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, ssl=context), 5)


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One response: its status and body (by Content-Length)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    length = next(
        int(v) for k, _, v in (h.partition(": ") for h in lines[1:]) if k == "Content-Length"
    )
    return status, await asyncio.wait_for(reader.readexactly(length), 5)


async def get(port: int, path: str = "/x", tls: bool = False) -> tuple[int, bytes]:
    reader, writer = await connect(port, tls)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        return await answer(reader)
    finally:
        writer.close()


async def closed(reader: asyncio.StreamReader) -> bytes:
    """Everything until the server closes the connection (within 5 s)."""
    return await asyncio.wait_for(reader.read(), 5)


async def test_requests_on_one_kept_alive_connection_and_head() -> None:
    async with serving() as (_, port):
        reader, writer = await connect(port)
        writer.write(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await answer(reader) == (200, b"hello /a\n")
        writer.write(b"HEAD /b HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 OK") and b"Content-Length: 9" in head
        writer.close()


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"POST /a HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        (b"GET /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", 413),
        (b"GET /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 413),
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET a HTTP/1.1\r\n\r\n", 400),
        (b"GET /a HTTP/2.0\r\n\r\n", 400),
        (b"GET /a HTTP/1.1\r\nno-colon\r\n\r\n", 400),
        (b"GET /a HTTP/1.1\r\nX: " + b"y" * 600 + b"\r\n\r\n", 431),
    ],
)
async def test_what_is_not_served_is_refused_and_closed(raw: bytes, status: int) -> None:
    async with serving() as (server, port):
        reader, writer = await connect(port)
        writer.write(raw)
        got = await closed(reader)
        assert got.startswith(f"HTTP/1.1 {status} ".encode()), got[:60]
        writer.close()
        assert server.open_connections == 0


async def test_a_slow_head_is_cut_at_its_deadline_and_an_idle_connection_at_its_own() -> None:
    async with serving() as (server, port):
        reader, writer = await connect(port)
        writer.write(b"GET /a HTTP/1.1\r\nHo")  # and nothing more (slowloris)
        assert (await closed(reader)).startswith(b"HTTP/1.1 408 ")
        reader, writer = await connect(port)
        writer.write(b"GET /a HTTP/1.1\r\n\r\n")
        assert await answer(reader) == (200, b"hello /a\n")
        assert await closed(reader) == b""  # idle after its answer: closed, nothing said
        assert server.counts["head_timeout"] == 1 and server.counts["idle"] == 1


async def test_past_the_cap_the_oldest_waiting_connection_makes_room_for_a_whole_request() -> None:
    slow = Limits(connections=4, head_timeout=30, idle_timeout=30, evict_after=0)
    async with serving(limits=slow) as (server, port):
        held = []
        for _ in range(8):  # twice the cap of heads begun and never finished
            reader, writer = await connect(port)
            writer.write(b"GET /a HTTP/1.1\r\n")
            held.append((reader, writer))
        await until(lambda: server.counts["evicted"] == 4)  # each past the cap: the oldest goes
        for reader, _ in held[:4]:
            assert await closed(reader) == b""  # evicted: closed without a word
        assert server.open_connections == 4
        assert await get(port) == (200, b"hello /x\n")  # a whole request is always answered
        assert server.counts["evicted"] == 5
        for _, writer in held:
            writer.close()


async def test_a_waiter_younger_than_evict_after_keeps_its_place_and_the_newcomer_is_told() -> None:
    """A client reconnecting as fast as it can must not make the server churn (on a TLS
    port, a handshake per attempt): past the cap, fresh waiters stay, the newcomer goes."""
    async with serving(limits=Limits(connections=2, head_timeout=30, evict_after=30)) as (
        server,
        port,
    ):
        held = [await connect(port) for _ in range(2)]
        for _, writer in held:
            writer.write(b"GET /a HTTP/1.1\r\n")
        await until(lambda: server.open_connections == 2)
        status, body = await get(port)
        assert (status, body) == (503, b"busy\n")
        assert (server.counts["busy"], server.counts["evicted"]) == (1, 0)
        for _, writer in held:
            writer.close()


async def test_when_every_connection_is_being_answered_a_new_one_gets_503_at_once() -> None:
    release = asyncio.Event()
    entered: list[str] = []

    async def slow(request: Request) -> Response:
        entered.append(request.path)
        await release.wait()
        return Response.text(200, "late")

    async with serving(slow, Limits(connections=2, answer_timeout=5)) as (_, port):
        busy = [await connect(port) for _ in range(2)]
        for _, writer in busy:
            writer.write(b"GET /a HTTP/1.1\r\n\r\n")
        await until(lambda: len(entered) == 2)  # both being answered
        assert (await get(port))[0] == 503
        release.set()
        for reader, _ in busy:
            assert await answer(reader) == (200, b"late\n")


async def unfinished_from(address: str, port: int) -> asyncio.StreamWriter:
    """A connection from `address` (a neighbour's) with a request begun, never finished."""
    _, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, local_addr=(address, 0)), 5
    )
    writer.write(b"GET / HTTP/1.1\r\nX-Slow: ")
    return writer


async def test_one_address_holds_its_share_and_the_probes_address_always_gets_in() -> None:
    """A neighbour at 127.0.0.2 opening connection after connection, each an unfinished
    request: it holds at most `per_peer` (evicting its own), and a probe from another
    address is answered every time, the port far from full."""
    limits = Limits(connections=16, per_peer=4, head_timeout=30, evict_after=0)
    async with serving(limits=limits) as (server, port):
        held: list[asyncio.StreamWriter] = []
        for _ in range(40):
            held.append(await unfinished_from("127.0.0.2", port))
            assert (await get(port))[0] == 200
        await until(lambda: server.open_connections <= 4)
        assert server.counts["evicted"] >= 36
        for writer in held:
            writer.close()


async def test_a_refused_newcomer_on_a_plain_port_is_held_still_then_told() -> None:
    """Every connection being answered: a newcomer is refused, held still (unread) for the
    head deadline rather than closed at once, then told 503, its request read first (a close
    with unread data would be a reset that loses the answer)."""
    release = asyncio.Event()

    async def slow(request: Request) -> Response:
        await release.wait()
        return Response.text(200, "late")

    limits = Limits(connections=1, answer_timeout=5, head_timeout=0.5, held_still=4)
    async with serving(slow, limits) as (server, port):
        reader, writer = await connect(port)
        writer.write(b"GET /a HTTP/1.1\r\n\r\n")
        await until(lambda: server.open_connections == 1)
        newcomer = asyncio.ensure_future(get(port))
        await until(lambda: server.held_still_now == 1)
        assert not newcomer.done()
        assert await asyncio.wait_for(newcomer, 5) == (503, b"busy\n")
        assert server.held_still_now == 0 and server.counts["busy"] == 1
        release.set()
        assert await answer(reader) == (200, b"late\n")
        writer.close()


async def test_a_full_port_makes_room_from_the_address_holding_most_whatever_its_age() -> None:
    """Every slot held by one address, each connection young: a probe from another address
    is still answered (the fattest address's longest waiter evicted), where the port's
    own rule (a waiter of `evict_after`) would have refused it."""
    limits = Limits(connections=8, per_peer=8, head_timeout=30, evict_after=30)
    async with serving(limits=limits) as (server, port):
        held: list[asyncio.StreamWriter] = []
        for _ in range(8):
            held.append(await unfinished_from("127.0.0.2", port))
        await until(lambda: server.open_connections == 8)
        assert (await get(port))[0] == 200
        assert server.counts["evicted"] == 1 and server.counts["busy"] == 0
        for writer in held:
            writer.close()


async def test_after_a_peak_of_connections_the_heap_is_given_back() -> None:
    limits = Limits(connections=100, per_peer=100, head_timeout=30)
    async with serving(limits=limits) as (server, port):
        held = [(await connect(port))[1] for _ in range(70)]
        await until(lambda: server.open_connections == 70)
        assert server.heap_returns == 0
        for writer in held:
            writer.close()
        await until(lambda: server.heap_returns == 1)  # glibc: malloc_trim


async def test_one_address_past_its_burst_is_paced_and_another_is_not() -> None:
    """A client asking again and again on one connection: its burst answered at once, the
    rest each after its address's turn (slowed, not refused); another address meanwhile is
    not paced at all."""
    limits = Limits(per_peer_rate=10.0, per_peer_burst=3)
    async with serving(limits=limits) as (server, port):
        reader, writer = await connect(port)
        for i in range(8):
            writer.write(f"GET /{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert await answer(reader) == (200, f"hello /{i}\n".encode())
        assert server.counts["paced"] == 5
        other_reader, other = await asyncio.wait_for(asyncio.open_connection(
            "127.0.0.1", port, local_addr=("127.0.0.3", 0)), 5)  # fmt: skip
        other.write(b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await answer(other_reader) == (200, b"hello /other\n")
        assert server.counts["paced"] == 5
        writer.close()
        other.close()


async def test_a_handler_that_takes_too_long_is_a_503() -> None:
    async def stuck(request: Request) -> Response:
        await asyncio.Event().wait()
        raise AssertionError("never")

    async with serving(stuck, Limits(answer_timeout=0.2)) as (server, port):
        assert (await get(port))[0] == 503
        assert server.counts["answer_timeout"] == 1


async def test_tls_with_a_self_signed_certificate() -> None:
    tls = Serving(None, ["deathwatch-controller-metrics.deathwatch-system.svc", "127.0.0.1"])
    async with serving(tls=tls.context) as (_, port):
        assert await get(port, "/m", tls=True) == (200, b"hello /m\n")
        # a client that never completes its handshake is cut at the head deadline
        reader, writer = await connect(port)
        writer.write(b"\x16\x03\x01")  # the start of a ClientHello, and nothing more
        assert await closed(reader) == b""


def test_the_certificate_in_force_says_when_it_expires_and_a_renewal_moves_it(
    tmp_path: Path,
) -> None:
    """ADR 0043: what DeathwatchCertificateExpiring reads. A self-signed one lasts a year; a
    mounted one is read from its file, and read again when the file changes."""
    made = Serving(None, ["127.0.0.1"])
    assert made.not_after is not None
    assert 364 * 86400 < made.not_after - time.time() <= 365 * 86400
    for days in (3, 30):
        key, cert = tmp_path / "tls.key", tmp_path / "tls.crt"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out",
                        str(cert), "-subj", "/CN=x", "-days", str(days)],
                       check=True, capture_output=True, timeout=30)  # fmt: skip
        if days == 3:
            mounted = Serving(tmp_path)
        else:
            os.utime(cert, (time.time() + 5, time.time() + 5))  # a renewal's new file
            assert mounted.refresh()
        assert mounted.not_after is not None
        assert abs(mounted.not_after - (time.time() + days * 86400)) < 120
    collector = PortsCollector("deathwatch", {}, None, None, lambda: mounted.not_after)
    [family] = [f for f in collector.collect()
                if f.name == "deathwatch_serving_certificate_expiry_timestamp_seconds"]  # fmt: skip
    assert family.samples[0].value == mounted.not_after


def test_a_self_signed_certificate_leaves_cryptography_out_of_the_process() -> None:
    """It is made by a child interpreter: the 7.5 MiB of the cryptography package are not
    resident for the life of every replica and agent (bench/idle_memory.py)."""
    program = ("import sys\nfrom deathwatch._kube.tls import Serving\n"
               "Serving(None, ['127.0.0.1', 'localhost'])\n"
               "print(sorted(m for m in sys.modules if m.split('.')[0] == 'cryptography'))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("maker", "said"),
    [("/bin/false", r" \(exit 1\): no output$"), ("/nonexistent/python", r": .*No such file")],
)
def test_a_failing_certificate_maker_is_a_certificate_error_with_its_last_line(
    monkeypatch: pytest.MonkeyPatch, maker: str, said: str
) -> None:
    monkeypatch.setattr(sys, "executable", maker)
    with pytest.raises(CertificateError, match=r"^cannot make the self-signed serving "
                       r"certificate" + said):  # fmt: skip
        Serving(None, ["127.0.0.1"])


def test_no_writable_temporary_directory_is_a_certificate_error_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read-only root filesystem without a /tmp mount: one line, not an OSError."""
    monkeypatch.setattr(tempfile, "tempdir", "/proc/deathwatch-nowhere")
    with pytest.raises(CertificateError, match=r"cannot stage the serving certificate in "
                       r"/proc/deathwatch-nowhere: .*mount a writable /tmp"):  # fmt: skip
        Serving(None, ["127.0.0.1"])


def test_the_open_files_soft_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = raise_open_files()
    assert soft == hard


def test_limits_name_a_bad_value() -> None:
    with pytest.raises(ValueError, match="connections: expected at least 1, got 0"):
        Limits(connections=0)
    with pytest.raises(ValueError, match="head_timeout: expected a positive number, got -1"):
        Limits(head_timeout=-1)
    with pytest.raises(ValueError, match="per_peer: expected at least 1, got 0"):
        Limits(per_peer=0)
    with pytest.raises(ValueError, match=r"per_peer_rate, per_peer_burst: .* got 0, 40"):
        Limits(per_peer_rate=0)


async def until(probe: Callable[[], bool], within: float = 5) -> None:
    async with asyncio.timeout(within):
        while not probe():  # noqa: ASYNC110 - state the server changes, polled with a deadline
            await asyncio.sleep(0.005)


# --- what a connection leaves behind -----------------------------------------------------------

_CLIENT_TLS = ssl.create_default_context()
_CLIENT_TLS.check_hostname, _CLIENT_TLS.verify_mode = False, ssl.CERT_NONE
# a connection's own objects: none may outlive it in a reference cycle (asyncio's socket
# transport keeps one of its own, a bound method on itself: small, and not ours to break)
OURS_AND_ITS = {"Task", "coroutine", "frame", "Future", "StreamReader", "StreamWriter",
                "_SmallTLS", "SSLObject", "MemoryBIO", "_Conn"}  # fmt: skip


def _blocking_client(port: int, tls: bool, script: str) -> None:
    """A client on a plain thread (no event loop, so nothing of its own in the census)."""
    sock = socket.create_connection(("127.0.0.1", port), 5)
    try:
        if tls and script != "no handshake":
            sock = _CLIENT_TLS.wrap_socket(sock)
        sock.settimeout(5)
        if script == "goes away mid-head":
            sock.sendall(b"GET / HTTP/1.1\r\nX-Slow: ")
            time.sleep(0.05)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif script in ("cut at the head deadline", "evicted"):
            sock.sendall(b"GET / HTTP/1.1\r\nX-Slow: ")
            sock.recv(1024)
        elif script == "no handshake":
            sock.recv(1024)
        elif script == "cut when idle":
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.recv(1024)
            sock.recv(1024)
        elif script == "refused":
            sock.sendall(b"POST / HTTP/1.1\r\n\r\n")
            sock.recv(1024)
    except (OSError, ssl.SSLError):
        pass  # the server cut it: what the script is about
    finally:
        sock.close()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
@pytest.mark.parametrize("script", ["goes away mid-head", "cut at the head deadline",
                                    "no handshake", "cut when idle", "refused", "evicted"])  # fmt: skip
async def test_a_connection_leaves_nothing_in_a_reference_cycle(tls: bool, script: str) -> None:
    """Each way a connection ends frees what it held at once: an exception's traceback
    holding the frame that holds the future or the stream that holds the exception kept a
    slowloris's every connection (its TLS objects) until a full collection."""
    limits = Limits(connections=2, head_timeout=0.3, idle_timeout=0.3, evict_after=0.0)
    context = Serving(None, ["127.0.0.1"]).context if tls else None
    async with serving(limits=limits, tls=context) as (server, port):
        await get(port, tls=tls)  # asyncio's first-use objects made before the census
        gc.collect()
        clients = 3 if script == "evicted" else 1
        threads = []
        for _ in range(clients):
            threads.append(threading.Thread(target=_blocking_client,
                                            args=(port, tls, script), daemon=True))  # fmt: skip
            threads[-1].start()
            if script == "evicted":  # each held before the next comes: the third evicts
                wanted = min(len(threads), 2)
                await until(lambda wanted=wanted: server.open_connections >= wanted)  # type: ignore[misc]
        await until(lambda: not any(t.is_alive() for t in threads) and not server.open_connections)
        if script == "evicted":
            assert server.counts["evicted"] >= 1
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            left = sorted({type(o).__name__ for o in gc.garbage} & OURS_AND_ITS)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert left == [], f"{script}: left in a cycle: {left}"


async def test_a_held_tls_connection_costs_a_few_kib_of_python_memory() -> None:
    """asyncio's TLS protocol allocates 256 KiB per connection for its receive buffer: 1,024
    held slots were past the firewall agent's memory limit. Ours reads 4 KiB at a time."""
    held = 40
    async with serving(limits=Limits(connections=held, head_timeout=30, per_peer=held),
                       tls=Serving(None, ["127.0.0.1"]).context) as (server, port):  # fmt: skip
        await get(port, tls=True)
        socks: list[socket.socket] = []

        def hold() -> None:  # a plain thread's blocking clients: nothing of theirs traced
            for _ in range(held):
                sock = _CLIENT_TLS.wrap_socket(socket.create_connection(("127.0.0.1", port), 5))
                sock.sendall(b"GET / HTTP/1.1\r\nX-Slow: ")
                socks.append(sock)

        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            holder = threading.Thread(target=hold, daemon=True)
            holder.start()
            await until(lambda: server.open_connections == held and not holder.is_alive())
            per_connection = (tracemalloc.get_traced_memory()[0] - before) / held
        finally:
            tracemalloc.stop()
            for sock in socks:
                sock.close()
    assert per_connection < 24 * 1024, f"{per_connection / 1024:.1f} KiB a held connection"
