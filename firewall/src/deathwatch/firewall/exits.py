"""The node's exit observer: container exits heard from the runtime (runtime.py), published
on this node's exits Lease (deathwatch._kube.exits) for the controller (ADR 0028).

One thread reads the runtime's stream into a queue; this loop takes whatever is queued and
writes it in one Lease update, so a burst of exits costs one write, and no death more than
one. The Lease's resourceVersion is carried from write to write (one call per batch); a
conflict (another writer: the agent's previous pod) reads it again and merges. Nothing here
decides anything: an exit the controller cannot match to a watched sandbox is dropped there.

If the runtime cannot be read, or the API cannot be written, the kubelet's reports still
judge every death (later): each failure is a log line, a metric, and /readyz false.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, Final

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from deathwatch._kube import backoff, keepalive
from deathwatch._kube.errors import ApiError, KubeError, describe
from deathwatch._kube.exits import (
    ANNOTATION,
    COMPONENT,
    LEASE_PREFIX,
    NODE_ANNOTATION,
    SOURCE_ANNOTATION,
    Exit,
    MalformedExits,
    encode,
    kept,
    lease_name,
    read_lease,
)
from deathwatch._kube.ports import Heartbeat
from deathwatch.firewall.kubeapi import Api
from deathwatch.firewall.runtime import ContainerdStream, RuntimeUnreadable, Stream, connect

log = structlog.get_logger("deathwatch.firewall.exits")
LABELS: Final = {"app.kubernetes.io/name": "deathwatch", "app.kubernetes.io/component": COMPONENT}
# an idle connection is used again before the API server closes it, so the next death's
# write pays no handshake (ADR 0034)
WARM_AFTER: Final = keepalive.IDLE_KEPT
WRITE_BUCKETS: Final = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
OOM_GAP_BUCKETS: Final = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class ExitsMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self.heard = Counter(
            "deathwatch_node_exits_heard",
            "Pods' container exits heard from the runtime, by stream (cri, containerd)",
            ["stream"], registry=r,
        )  # fmt: skip
        self.writes = Counter(
            "deathwatch_node_exits_writes",
            "Writes of this node's exits Lease, by result (ok, conflict, failed)",
            ["result"], registry=r,
        )  # fmt: skip
        for result in ("ok", "conflict", "failed"):
            self.writes.labels(result)
        self.warmups = Counter(
            "deathwatch_node_exits_warmups",
            "Requests that keep the API connection open between exits (the API server closes "
            "one idle for 90 s), by result (ok, failed)",
            ["result"], registry=r,
        )  # fmt: skip
        for result in ("ok", "failed"):
            self.warmups.labels(result)
        self.write_seconds = Histogram(
            "deathwatch_node_exits_write_seconds",
            "From a batch of exits taken to its Lease write answered",
            buckets=WRITE_BUCKETS, registry=r,
        )  # fmt: skip
        self.heard_seconds = Histogram(
            "deathwatch_node_exits_heard_seconds",
            "From a container's exit (the runtime's clock) to this agent hearing it",
            buckets=WRITE_BUCKETS, registry=r,
        )  # fmt: skip
        self.connected = Gauge(
            "deathwatch_node_exits_runtime_connected",
            "1 while the runtime's event stream is read", registry=r,
        )  # fmt: skip
        self.oom_order = Counter(
            "deathwatch_node_exits_oom_order",
            "containerd's task events: when an OOM event came, against its container's exit: "
            "before_exit, after_exit (the exit held for it, within --oom-wait), late (after "
            "the exit was published as no OOM: the kubelet's report will dispute its cause)",
            ["order"], registry=r,
        )  # fmt: skip
        self.oom_gap = Histogram(
            "deathwatch_node_exits_oom_gap_seconds",
            "containerd's task events: how far an OOM event came from its container's exit, "
            "by order (before_exit, after_exit, late): after_exit's and late's say how long "
            "--oom-wait must be",
            ["order"], buckets=OOM_GAP_BUCKETS, registry=r,
        )  # fmt: skip
        for order in ("before_exit", "after_exit", "late"):
            self.oom_order.labels(order)
            self.oom_gap.labels(order)
        self.sigkills = Counter(
            "deathwatch_node_exits_sigkills",
            "containerd's task events: SIGKILL exits (137), and gVisor's 128 (a status its "
            "shim could not read), with no OOM event yet, by what the container's memory "
            "cgroup (gVisor: its pod's) said: none (no OOM kill counted: published at once), "
            "counted (held for the OOM event, up to --oom-wait), unread (no --cgroup-root, or "
            "the cgroup gone: held)",
            ["cgroup"], registry=r,
        )  # fmt: skip
        for said in ("none", "counted", "unread"):
            self.sigkills.labels(said)
        self.reconnects = Counter(
            "deathwatch_node_exits_runtime_failures",
            "The runtime's event stream failed or ended (read again after a backoff)",
            registry=r,
        )  # fmt: skip


class Publisher:
    """This node's exits Lease: its exits as last written, and the write itself."""

    def __init__(self, api: Api, node: str, namespace: str, identity: str,
                 prefix: str = LEASE_PREFIX,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:  # fmt: skip
        self.api, self.node, self.namespace, self.identity = api, node, namespace, identity
        self.name = lease_name(node, prefix)
        self.now = now
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.exits: list[Exit] = []
        self.source = ""
        self.version: str | None = None  # the Lease's resourceVersion as last written

    def load(self) -> None:
        """The Lease as the API holds it (a restarted agent keeps its recent exits)."""
        try:
            current = self.api.call("GET", f"{self.path}/{self.name}")
        except ApiError as exc:
            if exc.not_found:
                self.version = None
                return
            raise
        self._adopt(current)

    def _adopt(self, current: Any) -> None:
        self.version = str((current.get("metadata") or {}).get("resourceVersion") or "") or None
        try:
            read = read_lease(current)
        except MalformedExits as exc:
            log.warning("the exits Lease held what is not exits; replaced", error=str(exc))
            read = None
        if read is not None:
            self.exits = kept([*read[1], *self.exits], self.now())

    def body(self) -> dict[str, Any]:
        now = self.now()
        meta: dict[str, Any] = {
            "name": self.name, "namespace": self.namespace, "labels": LABELS,
            "annotations": {NODE_ANNOTATION: self.node, SOURCE_ANNOTATION: self.source,
                            ANNOTATION: encode(self.exits)},
        }  # fmt: skip
        if self.version is not None:
            meta["resourceVersion"] = self.version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.identity,
                "renewTime": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            },
        }

    def publish(self, new: Iterable[Exit], source: str | None = None) -> None:
        """Write the exits heard since the last write (and the stream's source, if it
        changed), in one call but on a conflict. Raises KubeError."""
        self.exits = kept([*self.exits, *new], self.now())
        if source is not None:
            self.source = source
        for _ in range(3):
            try:
                if self.version is None:
                    answer = self.api.call("POST", self.path, self.body())
                else:
                    answer = self.api.call("PUT", f"{self.path}/{self.name}", self.body())
            except ApiError as exc:
                if exc.status == 409 or exc.not_found:  # another writer, or removed: read
                    self.load()
                    continue
                raise
            self.version = str(answer["metadata"]["resourceVersion"])
            return
        raise ApiError(409, "Conflict", b"the exits Lease kept changing under this agent")

    def warm(self) -> None:
        """One cheap request on this thread's connection, so it stays open; any answer will
        do, a refusal too (it came on the connection). Raises NoAnswer."""
        try:
            self.api.call("GET", keepalive.WARM_PATH)
        except ApiError:
            return


