"""Writes verdicts to the API: SandboxVerdicts, DeathWatch status, Events on pods.

The engine decides; this module only makes the API agree, with these rules:

- One desired state per object, the latest wins (a pod that flaps ten times while a write is
  in flight costs two writes, not ten); one write in flight per object, so they stay in order.
- Dead verdicts jump the queue: they are what users act on, and the latency target is theirs.
- Failures that can pass (timeouts, connection errors, 5xx, 429) are retried with backoff and
  the desire is kept; nothing is lost while the API is down. While an object waits out its
  backoff, newer desires merge into the waiting one and keep its attempt count: an outage
  costs one try per object per backoff step, however often its pod changes.
- Failures that cannot pass (the schema refusing to take a Dead verdict back, 422) are logged
  and counted, never retried.
- Events have deterministic names (pod, uid, reason): creating one twice is a 409, so a
  controller restarted after a crash never posts a second SandboxDead for the same death.
  A verdict that exists and its Events are sent at once (one round trip to say "dead"); a
  verdict still to be created gets its Events first. An Event lost to a crash, or to a
  leader losing its lease, between the two is posted again from the Dead verdict when the
  next writer starts or takes over (`reconcile`, ADR 0013): a 409 if it was posted.

- Only the leader writes (leader.py). A standby keeps every desire, unsent, and watches what
  the leader writes (`observed`): a desire the API already holds is dropped, but for the
  times each replica noted on its own (`Written.gist`). On takeover (`lead`) it writes only
  what still differs. A fenced leader (`may_write` false: its lease could no longer be
  proven) stops at once, before sending anything more; its queue is kept, not flushed.
- A write is checked against what the API holds again when it is taken off the queue, not
  only when it was wanted: a pod event during an in-flight write sends nothing new.
- Fencing is airtight (ADR 0011): no write of an earlier leader can land over a later one's.
  Every status write and every delete carries the object's resourceVersion as a precondition
  (the version is read first when it is not known: never a blind write), and every status is
  stamped with the writer's term (leader.py: a new one at each acquisition). So a new term's
  first write to an object always changes it and moves its resourceVersion: a write that
  changes nothing would leave the version an earlier term's held write still matches. A
  leader counts and logs any write of its objects it sees that is not its own (a held write
  of an earlier term landing late, a person): `deathwatch_foreign_writes_total`.

The writer builds nothing: documents.py makes every body, and the writer only decides when
and how to send them, through the four calls of `WriteApi` (kube.ApiWrites in production, a
fake in the unit tests).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import structlog

from deathwatch._engine.timeutil import UTC
from deathwatch._operator.documents import PodEvent
from deathwatch._operator.kube import Fenced, api_message, retryable, status_code
from deathwatch._operator.metrics import Metrics
from deathwatch._operator.resources import DW_PLURAL, SV_PLURAL

log = structlog.get_logger("deathwatch.writer")

URGENT, NORMAL, LOW = 0, 1, 2
BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
Key = tuple[str, str, str]  # (plural, namespace, name)


class WriteApi(Protocol):
    """The only calls the writer makes; each raises the client's ApiException on refusal.
    `create` and `patch_status` return the object's new resourceVersion; a patch carrying
    `metadata.resourceVersion`, and a delete given one, fail (409) if the object changed since:
    a write from a replica that lost the lease, arriving late, cannot undo a newer one."""

    async def create(self, plural: str, namespace: str, body: dict[str, Any]) -> str: ...

    async def patch_status(
        self, plural: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> str: ...

    async def delete(
        self, plural: str, namespace: str, name: str, resource_version: str | None
    ) -> None: ...

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None: ...

    async def get_status(
        self, plural: str, namespace: str, name: str
    ) -> tuple[dict[str, Any], str] | None: ...


@dataclass
class Desired:
    """What one object should be: a finished status (and the object to create if it does not
    exist yet), or its deletion; plus the Events to post before it."""

    plural: str  # SV_PLURAL or DW_PLURAL
    namespace: str
    name: str
    status: dict[str, Any] | None = None
    create: dict[str, Any] | None = None  # SandboxVerdicts: the object, if it must be created
    delete_if_uid: str | None = None  # delete the SandboxVerdict if it is still this pod's
    events: list[PodEvent] = field(default_factory=list)
    priority: int = NORMAL
    received: float | None = None  # monotonic time the triggering pod event arrived
    ready_drop_at: datetime | None = None  # for the verdict latency metric (Dead only)
    attempt: int = 0

    @property
    def key(self) -> Key:
        return (self.plural, self.namespace, self.name)

    def merged_into(self, newer: Desired) -> Desired:
        """`newer` wins, but keeps the events and urgency this one still owes; a newer
        desire of Events only (reconcile) leaves this one's status or deletion standing."""
        if newer.status is None and newer.delete_if_uid is None:
            newer.status, newer.create = self.status, self.create
            newer.delete_if_uid = self.delete_if_uid
        newer.events = self.events + [e for e in newer.events if e not in self.events]
        newer.priority = min(self.priority, newer.priority)
        newer.received = self.received if self.received is not None else newer.received
        newer.ready_drop_at = newer.ready_drop_at or self.ready_drop_at
        newer.attempt = max(self.attempt, newer.attempt)  # a newer desire does not reset backoff
        return newer


