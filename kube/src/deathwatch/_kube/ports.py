"""What a deathwatch process answers on its ports, the same way in the controller and in the
firewall agent (both reachable from every pod of the cluster):

- `/metrics`: for whom the API server's RBAC lets `get` it (`access.Access`: TokenReview,
  then SubjectAccessReview), the page as `scrape.Scrapes` serves it; 401 without a token,
  403 for one that may not, 503 when the review budget is spent or the API does not answer;
- `/readyz`: to anyone, up (200 "ok") or down (503 "not ready") and nothing more; its
  details (JSON) to whom may `get` /metrics (not `get /readyz`: Kubernetes's own
  `system:public-info-viewer` grants that to everyone, for its own /readyz);
- `/healthz`: to anyone (the kubelet): whether the process's work is alive, as `health`
  says, and nothing more.

`health_port` serves the last two on a `Listener` of their own (a thread of its own with its
own event loop): nothing on the other port, nor a busy event loop in the controller, can
make a request wait (ADR 0020). What it says comes from a `Heartbeat` the process's event
loop beats every second: a loop that stops beating (blocked by a synchronous call, say) is
what a liveness probe exists to catch, and it does.

The liveness probe itself reads no port: the heartbeat is also a file (`HEARTBEAT_PROBE`,
an exec probe of its age and word). A port can be starved by a neighbour sharing the
kubelet's address (any hostNetwork pod on the node: the per-address cap that keeps other
pods off took the kubelet for one of the flooders, issue #51); a file the kubelet reads
through the runtime cannot.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from deathwatch._kube.access import Access, Grant
from deathwatch._kube.scrape import TIMEOUT_HEADER, Scrapes, deadline_of
from deathwatch._kube.serving import Handler, Limits, Request, Response, Server

_log = structlog.get_logger("deathwatch.ports")
METRICS_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus text format
Readiness = Callable[[], tuple[bool, Mapping[str, Any]]]


def refusal(decision: Grant) -> Response:
    if decision is Grant.UNAUTHENTICATED:
        return Response(401, b"unauthorized: a bearer token is needed\n",
                        headers=(("WWW-Authenticate", 'Bearer realm="deathwatch"'),))  # fmt: skip
    if decision is Grant.FORBIDDEN:
        return Response.text(403, "forbidden")
    return Response(503, b"authorization not available now: try again\n",
                    headers=(("Retry-After", "1"),))  # fmt: skip


# The liveness probe of a process beating `Heartbeat(file=PATH)`: alive while the file says
# "ok" and was written within `stalled_after` (the chart's exec probes: sh and coreutils,
# which every Debian base has; a few milliseconds, no interpreter started).
HEARTBEAT_PROBE: Final = (
    'h={path}; [ "$(cat "$h")" = ok ] && [ $(($(date +%s) - $(stat -c %Y "$h"))) -le {seconds} ]'
)


def heartbeat_file(path: str) -> Path:
    """The heartbeat file a flag names, written once to prove it can be: ValueError naming
    why not (the probe would fail for ever: better a process that refuses to start)."""
    file = Path(path)
    try:
        staged = file.with_name(file.name + ".new")
        staged.write_text("starting\n")
        os.replace(staged, file)
    except OSError as exc:
        raise ValueError(f"cannot write {path}: {exc.strerror or exc}") from None
    return file


class Heartbeat:
    """The process's pulse and what its probes say, as its event loop last said them: read
    from any thread (plain attribute reads) without touching that loop; with `file`, also
    written there at every beat ("ok", or why not), for the exec liveness probe."""

    def __init__(
        self,
        stalled_after: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        file: Path | None = None,
    ) -> None:
        self.stalled_after, self.clock = stalled_after, clock
        self._at = clock()  # the process has just started: alive until it fails to beat
        self._failing: tuple[str, ...] = ()
        self._ready = False
        self.file = file
        self.file_error: str | None = None  # the last write of the file failed: why

    def beat(self, failing: tuple[str, ...] = (), ready: bool = False) -> None:
        self._at, self._failing, self._ready = self.clock(), failing, ready
        if self.file is not None:
            self._write(self.file, "failing tasks: " + ", ".join(failing) if failing else "ok")

    def _write(self, file: Path, said: str) -> None:
        """Whole or not at all (a rename), on the memory volume the chart mounts: a few
        microseconds on the beating loop. A failure is kept and said once per spell: the
        probe then fails, as it should for a process that cannot say it lives."""
        staged = file.with_name(file.name + ".new")
        try:
            staged.write_text(said + "\n")
            os.replace(staged, file)
        except OSError as exc:
            if self.file_error is None:
                _log.error("cannot write the heartbeat file: the liveness probe will fail",
                           path=str(file), error=exc.strerror or str(exc))  # fmt: skip
            self.file_error = exc.strerror or str(exc)
            return
        self.file_error = None

    def health(self) -> tuple[bool, str]:
        stalled = self.clock() - self._at
        if stalled > self.stalled_after:
            return False, f"the event loop has not turned for {stalled:.0f} s"
        failing = self._failing
        if failing:
            return False, "failing tasks: " + ", ".join(failing)
        return True, "ok"

    def ready(self) -> bool:
        return self._ready and self.health()[0]

    async def beating(self, say: Callable[[], tuple[tuple[str, ...], bool]],
                      interval: float = 1.0) -> None:  # fmt: skip
        """The beat, for ever (a supervised task of the process's loop)."""
        while True:
            failing, ready = say()
            self.beat(failing, ready)
            await asyncio.sleep(interval)


def health_answer(heartbeat: Heartbeat, path: str) -> Response | None:
    if path == "/healthz":
        ok, said = heartbeat.health()
        return Response.text(200 if ok else 500, said)
    if path == "/readyz":
        ready = heartbeat.ready()
        return Response.text(200 if ready else 503, "ok" if ready else "not ready")
    return None


@dataclass
class MetricsPort:
    """The handler of the authenticated port."""

    access: Access
    scrapes: Scrapes
    heartbeat: Heartbeat
    readiness: Readiness | None = None  # the details of /readyz (None: no such endpoint)
    answer_within: float = 10.0

    async def handle(self, request: Request) -> Response:
        if request.path == "/metrics":
            decision = await self.access.check(request.header("authorization"), "/metrics")
            if decision is not Grant.ALLOWED:
                return refusal(decision)
            within = deadline_of(request.header(TIMEOUT_HEADER), self.answer_within)
            page = await self.scrapes.page(within)
            if page is None:
                return Response(503, b"busy: try again\n", headers=(("Retry-After", "1"),))
            return Response(200, page, METRICS_TYPE)
        if request.path == "/readyz" and self.readiness is not None:
            authorization = request.header("authorization")
            if authorization is None:
                return health_answer(self.heartbeat, "/readyz") or Response.text(404, "")
            decision = await self.access.check(authorization, "/metrics")
            if decision is not Grant.ALLOWED:
                return refusal(decision)
            ok, report = self.readiness()
            body = json.dumps(report, indent=1, sort_keys=True, default=str).encode() + b"\n"
            return Response(200 if ok else 503, body, "application/json")
        if request.path == "/healthz":
            return health_answer(self.heartbeat, "/healthz") or Response.text(404, "")
        return Response.text(404, "not found")


class Listener:
    """A `Server` on a thread and an event loop of its own: what is done on the process's
    own loop (or to another of its ports) cannot make this one's clients wait."""

    def __init__(self, handler: Handler, host: str, port: int, limits: Limits,
                 tls: ssl.SSLContext | None = None, name: str = "listener") -> None:  # fmt: skip
        self.handler, self.host, self.port, self.limits, self.tls = handler, host, port, limits, tls
        self.name = name
        self.server: Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._bound = threading.Event()
        self._failure: BaseException | None = None

    def start(self, timeout: float = 10.0) -> int:
        """Listen; returns the port. Raises what binding raised."""
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),),
                                        name=self.name, daemon=True)  # fmt: skip
        self._thread.start()
        if not self._bound.wait(timeout):
            raise TimeoutError(f"{self.name}: not listening within {timeout} s")
        if self._failure is not None:
            raise self._failure
        return self.port

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self.server = Server(self.handler, self.limits, self.tls)
        try:
            self.port = await self.server.start(self.host, self.port)
        except BaseException as exc:
            self._failure = exc
            self._bound.set()
            return
        self._bound.set()
        try:
            await self._stop.wait()
        finally:
            await self.server.close()

    def stop(self, timeout: float = 5.0) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout)