class ExitListener:
    """Reads the runtime's exits and publishes them, for ever (until `stop`)."""

    def __init__(self, socket: str, publisher: Publisher, metrics: ExitsMetrics,
                 heartbeat: Heartbeat, stop: threading.Event, oom_wait: float = 0.02,
                 connector: Callable[[str, float], Stream] = connect) -> None:  # fmt: skip
        self.socket, self.publisher, self.metrics = socket, publisher, metrics
        self.heartbeat, self.stop, self.oom_wait = heartbeat, stop, oom_wait
        self.connector = connector
        self.queue: queue.Queue[Exit | BaseException] = queue.Queue()
        self.stream: Stream | None = None
        self.connected = False
        self.written = True  # the last write succeeded (or none was due)
        self._pending: list[Exit] = []
        self._source: str | None = None
        self.exchanged = time.monotonic()  # the API connection last used (WARM_AFTER)

    def report(self) -> tuple[bool, dict[str, Any]]:
        """/readyz's details: reading the runtime, and writing what it heard."""
        ready = self.connected and self.written
        return ready, {"runtime": self.stream.runtime.source if self.stream else None,
                       "runtime_connected": self.connected, "last_write_ok": self.written,
                       "lease": self.publisher.name, "exits_held": len(self.publisher.exits),
                       "unwritten": len(self._pending)}  # fmt: skip

    def run(self) -> None:
        reader = threading.Thread(target=self._read, name="runtime-stream", daemon=True)
        reader.start()
        try:
            self.publisher.load()
        except KubeError as exc:
            log.error("cannot read this node's exits Lease; writing it anew",
                      error=describe(exc)[:300])  # fmt: skip
        failures = 0
        while not self.stop.is_set():
            self.heartbeat.beat(ready=self.connected and self.written)
            try:
                item = self.queue.get(timeout=1.0)
            except queue.Empty:
                item = None
                if time.monotonic() - self.exchanged > WARM_AFTER:
                    self._warm()
            batch = self._pending
            if isinstance(item, Exit):
                batch.append(item)
            while True:  # whatever else is queued goes in the same write
                try:
                    more = self.queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(more, Exit):
                    batch.append(more)
            if not batch and self._source is None:
                continue
            written = self._write(batch)
            self.heartbeat.beat(ready=self.connected and written)
            if not written:
                failures += 1
                self.stop.wait(backoff.delay(backoff.PUBLISH, failures))
                continue
            failures = 0
        if self.stream is not None:
            self.stream.close()

    def _write(self, batch: list[Exit]) -> bool:
        started = time.perf_counter()
        taken = datetime.now(UTC)  # the batch taken: how long after its first exit
        source = self._source
        try:
            self.publisher.publish(batch, source)
        except KubeError as exc:
            self._pending = batch  # written with the next batch: nothing heard is dropped
            self.written = False
            self.metrics.writes.labels("failed").inc()
            log.error("cannot write this node's exits Lease; the kubelet's reports judge these "
                      "deaths", error=describe(exc)[:300], exits=len(batch))  # fmt: skip
            return False
        took = time.perf_counter() - started
        self.exchanged = time.monotonic()
        self.metrics.write_seconds.observe(took)
        self.metrics.writes.labels("ok").inc()
        self._pending, self.written = [], True
        if self._source == source:
            self._source = None  # said; a newer connection's source is said next time
        if batch:
            oldest = min(e.exited_at for e in batch)
            log.info("exits published", exits=[f"{e.namespace}/{e.pod} {e.container} "
                                                f"{e.exit_code}{' oom' if e.oom else ''}"
                                                for e in batch],
                     taken_ms=round((taken - oldest).total_seconds() * 1000, 1),
                     write_ms=round(took * 1000, 1))  # fmt: skip
        return True

    def _warm(self) -> None:
        """The idle connection used before the API server closes it; a failure is counted
        and logged (a write's own failure is what /readyz says)."""
        self.exchanged = time.monotonic()
        try:
            self.publisher.warm()
        except KubeError as exc:
            self.metrics.warmups.labels("failed").inc()
            log.warning("cannot keep the API connection open; the next exit's write makes "
                        "a new one", error=describe(exc)[:300])  # fmt: skip
            return
        self.metrics.warmups.labels("ok").inc()

    def _read(self) -> None:
        """The runtime's exits into the queue; connected again after each failure."""
        failures = 0
        while not self.stop.is_set():
            try:
                stream = self.connector(self.socket, self.oom_wait)
            except RuntimeUnreadable as exc:
                failures += 1
                self._failed(str(exc), failures)
                continue
            self.stream = stream
            if isinstance(stream, ContainerdStream):
                stream.on_oom = self._oom_heard
                stream.on_sigkill = self._sigkill_heard
            self.connected, failures = True, 0
            self.metrics.connected.set(1)
            self._source = stream.runtime.source
            log.info("reading the runtime's exits", runtime=stream.runtime.name,
                     version=stream.runtime.version, stream=stream.runtime.stream)  # fmt: skip
            try:
                for exit in stream.exits():
                    heard = (datetime.now(UTC) - exit.exited_at).total_seconds()
                    self.metrics.heard_seconds.observe(max(0.0, heard))
                    self.metrics.heard.labels(stream.runtime.stream).inc()
                    self.queue.put(exit)
                    if self.stop.is_set():
                        break
            except RuntimeUnreadable as exc:
                failures += 1
                self._failed(str(exc), failures)
            except Exception as exc:  # a bug: said with its traceback, read again
                failures += 1
                log.exception("the runtime's stream failed")
                self._failed(f"{type(exc).__name__}: {exc}", failures)
            finally:
                stream.close()
                self.connected = False
                self.metrics.connected.set(0)

    def _oom_heard(self, order: str, gap: float) -> None:
        self.metrics.oom_order.labels(order).inc()
        self.metrics.oom_gap.labels(order).observe(gap)
        said = log.warning if order == "late" else log.info
        said("an OOM kill and its exit", order=order, gap_ms=round(gap * 1000, 2),
             oom_wait_ms=round(self.oom_wait * 1000))  # fmt: skip

    def _sigkill_heard(self, cgroup: str, exit: Exit) -> None:
        self.metrics.sigkills.labels(cgroup).inc()
        log.info("a SIGKILL's exit with no OOM event yet", cgroup=cgroup,
                 held_ms=0 if cgroup == "none" else round(self.oom_wait * 1000),
                 namespace=exit.namespace, pod=exit.pod, container=exit.container)  # fmt: skip

    def _failed(self, error: str, failures: int) -> None:
        if self.stop.is_set():
            return
        self.connected = False
        self.metrics.connected.set(0)
        self.metrics.reconnects.inc()
        if failures == 1:  # said on the exits Lease too, once a spell: this node is deaf
            self._source = f"unreadable: {error}"[:250]
        wait = backoff.delay(backoff.PUBLISH, failures)
        log.error("cannot read the runtime's exits; the kubelet's reports judge deaths "
                  "meanwhile", error=error[:300], retry_in=wait)  # fmt: skip
        self.stop.wait(wait)