_KEYSETS: dict[tuple[str, ...], tuple[str, ...]] = {}
# When each replica noticed something: two replicas judging the same events agree on all but
# these, so a new leader does not rewrite a verdict only to put its own times on it.
VOLATILE = frozenset({"declaredAt", "podDeletedAt", "lastTransitionTime", "observedAt"})


def _without_volatile(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_volatile(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_without_volatile(v) for v in value]
    return value


TERM = "term"  # the status field the writer stamps (not part of what a status says)


def _hash(value: Any) -> int:
    if isinstance(value, Mapping) and TERM in value:
        value = {k: v for k, v in value.items() if k != TERM}
    return hash(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str))


@dataclass(frozen=True, slots=True)
class Written:
    """What the API holds for an object, compactly: 10,000 SandboxVerdicts must not cost
    10,000 status dicts (the memory target is 250 MiB for 10,000 sandboxes)."""

    keys: tuple[str, ...]  # shared between objects with the same fields
    digest: int  # of the status but for its term stamp
    gist: int  # the digest without the VOLATILE times
    pod_uid: str | None
    version: str | None  # the object's resourceVersion: the precondition of the next write

    @staticmethod
    def of(status: Mapping[str, Any], version: str | None = None) -> Written:
        keys = tuple(sorted(status))
        return Written(
            _KEYSETS.setdefault(keys, keys),
            _hash(status),
            _hash(_without_volatile(status)),
            status.get("podUID"),
            version,
        )

    def same(self, status: Mapping[str, Any]) -> bool:
        return _hash(status) == self.digest  # on every pod event: the one hash it needs


def _patch(desired: Mapping[str, Any], written: Written | None) -> dict[str, Any]:
    """A merge patch from the written status to the desired one (removed keys become null)."""
    patch = dict(desired)
    for key in written.keys if written else ():
        if key not in desired:
            patch[key] = None
    return patch


Schedule = Callable[[float, Callable[[], None]], object]


Spawn = Callable[[str, Callable[[], Coroutine[Any, Any, None]]], None]


