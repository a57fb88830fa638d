"""A hostile neighbour, for tests and benches of deathwatch's ports: what any pod of the
cluster can do to a port it reaches. Each attack runs as its own process (niced, as the
issue's measurements were), until SIGTERM, then prints one JSON line of what it did.

    python3 -m hack.localcluster.attacks slowloris --url https://127.0.0.1:8443 --connections 1100
    python3 -m hack.localcluster.attacks flood --url https://127.0.0.1:8443 --connections 64
    python3 -m hack.localcluster.attacks tokens --url https://127.0.0.1:8443 --connections 8
    python3 -m hack.localcluster.attacks slowloris --url https://127.0.0.1:8443 \
        --connections 1100 --sources 256   # as 256 pods would: one loopback address each

- `slowloris`: `connections` connections, each with a request begun and never finished (a
  TLS handshake first on https), opened again whenever the server closes one;
- `flood`: `connections` keep-alive clients asking /metrics, /readyz and /healthz in turn,
  as fast as they are answered (no token: what an anonymous neighbour gets);
- `tokens`: clients asking /metrics, each request with a new made-up bearer token.

`Poller` is the kubelet's side: /healthz every `period` with a `timeout`, as a liveness
probe does, recording every failure and the longest run of them.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import secrets
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent.parent


@functools.cache  # one for the process: each loads the CA store (~15 ms, 1,100 of them: 16 s)
def _context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = (
        ssl.CERT_NONE
    )  # a self-signed serving certificate: tested by name elsewhere
    return context


def source(i: int, sources: int) -> str | None:
    """The address the i-th connection comes from: with no sources, this host's own (no
    binding); else 127.77.x.y, one per pod the attack stands for (loopback targets only:
    Linux answers for all of 127.0.0.0/8 on lo), apart from the probes' and scrapes'
    127.0.0.1 as a neighbour pod's address is apart from the node's."""
    if sources < 1:
        return None
    k = i % sources
    return f"127.77.{k // 250}.{k % 250 + 1}"


async def _open(
    url: str, local: str | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(url)
    tls = _context() if parts.scheme == "https" else None
    return await asyncio.wait_for(asyncio.open_connection(
        parts.hostname, parts.port, ssl=tls, local_addr=(local, 0) if local else None), 10)  # fmt: skip


async def _connect(
    url: str, stats: Counter[str], local: str | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection, tried again (counted) for as long as the port refuses."""
    while True:
        try:
            return await _open(url, local)
        except (OSError, TimeoutError, ssl.SSLError):
            stats["connect_failed"] += 1
            await asyncio.sleep(0.05)


async def slowloris(url: str, connections: int, stats: Counter[str], sources: int = 0) -> None:
    async def one(local: str | None) -> None:
        while True:
            reader, writer = await _connect(url, stats, local)
            stats["opened"] += 1
            try:
                writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                await writer.drain()
                await reader.read()  # until the server gives up on us
                stats["closed_by_server"] += 1
            except (OSError, ssl.SSLError):
                stats["reset"] += 1
            finally:
                writer.transport.abort()

    await asyncio.gather(*(one(source(i, sources)) for i in range(connections)))


async def _ask(
    url: str, paths: list[str], stats: Counter[str], token: bool, local: str | None = None
) -> None:
    parts = urlsplit(url)
    while True:
        reader, writer = await _connect(url, stats, local)
        try:
            while True:
                for path in paths:
                    auth = f"Authorization: Bearer {secrets.token_urlsafe(24)}\r\n" if token else ""
                    writer.write(f"GET {path} HTTP/1.1\r\nHost: {parts.hostname}\r\n{auth}\r\n"
                                 .encode())  # fmt: skip
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
                    status = head.split(b" ", 2)[1].decode()
                    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
                    await reader.readexactly(length)
                    stats[f"{path} {status}"] += 1
                    if b"connection: close" in head.lower():
                        raise ConnectionResetError
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, TimeoutError):
            stats["dropped"] += 1
        finally:
            writer.transport.abort()