# The kubelet's probe needs one connection at a time, from the node's address; a neighbour
# pod holds at most 4 from its own (with eviction alone, a neighbour's stream of newcomers
# evicted the probe's connections: 3 probes failed in a row under a 550-connection slowloris
# on this port, bench/ports_bench.py, which is a restart). Plain HTTP: the longest waiter is
# evicted for any newcomer (no handshake to waste; a fleet of 256 addresses, one or two
# each, kept the probe out 14 polls in a row when a waiter had to be 1 s old). A flood's
# connections, all being answered, cannot be evicted: its newcomers are held still, not
# spun (43 % of the listener thread's core before, 2 % now)
HEALTH_LIMITS: Final = Limits(connections=64, head_timeout=2.0, idle_timeout=15.0,
                              evict_after=0, per_peer=4, held_still=256)  # fmt: skip


def health_port(heartbeat: Heartbeat, host: str, port: int,
                limits: Limits = HEALTH_LIMITS) -> Listener:  # fmt: skip
    """/healthz and /readyz (up or down) for the kubelet, on a listener of their own."""

    async def answer(request: Request) -> Response:
        return health_answer(heartbeat, request.path) or Response.text(404, "not found")

    return Listener(answer, host, port, limits, name="health-port")


class PortsCollector(Collector):
    """The ports' own metrics, read from their counts at scrape time (a dict copied whole is
    one step under the GIL: safe from the render's worker thread)."""

    def __init__(self, prefix: str, listeners: Mapping[str, Callable[[], Server | None]],
                 access: Access | None, scrapes: Scrapes | None,
                 certificate: Callable[[], float | None] | None = None) -> None:  # fmt: skip
        """`certificate`: when the TLS port's serving certificate expires (tls.Serving)."""
        self.prefix, self.listeners, self.access, self.scrapes = prefix, listeners, access, scrapes
        self.certificate = certificate

    def collect(self) -> Iterable[Metric]:
        p = self.prefix
        refused = CounterMetricFamily(
            f"{p}_http_refused", "Connections and requests refused or cut by a port's limits, "
            "by reason (evicted, busy, head_timeout, idle, handshake, bad_request, ...; "
            "paced: a request that waited for its address's turn)",
            labels=["listener", "reason"])  # fmt: skip
        open_now = GaugeMetricFamily(
            f"{p}_http_open_connections", "Connections a port holds now", labels=["listener"]
        )
        for name, server_of in self.listeners.items():
            server = server_of()
            if server is None:
                continue
            for reason, count in dict.copy(server.counts).items():
                refused.add_metric([name, reason], count)
            open_now.add_metric([name], server.open_connections)
        yield refused
        yield open_now
        if self.access is not None:
            decisions = CounterMetricFamily(
                f"{p}_http_authorizations",
                "Bearer tokens checked for a port: the decision, and `reviewed` for each "
                "TokenReview made (the API's cost)",
                labels=["decision"],
            )
            for decision, count in dict.copy(self.access.decisions).items():
                decisions.add_metric([decision], count)
            yield decisions
        expires = self.certificate() if self.certificate is not None else None
        if expires is not None:
            yield GaugeMetricFamily(
                f"{p}_serving_certificate_expiry_timestamp_seconds",
                "When the metrics port's serving certificate expires (unix time); a renewal "
                "(cert-manager's, or a helm upgrade within metrics.tls.generated.renewDays) "
                "moves it, a restart moves a self-signed one", value=expires)  # fmt: skip
        if self.scrapes is not None:
            yield CounterMetricFamily(f"{p}_metrics_renders", "Renders of the metrics page",
                                      value=self.scrapes.renders)  # fmt: skip
            yield CounterMetricFamily(
                f"{p}_metrics_scrapes_refused",
                "Scrapes refused: the render queue full, or not in the scraper's time",
                value=self.scrapes.refused)  # fmt: skip