class Writer:
    def __init__(
        self,
        api: WriteApi,
        metrics: Metrics,
        workers: int = 8,
        schedule: Schedule | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        may_write: Callable[[], bool] = lambda: True,
        leading: bool = True,
        term: int = 0,
    ) -> None:
        self.api = api
        self.metrics = metrics
        self.workers = workers
        self.clock = clock
        # when to try a failed write again: the event loop's timer unless a test drives it
        self._schedule = schedule
        self._written: dict[Key, Written] = {}
        self._exists: set[Key] = set()
        self._pending: dict[Key, Desired] = {}
        self._queue: asyncio.PriorityQueue[tuple[int, int, Key]] = asyncio.PriorityQueue()
        self._queued: set[Key] = set()
        self._inflight: set[Key] = set()
        self._seq = itertools.count()
        self._tasks: list[asyncio.Task[None]] = []
        self._backoff: set[Key] = set()  # objects waiting out a backoff: not written before
        self._idle = asyncio.Event()
        self._idle.set()
        self.instance = os.environ.get("HOSTNAME", "deathwatch")
        # only the leader writes (leader.py); a standby keeps desires and watches (observed)
        self.may_write = may_write
        self.leading = leading
        self.term = term  # stamped on every status this writer sends (leader.py)
        self._leading = asyncio.Event()
        if leading:
            self._leading.set()

    # --- what the controller asks for ---------------------------------------------------

    def knows(
        self,
        plural: str,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        version: str | None = None,
    ) -> None:
        """Record an object as it exists in the API (restored at start): no write needed."""
        key = (plural, namespace, name)
        self._exists.add(key)
        self._written[key] = Written.of(status, version)

    def forget(self, plural: str, namespace: str, name: str) -> None:
        """The object went with its owner: nothing is known about it any more."""
        key = (plural, namespace, name)
        self._exists.discard(key)
        self._written.pop(key, None)

    def want(self, desired: Desired) -> None:
        key = desired.key
        if key not in self._pending and self._holds(desired, exactly=True):
            return  # the API already says exactly this
        previous = self._pending.get(key)
        self._pending[key] = previous.merged_into(desired) if previous else desired
        self._enqueue(key, self._pending[key].priority)

    def _holds(self, desired: Desired, exactly: bool) -> bool:
        """The API already holds what `desired` asks (to the letter, or but for the times
        each replica notes on its own), and there is no Event to post."""
        key = desired.key
        if desired.delete_if_uid is not None:
            return key not in self._exists and key not in self._written
        written = self._written.get(key)
        if desired.status is None or written is None or (desired.events and exactly):
            return False
        if desired.create is not None and key not in self._exists:
            return False
        if exactly:
            return written.same(desired.status)
        return written.gist == _hash(_without_volatile(desired.status))

    # --- leading and standing by (leader.py) ----------------------------------------------

    def lead(self, term: int | None = None) -> None:
        """This replica writes from now on, in `term`: everything it wants that the API does
        not hold."""
        if term is not None:
            self.term = term
        self.leading = True
        self._leading.set()
        for key, desired in list(self._pending.items()):
            if self._holds(desired, exactly=False):
                del self._pending[key]  # the old leader wrote it (its Events before it)
            else:
                self._enqueue(key, desired.priority)
        self._update_idle()

    def standby(self) -> None:
        """Not the leader (or fenced): nothing more is sent; what is wanted stays pending."""
        self.leading = False
        self._leading.clear()

    def observed(
        self,
        plural: str,
        namespace: str,
        name: str,
        status: Mapping[str, Any] | None,
        version: str | None = None,
    ) -> None:
        """What a watch shows the API holds (None: deleted). While standing by, that is the
        leader's work: it updates what is known and settles our own desires for it. While
        leading, it is our own writes coming back (stamped with our term), and ignored; a
        status stamped with another term is a write that is not ours, landed in our term:
        counted, logged, and taken as what the API holds (our next write goes on top of it,
        with its version as the precondition)."""
        key = (plural, namespace, name)
        if self.leading:
            if status is None or TERM not in status or status[TERM] == self.term:
                return  # ours, or not a deathwatch write (a create, before any status)
            self.metrics.foreign_writes.labels(plural).inc()
            log.warning("a write that is not this leader's landed", resource=plural,
                        namespace=namespace, name=name, term=status[TERM], own_term=self.term,
                        resource_version=version)  # fmt: skip
        if status is None:
            self.forget(plural, namespace, name)
        else:
            self.knows(plural, namespace, name, status, version)
        desired = self._pending.get(key)
        if desired is not None and self._holds(desired, exactly=False):
            del self._pending[key]
        self._update_idle()

    @property
    def backlog(self) -> int:
        return len(self._pending) + len(self._inflight)

    async def idle(self) -> None:
        """Wait until everything wanted is written or given up (callers bound the wait)."""
        await self._idle.wait()

    # --- the workers ----------------------------------------------------------------------

    def start(self, spawn: Spawn | None = None) -> None:
        """Start the workers: as plain tasks, or through `spawn(name, factory)` (the operator
        passes its supervisor, which restarts a worker that crashes)."""
        for i in range(self.workers):
            if spawn is not None:
                spawn(f"writer-{i}", self._work)
            else:
                self._tasks.append(asyncio.create_task(self._work(), name=f"writer-{i}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _enqueue(self, key: Key, priority: int) -> None:
        self._idle.clear()
        if key in self._queued or key in self._inflight or key in self._backoff:
            return  # already waiting, picked up when the current write or backoff ends
        if not self.leading:
            return  # kept pending; `lead` queues it
        self._queued.add(key)
        self._queue.put_nowait((priority, next(self._seq), key))

    def _update_idle(self) -> None:
        if not self._inflight and not self._backoff and (not self._pending or not self.leading):
            self._idle.set()

    async def _work(self) -> None:
        while True:
            await self._leading.wait()
            _, _, key = await self._queue.get()
            self._queued.discard(key)
            desired = self._pending.pop(key, None)
            if desired is None:
                self._update_idle()
                continue
            if not self.leading or not self.may_write():
                # fenced between want and now: keep it for a later term, send nothing
                self._pending[key] = desired
                if self.leading:
                    self.standby()  # the elector's own timer says the same at this deadline
                self._update_idle()
                continue
            if self._holds(desired, exactly=True):
                self._update_idle()  # written meanwhile (a pod event during an in-flight write)
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
                if key in self._pending and key not in self._backoff:
                    self._enqueue(key, self._pending[key].priority)
                self._update_idle()

    def _failed(self, desired: Desired, exc: Exception) -> None:
        code = status_code(exc)
        where = {"resource": desired.plural, "namespace": desired.namespace, "name": desired.name}
        if isinstance(exc, Fenced):
            newer = self._pending.get(desired.key)
            self._pending[desired.key] = desired.merged_into(newer) if newer else desired
            log.warning("write held back: no longer provably the leader", **where)
            self.standby()
            return
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
        newer = self._pending.get(key)
        self._pending[key] = desired.merged_into(newer) if newer else desired
        self._backoff.add(key)

        def again() -> None:
            self._backoff.discard(key)
            if key in self._pending:
                self._enqueue(key, self._pending[key].priority)
            self._update_idle()

        schedule = self._schedule or asyncio.get_running_loop().call_later
        schedule(delay, again)

    async def _call(self, operation: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            result = await fn(*args)
        except Exception as exc:
            self.metrics.api_errors.labels(operation, status_code(exc)).inc()
            raise
        self.metrics.api_writes.labels(operation).inc()
        return result

    async def _write(self, d: Desired) -> None:
        key = d.key
        written = self._written.get(key)
        status = d.status
        if status is not None and d.events and written is not None and written.same(status):
            # written by an earlier try whose Events failed: only those remain (without Events
            # the dequeue check, _holds, already ruled this out: no second hash)
            status = None
        if d.delete_if_uid is not None:
            await self._post_all(d)
            await self._delete_verdict(d)
        elif status is not None and d.events and key in self._exists:
            # the verdict and its Events at once: saying "dead" costs one round trip, not two.
            # An Event lost to a crash between the two is posted again from the Dead verdict
            # at the next start or takeover (`reconcile`), under the same name: exactly once.
            results = await asyncio.gather(
                self._write_status(d, status), self._post_all(d), return_exceptions=True
            )
            for result in results:
                if isinstance(result, BaseException):
                    raise result
        else:
            await self._post_all(d)
            if status is not None:
                await self._write_status(d, status)

    async def _post_all(self, d: Desired) -> None:
        failure: BaseException | None = None
        for event in list(d.events):
            try:
                await self._post(event)
            except Exception as exc:
                failure = failure or exc
                continue
            d.events.remove(event)  # posted: a retry of the rest must not repeat it
        if failure is not None:
            raise failure

    def reconcile(self, events: list[PodEvent]) -> None:
        """Events that may have been lost between a verdict and its Event (a crash, a leader
        that lost its lease): post each again; a 409 says it was posted. Queued at low
        priority, one desire per pod, with nothing else to write."""
        for event in events:
            self.want(Desired(SV_PLURAL, event.namespace, event.pod, events=[event], priority=LOW))

    async def _post(self, e: PodEvent) -> None:
        try:
            await self._call(
                "create_event",
                self.api.create_event,
                e.namespace,
                e.document(self.clock(), self.instance),
            )
        except Exception as exc:
            if status_code(exc) == "409":
                return  # posted before (a restart repeated the transition): exactly once
            raise

    async def _write_status(
        self, d: Desired, status: dict[str, Any], retried: bool = False
    ) -> None:
        key = d.key
        noun = "verdict" if d.plural == SV_PLURAL else "deathwatch"
        if d.create is not None and key not in self._exists:
            try:
                created = await self._call(
                    f"create_{noun}", self.api.create, d.plural, d.namespace, d.create
                )
            except Exception as exc:
                if status_code(exc) != "409":
                    raise
                self._written.pop(key, None)  # exists, status unknown to us: write it whole
            else:
                self._written[key] = Written.of({}, created)
            self._exists.add(key)
        written = self._written.get(key)
        if written is None or not written.version:
            # never seen as the API holds it (a leader that has not watched it yet; a create
            # that found it existing): read its version first. A write without a precondition
            # could land over a newer leader's, whenever the network delivers it.
            current = await self._call(
                f"get_{noun}_status", self.api.get_status, d.plural, d.namespace, d.name
            )
            if current is None:
                if d.plural == DW_PLURAL or d.create is None:
                    return  # gone: nothing to report on
                self._exists.discard(key)
                if retried:
                    raise RuntimeError(f"{d.plural} {d.namespace}/{d.name} vanished twice")
                await self._write_status(d, status, retried=True)
                return
            self.knows(d.plural, d.namespace, d.name, *current)
            written = self._written[key]
            if self._holds(d, exactly=True):
                return
            if not self.leading or not self.may_write():
                raise Fenced("not sent: fenced while reading the object's version")
        stamped = {**status, TERM: self.term}
        patch: dict[str, Any] = {
            "status": _patch(stamped, written),
            "metadata": {"resourceVersion": written.version},  # the precondition
        }
        try:
            version = await self._call(
                f"patch_{noun}_status", self.api.patch_status, d.plural, d.namespace, d.name, patch
            )
        except Exception as exc:
            code = status_code(exc)
            if code not in ("404", "409") or retried:
                raise
            if not self.leading or not self.may_write():
                raise Fenced("not retried: no longer the leader") from exc
            if code == "404" and d.plural == DW_PLURAL:
                return  # the DeathWatch is gone: nothing to report on
            if code == "409":
                # changed since we last wrote or saw it (another replica's write): read it,
                # and write ours on what it is now
                current = await self.api.get_status(d.plural, d.namespace, d.name)
                if current is not None:
                    self.knows(d.plural, d.namespace, d.name, *current)
                    if self._holds(d, exactly=True):
                        return
                    await self._write_status(d, status, retried=True)
                    return
            # deleted behind our back: create it again now (a Dead verdict has no next desire)
            self._exists.discard(key)
            self._written.pop(key, None)
            if d.create is None:
                raise
            await self._write_status(d, status, retried=True)
            return
        self._written[key] = Written.of(stamped, version)
        if d.ready_drop_at is not None and status.get("state") == "Dead":
            now = self.clock()
            self.metrics.verdict_latency.observe(max(0.0, (now - d.ready_drop_at).total_seconds()))
            if d.received is not None:
                self.metrics.processing_latency.observe(time.monotonic() - d.received)

    async def _delete_verdict(self, d: Desired) -> None:
        key = d.key
        written = self._written.get(key)
        if written is not None and written.pod_uid not in (None, d.delete_if_uid):
            return  # the name now belongs to a newer pod: its verdict stays
        version = written.version if written is not None else None
        if not version:  # never a blind delete either: read the version it is to have
            current = await self._call(
                "get_verdict_status", self.api.get_status, d.plural, d.namespace, d.name
            )
            if current is None:
                self._exists.discard(key)
                self._written.pop(key, None)
                return
            status, version = current
            if status.get("podUID") not in (None, d.delete_if_uid):
                self.knows(d.plural, d.namespace, d.name, *current)
                return  # a newer pod's verdict: it stays
        try:
            await self._call(
                "delete_verdict", self.api.delete, d.plural, d.namespace, d.name, version
            )
        except Exception as exc:
            if status_code(exc) not in ("404", "409"):
                raise  # 409: changed meanwhile (a newer pod's verdict): not ours to delete
        self._exists.discard(key)
        self._written.pop(key, None)