async def _run(kind: str, url: str, connections: int, stats: Counter[str], sources: int) -> None:
    if kind == "slowloris":
        await slowloris(url, connections, stats, sources)
        return
    paths, token = (["/metrics", "/readyz", "/healthz"], False) if kind == "flood" else (
        ["/metrics"], True)  # fmt: skip
    await asyncio.gather(*(_ask(url, paths, stats, token, source(i, sources))
                           for i in range(connections)))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attacks")
    parser.add_argument("kind", choices=["slowloris", "flood", "tokens"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument(
        "--sources",
        type=int,
        default=1,
        help="addresses the connections come from (loopback targets only)",
    )
    args = parser.parse_args(argv)
    if args.sources and urlsplit(args.url).hostname not in ("127.0.0.1", "localhost"):
        parser.error(f"--sources {args.sources}: only against 127.0.0.1, got {args.url}")
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    stats: Counter[str] = Counter()
    started = time.monotonic()

    async def run() -> None:
        task = asyncio.ensure_future(
            _run(args.kind, args.url, args.connections, stats, args.sources)
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        await stop.wait()
        task.cancel()
        print(json.dumps({"kind": args.kind, "seconds": round(time.monotonic() - started, 1),
                          **dict(stats)}), flush=True)  # fmt: skip
        # said first, then gone: on 3.11 wait_for can swallow a cancel that meets its
        # result (a connect made as it was cancelled), and that coroutine attacks on
        os._exit(0)

    asyncio.run(run())
    return 0


@dataclass
class Attack:
    """One attack process, niced (as a neighbour's would compete, not starve the machine)."""

    kind: str
    url: str
    connections: int
    sources: int = 0  # addresses it comes from (127.77.x.y, loopback only); 0: this host's
    proc: subprocess.Popen[str] | None = None
    said: dict[str, object] = field(default_factory=dict)

    def start(self) -> Attack:
        self.proc = subprocess.Popen(
            ["nice", "-n", "10", sys.executable, "-m", "hack.localcluster.attacks", self.kind,
             "--url", self.url, "--connections", str(self.connections),
             "--sources", str(self.sources)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        return self

    def stop(self) -> dict[str, object]:
        if self.proc is None:
            return self.said
        self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate(timeout=30)
        lines = [line for line in (out or "").splitlines() if line.startswith("{")]
        self.said = json.loads(lines[-1]) if lines else {"output": (out or "")[-2000:]}
        self.proc = None
        return self.said

    def __enter__(self) -> Attack:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


class Poller:
    """The kubelet's liveness probe: GET `url` every `period` s, `timeout` s each; or, with
    `command`, an exec probe: the command run as the kubelet would, its exit status."""

    def __init__(self, url: str, period: float = 1.0, timeout: float = 2.0,
                 command: list[str] | None = None) -> None:  # fmt: skip
        self.url, self.period, self.timeout, self.command = url, period, timeout, command
        self.results: list[tuple[float, bool, float]] = []  # (when, ok, seconds taken)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="poller", daemon=True)

    def _run(self) -> None:
        context = _context() if self.url.startswith("https") else None
        while not self._stop.is_set():
            began = time.monotonic()
            ok = False
            try:
                if self.command is not None:
                    ok = subprocess.run(self.command, timeout=self.timeout, check=False,
                                        capture_output=True).returncode == 0  # fmt: skip
                else:
                    with urllib.request.urlopen(self.url, timeout=self.timeout,  # noqa: S310
                                                context=context) as r:  # fmt: skip
                        ok = r.status == 200
            except (urllib.error.URLError, OSError, ssl.SSLError, subprocess.TimeoutExpired):
                ok = False
            took = time.monotonic() - began
            self.results.append((began, ok, took))
            self._stop.wait(max(0.0, self.period - took))

    def start(self) -> Poller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    @property
    def failures(self) -> int:
        return sum(not ok for _, ok, _ in self.results)

    @property
    def longest_failing_run(self) -> int:
        longest = run = 0
        for _, ok, _ in self.results:
            run = 0 if ok else run + 1
            longest = max(longest, run)
        return longest

    @property
    def slowest(self) -> float:
        return max((took for _, _, took in self.results), default=0.0)

    def __enter__(self) -> Poller:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
