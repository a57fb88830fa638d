"""Writes verdicts to the API: SandboxVerdicts, DeathWatch status, Events on pods.

The engine decides; this module only makes the API agree, with these rules:

- One desired state per object, the latest wins (a pod that flaps ten times while a write is
  in flight costs two writes, not ten); one write in flight per object, so they stay in order.
- Dead verdicts jump the queue: they are what users act on, and the latency target is theirs.
- Failures that can pass (timeouts, connection errors, 5xx, 429) are retried with backoff and
  the desire is kept; nothing is lost while the API is down. Failures that cannot (the schema
  refusing to take a Dead verdict back, 422) are logged and counted, never retried.
- Events have deterministic names (pod, uid, reason): creating one twice is a 409, so a
  controller restarted after a crash never posts a second SandboxDead for the same death.
  The Event is created before the verdict it announces, so a crash between the two repeats
  the transition on restart (event deduplicated) instead of losing the Event.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog

from deathwatch._engine.timeutil import UTC, format_time
from deathwatch._operator.kube import Api, api_message, retryable, status_code
from deathwatch._operator.metrics import Metrics
from deathwatch._operator.spec import GROUP, VERSION

log = structlog.get_logger("deathwatch.writer")

URGENT, NORMAL, LOW = 0, 1, 2
BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
SV_PLURAL = "sandboxverdicts"
DW_PLURAL = "deathwatches"
MANAGED_BY = "deathwatch.dev/controller"


@dataclass(frozen=True, slots=True)
class PodEvent:
    """A Kubernetes Event about a pod (core/v1), posted once per (pod uid, reason)."""

    namespace: str
    pod: str
    pod_uid: str
    reason: str
    message: str
    type: str = "Warning"

    @property
    def name(self) -> str:
        suffix = f".{self.pod_uid[:8]}.{self.reason.lower()}"
        return self.pod[: 253 - len(suffix)] + suffix


@dataclass
class Desired:
    kind: str  # "sv" or "dw"
    namespace: str
    name: str
    status: dict[str, Any] | None = None
    owner: Mapping[str, Any] | None = None  # the DeathWatch owning a SandboxVerdict
    delete_if_uid: str | None = None  # delete the SandboxVerdict if it is still this pod's
    events: list[PodEvent] = field(default_factory=list)
    priority: int = NORMAL
    received: float | None = None  # monotonic time the triggering pod event arrived
    ready_drop_at: datetime | None = None  # for the verdict latency metric (Dead only)
    attempt: int = 0

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.namespace, self.name)

    def merged_into(self, newer: Desired) -> Desired:
        """`newer` wins, but keeps the events and urgency this one still owes."""
        newer.events = self.events + [e for e in newer.events if e not in self.events]
        newer.priority = min(self.priority, newer.priority)
        newer.received = self.received if self.received is not None else newer.received
        newer.ready_drop_at = newer.ready_drop_at or self.ready_drop_at
        newer.attempt = max(self.attempt, newer.attempt)  # a newer desire does not reset backoff
        return newer


_KEYSETS: dict[tuple[str, ...], tuple[str, ...]] = {}


@dataclass(frozen=True, slots=True)
class Written:
    """What the API holds for an object, compactly: 10,000 SandboxVerdicts must not cost
    10,000 status dicts (the memory target is 250 MiB for 10,000 sandboxes)."""

    keys: tuple[str, ...]  # shared between objects with the same fields
    digest: int
    pod_uid: str | None

    @staticmethod
    def of(status: Mapping[str, Any]) -> Written:
        keys = tuple(sorted(status))
        text = json.dumps(status, sort_keys=True, separators=(",", ":"), default=str)
        return Written(_KEYSETS.setdefault(keys, keys), hash(text), status.get("podUID"))

    def same(self, status: Mapping[str, Any]) -> bool:
        return Written.of(status) == self


def _patch(desired: Mapping[str, Any], written: Written | None) -> dict[str, Any]:
    """A merge patch from the written status to the desired one (removed keys become null)."""
    patch = dict(desired)
    for key in written.keys if written else ():
        if key not in desired:
            patch[key] = None
    return patch


class Writer:
    def __init__(self, api: Api, metrics: Metrics, workers: int = 8) -> None:
        self.api = api
        self.metrics = metrics
        self.workers = workers
        self.written: dict[tuple[str, str, str], Written] = {}
        self.statuses: dict[tuple[str, str, str], dict[str, Any]] = {}  # DeathWatches only: few
        self.exists: set[tuple[str, str, str]] = set()
        self._pending: dict[tuple[str, str, str], Desired] = {}
        self._queue: asyncio.PriorityQueue[tuple[int, int, tuple[str, str, str]]] = (
            asyncio.PriorityQueue()
        )
        self._queued: set[tuple[str, str, str]] = set()
        self._inflight: set[tuple[str, str, str]] = set()
        self._seq = itertools.count()
        self._tasks: list[asyncio.Task[None]] = []
        self._retrying = 0  # desires waiting out a backoff
        self._idle = asyncio.Event()
        self._idle.set()
        self.instance = os.environ.get("HOSTNAME", "deathwatch")

    # --- what the controller asks for ---------------------------------------------------

    def knows(self, kind: str, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Record an object as it exists in the API (restored at start): no write needed."""
        key = (kind, namespace, name)
        self.exists.add(key)
        self.written[key] = Written.of(status)

    def want(self, desired: Desired) -> None:
        key = desired.key
        if (
            desired.delete_if_uid is None
            and not desired.events
            and key not in self._pending
            and desired.status is not None
            and (written := self.written.get(key)) is not None
            and written.same(desired.status)
            and (key in self.exists or desired.kind == "dw")
        ):
            return  # the API already says exactly this
        previous = self._pending.get(key)
        self._pending[key] = previous.merged_into(desired) if previous else desired
        self._enqueue(key, self._pending[key].priority)

    @property
    def backlog(self) -> int:
        return len(self._pending) + len(self._inflight)

    async def idle(self) -> None:
        """Wait until everything wanted is written or given up (callers bound the wait)."""
        await self._idle.wait()

    # --- the workers ----------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._work(), name=f"writer-{i}") for i in range(self.workers)
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _enqueue(self, key: tuple[str, str, str], priority: int) -> None:
        self._idle.clear()
        if key in self._queued or key in self._inflight:
            return  # picked up when the current write finishes, or already waiting
        self._queued.add(key)
        self._queue.put_nowait((priority, next(self._seq), key))

    def _update_idle(self) -> None:
        if not self._pending and not self._inflight and not self._retrying:
            self._idle.set()

    async def _work(self) -> None:
        while True:
            _, _, key = await self._queue.get()
            self._queued.discard(key)
            desired = self._pending.pop(key, None)
            if desired is None:
                self._update_idle()
                continue
            self._inflight.add(key)
            try:
                await self._write(desired)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(desired, exc)
            finally:
                self._inflight.discard(key)
                if key in self._pending:
                    self._enqueue(key, self._pending[key].priority)
                self._update_idle()

    def _failed(self, desired: Desired, exc: Exception) -> None:
        code = status_code(exc)
        where = {"kind": desired.kind, "namespace": desired.namespace, "name": desired.name}
        if not retryable(exc):
            log.error("write refused", **where, code=code, error=api_message(exc))
            return
        delay = BACKOFF[min(desired.attempt, len(BACKOFF) - 1)]
        desired.attempt += 1
        # forbidden is retried too, but logged as the configuration error it usually is
        report = log.error if code == "403" else log.warning
        report(
            "write failed, will retry",
            **where,
            code=code,
            error=api_message(exc)[:200],
            retry_in=delay,
        )
        key = desired.key
        loop = asyncio.get_running_loop()

        def again() -> None:
            self._retrying -= 1
            newer = self._pending.get(key)
            self._pending[key] = desired.merged_into(newer) if newer else desired
            self._enqueue(key, self._pending[key].priority)

        self._retrying += 1
        self._idle.clear()
        loop.call_later(delay, again)

    async def _call(self, operation: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            result = await self.api.call(fn, *args, **kwargs)
        except Exception as exc:
            self.metrics.api_errors.labels(operation, status_code(exc)).inc()
            raise
        self.metrics.api_writes.labels(operation).inc()
        return result

    async def _write(self, d: Desired) -> None:
        for event in list(d.events):
            await self._post(event)
            d.events.remove(event)  # posted: a retry of the rest must not repeat it
        if d.kind == "sv":
            if d.delete_if_uid is not None:
                await self._delete_verdict(d)
            elif d.status is not None:
                await self._write_verdict(d, d.status)
        elif d.kind == "dw" and d.status is not None:
            await self._write_deathwatch(d, d.status)

    async def _post(self, e: PodEvent) -> None:
        now = format_time(datetime.now(UTC))
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": e.name, "namespace": e.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": e.namespace,
                "name": e.pod,
                "uid": e.pod_uid,
            },
            "reason": e.reason,
            "message": e.message,
            "type": e.type,
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": "deathwatch"},
            "reportingComponent": MANAGED_BY,
            "reportingInstance": self.instance,
        }
        try:
            await self._call(
                "create_event", self.api.core.create_namespaced_event, e.namespace, body
            )
        except Exception as exc:
            if status_code(exc) == "409":
                return  # posted before (a restart repeated the transition): exactly once
            raise

    async def _write_verdict(self, d: Desired, status: dict[str, Any]) -> None:
        key = d.key
        if key not in self.exists:
            body: dict[str, Any] = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "SandboxVerdict",
                "metadata": {
                    "name": d.name,
                    "namespace": d.namespace,
                    "labels": {"app.kubernetes.io/managed-by": "deathwatch"},
                },
                "spec": {},
            }
            if d.owner is not None:
                owner_meta = d.owner.get("metadata", {})
                body["spec"]["deathWatch"] = owner_meta.get("name")
                body["metadata"]["labels"]["deathwatch.dev/watch"] = owner_meta.get("name")
                body["metadata"]["ownerReferences"] = [
                    {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": "DeathWatch",
                        "name": owner_meta.get("name"),
                        "uid": owner_meta.get("uid"),
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ]
            try:
                await self._call(
                    "create_verdict",
                    self.api.custom.create_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    d.namespace,
                    SV_PLURAL,
                    body,
                )
            except Exception as exc:
                if status_code(exc) != "409":
                    raise
                self.written.pop(key, None)  # exists, status unknown to us: write it whole
            self.exists.add(key)
        try:
            await self._call(
                "patch_verdict_status",
                self.api.custom.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                d.namespace,
                SV_PLURAL,
                d.name,
                {"status": _patch(status, self.written.get(key))},
            )
        except Exception as exc:
            if status_code(exc) == "404":  # deleted behind our back: create it again
                self.exists.discard(key)
                self.written.pop(key, None)
            raise
        self.written[key] = Written.of(status)
        if d.ready_drop_at is not None and status.get("state") == "Dead":
            now = datetime.now(UTC)
            self.metrics.verdict_latency.observe(max(0.0, (now - d.ready_drop_at).total_seconds()))
            if d.received is not None:
                self.metrics.processing_latency.observe(time.monotonic() - d.received)

    async def _delete_verdict(self, d: Desired) -> None:
        key = d.key
        written = self.written.get(key)
        if written is not None and written.pod_uid not in (None, d.delete_if_uid):
            return  # the name now belongs to a newer pod: its verdict stays
        try:
            await self._call(
                "delete_verdict",
                self.api.custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                d.namespace,
                SV_PLURAL,
                d.name,
            )
        except Exception as exc:
            if status_code(exc) != "404":
                raise
        self.exists.discard(key)
        self.written.pop(key, None)

    async def _write_deathwatch(self, d: Desired, status: dict[str, Any]) -> None:
        key = d.key
        try:
            await self._call(
                "patch_deathwatch_status",
                self.api.custom.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                d.namespace,
                DW_PLURAL,
                d.name,
                {"status": _patch(status, self.written.get(key))},
            )
        except Exception as exc:
            if status_code(exc) == "404":
                return  # the DeathWatch is gone: nothing to report on
            raise
        self.written[key] = Written.of(status)
        self.statuses[key] = status
