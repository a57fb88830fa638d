"""Sends what the controller decided to the API: SandboxVerdicts, DeathWatch status, Events.

The controller decides and builds every document (reporting/); the writer only decides when
and how to send, through the five calls of `WriteApi` (kube.ApiWrites on the real API, a fake
in the unit tests), with these rules:

- One desire per object, the latest wins (a pod that flaps ten times while a write is in
  flight costs two writes, not ten); one write in flight per object, so they stay in order.
- Nothing is sent that the API already holds: a desire is compared with what was last
  written or seen by its gist (status_writes.py), once when it is wanted and again when it is
  taken off the queue (a pod event during an in-flight write sends nothing new).
- Dead verdicts jump the queue: they are what users act on.
- Failures that can pass (timeouts, connection errors, 5xx, 429, 403) are retried with
  backoff and the desire is kept: nothing is lost while the API is down. While an object
  waits out its backoff, newer desires merge into the waiting one and keep its attempt count.
- A refusal that cannot pass (a 4xx such as the schema's 422) is counted and logged once,
  and that same status is never sent again: only a different one is tried.
- Events have deterministic names (pod, uid, reason): creating one twice is a 409, so no
  restart posts a second SandboxDead. A verdict that exists and its Events go out together
  (one round trip to say "dead"); a verdict still to be created gets its Events first. An
  Event lost between the two is posted again from the Dead verdict at the next start or
  takeover (`reconcile`).

Fencing (ADR 0011): only the leader writes. A status is replaced whole (PUT on the status
subresource), carrying the resourceVersion it was computed against: the API server refuses
an update of a custom resource without one, and answers 409 when it is stale; deletes carry
it as a precondition; an object whose version is unknown is read first. Every status is
stamped with the writer's term (a new one at each acquisition of the Lease), so a new term's
first write to an object changes it and moves its version past any precondition an earlier
term could still hold in the network. A fenced leader (`may_write` false) stops before
sending anything more; what it wanted is kept, not flushed.

A standby sends nothing. It keeps, per object it would write differently from what the API
holds, only a compact debt (the gist and the Events), settled by the leader's writes as its
watch shows them (`observed`); taking over (`take_over`) returns the objects still owed, which
the controller builds again and wants. A leader that sees on its watch a status of another
term (a held write of an earlier term landing late, or a person) counts it, logs it, and
returns the object so the controller says it again.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import structlog

from deathwatch._api.resources import NOUNS, SV_PLURAL
from deathwatch._engine.timeutil import UTC
from deathwatch._kube import backoff
from deathwatch._kube.errors import ApiError, KubeError, describe, label, retryable
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.leadership.group import Leadership
from deathwatch._operator.reporting.pod_events import KubeEvent
from deathwatch._operator.writing.kube import Fenced
from deathwatch._operator.writing.status_writes import (
    EMPTY,
    NO_LABELS,
    TERM,
    Held,
    gist,
    label_gist,
    says_dead,
)

log = structlog.get_logger("deathwatch.writer")

URGENT, NORMAL, LOW = 0, 1, 2
ObjectKey = tuple[str, str, str]  # (plural, namespace, name)


class WriteApi(Protocol):
    """The writer's calls; each raises errors.ApiError on refusal, errors.NoAnswer when no
    answer came. `create`,
    `replace_status` and `patch_labels` return the object's new resourceVersion;
    `replace_status`, `patch_labels` and `delete` fail (409) if the object is no longer at
    `version`. `read_status` returns the status, the version and the labels."""

    async def create(self, plural: str, namespace: str, body: dict[str, Any]) -> str: ...

    async def replace_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any], version: str
    ) -> str: ...

    async def patch_labels(
        self, plural: str, namespace: str, name: str, labels: dict[str, str], version: str
    ) -> str: ...

    async def apply_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any], manager: str
    ) -> str: ...

    async def delete(self, plural: str, namespace: str, name: str, version: str) -> None: ...

    async def read_status(
        self, plural: str, namespace: str, name: str
    ) -> tuple[dict[str, Any], str, dict[str, str]] | None: ...

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None: ...


class Contended(KubeError):
    """The object moved under every bounded try: written again after a backoff."""

    @property
    def retryable(self) -> bool:
        return True

    @property
    def label(self) -> str:
        return "contended"


@dataclass(slots=True)
class Desired:
    """What one object should be: a finished status (and the object to create if it does not
    exist yet), or its deletion; plus the Events to post with it. Its gist is computed once,
    here."""

    plural: str  # SV_PLURAL or DW_PLURAL
    namespace: str
    name: str
    status: dict[str, Any] | None = None
    create: dict[str, Any] | None = None  # SandboxVerdicts: the object, if it must be created
    # the written labels it must carry (status_writes.WRITTEN_LABELS; None: no requirement)
    labels: dict[str, str] | None = None
    delete: str | None = None  # delete the SandboxVerdict if it still is this pod uid's
    events: list[KubeEvent] = field(default_factory=list)
    priority: int = NORMAL
    received: float | None = None  # monotonic time the triggering pod event arrived
    ready_drop_at: datetime | None = None  # for the verdict latency metric (Dead only)
    slot: int | None = None  # its sandbox's slot (slots.py); None: not a sandbox's, or unsharded
    # sharded, a DeathWatch status part: server-side applied as this field manager, the
    # other shards' parts left as they are (no resourceVersion, no term stamp: ADR 0025)
    apply_as: str | None = None
    attempt: int = 0
    gist: int = field(init=False)
    label_gist: int | None = field(init=False)

    def __post_init__(self) -> None:
        self.gist = gist(self.status) if self.status is not None else 0
        self.label_gist = label_gist(self.labels) if self.labels is not None else None

    @property
    def key(self) -> ObjectKey:
        return (self.plural, self.namespace, self.name)

    def held_by(self, held: Held | None) -> bool:
        """The API holds the status (and the written labels) this desire asks for."""
        return (
            held is not None
            and self.status is not None
            and held.gist == self.gist
            and (self.label_gist is None or held.labels == self.label_gist)
        )

    @property
    def says(self) -> bool:
        """It asks for a status or a deletion (not Events alone)."""
        return self.status is not None or self.delete is not None

    def merged_into(self, newer: Desired) -> Desired:
        """`newer` wins, but keeps the Events and urgency this one still owes; a newer desire
        of Events only (reconcile) leaves this one's status or deletion standing."""
        if not newer.says:
            newer.status, newer.create, newer.delete = self.status, self.create, self.delete
            newer.labels, newer.label_gist = self.labels, self.label_gist
            newer.gist = self.gist
        newer.events = self.events + [e for e in newer.events if e not in self.events]
        newer.priority = min(self.priority, newer.priority)
        newer.received = self.received if self.received is not None else newer.received
        newer.ready_drop_at = newer.ready_drop_at or self.ready_drop_at
        newer.attempt = max(self.attempt, newer.attempt)  # a newer desire does not reset backoff
        return newer


@dataclass(slots=True)
class Debt:
    """A standby's desire, compactly: what it would write (by gist), or that it would delete,
    and the Events it would post. The document is built again only if it takes over."""

    gist: int
    labels: int | None
    delete: str | None
    priority: int
    events: list[KubeEvent]
    slot: int | None = None

    def settled_by(self, held: Held | None) -> bool:
        """The API holds what this debt was for (the leader wrote it)."""
        if self.delete is not None:
            return held is None
        return (
            held is not None
            and held.gist == self.gist
            and (self.labels is None or held.labels == self.labels)
        )


Spawn = Callable[[str, Callable[[], Any]], None]
Schedule = Callable[[float, Callable[[], None]], object]


class Writer:
    def __init__(
        self,
        api: WriteApi,
        metrics: Metrics,
        *,
        leadership: Leadership,
        schedule: Schedule | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        term: int = 0,
        owns: Callable[[int | None], bool] = lambda slot: True,
    ) -> None:
        """`leadership`: whether this replica writes, the process's one (process/app.py);
        `owns(slot)`: whether this shard writes that slot's objects now (sharding: a slot not
        owned is owed, as a standby owes; one shard owns every slot)."""
        self.api = api
        self.metrics = metrics
        self.clock = clock
        self._schedule = schedule  # the retry timer: the event loop's unless a test drives it
        self.held: dict[ObjectKey, Held] = {}  # what the API holds, as last written or seen
        self._pending: dict[ObjectKey, Desired] = {}  # the leader's, until written
        self._owed: dict[ObjectKey, Debt] = {}  # the standby's, until the leader writes it
        self._refused: dict[ObjectKey, int] = {}  # the gist the API refused (4xx): not sent again
        self._queue: asyncio.PriorityQueue[tuple[int, int, ObjectKey]] = asyncio.PriorityQueue()
        self._queued: set[ObjectKey] = set()
        self._inflight: set[ObjectKey] = set()
        self._backoff: set[ObjectKey] = set()  # waiting out a backoff: not written before
        self._seq = itertools.count()
        self._idle = asyncio.Event()
        self._idle.set()
        self.instance = os.environ.get("HOSTNAME", "deathwatch")
        self.leadership = leadership
        self.owns = owns
        self.term = term  # stamped on every status this writer sends (leader.py)
        for plural in NOUNS:  # a finite label set: its series exist, at 0, from the start
            metrics.write_retries.labels(plural)
            for code in ("400", "403", "422"):  # bad value, RBAC, schema: the refusals we expect
                metrics.writes_refused.labels(plural, code)

    # --- what the controller asks for ---------------------------------------------------

    def knows(self, plural: str, namespace: str, name: str, status: Mapping[str, Any] | None,
              version: str, labels: Mapping[str, str] | None = None) -> None:  # fmt: skip
        """Record an object as the API holds it (listed at start, read, or watched)."""
        held = Held(gist(status), version, label_gist(labels), says_dead(status))
        self.held[(plural, namespace, name)] = held

    def forget(self, plural: str, namespace: str, name: str) -> None:
        """The object went with its owner: nothing is known or owed about it any more."""
        key = (plural, namespace, name)
        self.held.pop(key, None)
        self._owed.pop(key, None)
        self._refused.pop(key, None)

    def want(self, d: Desired) -> None:
        key = d.key
        if key not in self._pending and self._nothing_to_do(d):
            self._owed.pop(key, None)
            return
        if self._refused.get(key) == d.gist and not d.events and d.delete is None:
            return  # the API refused exactly this already: counted and logged once
        if not self.leading or not self.owns(d.slot):
            self._owe(d)
            return
        previous = self._pending.get(key)
        self._pending[key] = previous.merged_into(d) if previous else d
        self._enqueue(key, self._pending[key].priority)

    def _owe(self, d: Desired) -> None:
        """A standby's desire (or one for a slot this shard does not own): a debt."""
        key = d.key
        debt = self._owed.get(key)
        events = d.events if debt is None else debt.events + [
            e for e in d.events if e not in debt.events
        ]  # fmt: skip
        priority = d.priority if debt is None else min(debt.priority, d.priority)
        self._owed[key] = Debt(d.gist, d.label_gist, d.delete, priority, events, d.slot)

    def _nothing_to_do(self, d: Desired) -> bool:
        """The API already holds what `d` asks, and it has no Event to post."""
        if d.events:
            return False
        held = self.held.get(d.key)
        if d.delete is not None:
            return held is None
        return d.held_by(held)

    def reconcile(self, events: Iterable[KubeEvent]) -> None:
        """Events that may have been lost between a verdict and its Event (a crash, a leader
        that lost its lease): post each again; a 409 says it was posted."""
        for e in events:
            self.want(Desired(SV_PLURAL, e.namespace, e.pod, events=[e], priority=LOW))

    # --- leading and standing by (leader.py) ----------------------------------------------

    @property
    def leading(self) -> bool:
        return self.leadership.leading

    def may_write(self) -> bool:
        return self.leadership.may_write()

    def take_over(self, term: int | None = None) -> list[ObjectKey]:
        """This replica writes from now on (its Leadership says so), in `term`. Returns the
        objects it owes (its own judgement differs from what the API holds): the controller
        builds and wants each again. Their Events are kept and go out with them."""
        if term is not None:
            self.term = term
        return self._take_over(self.owns)

    def gained(self, slots: frozenset[int]) -> list[ObjectKey]:
        """This shard writes these slots from now on (sharding): the objects it owes there,
        as `take_over` returns them."""
        if not self.leading:
            return []
        return self._take_over(lambda slot: slot in slots)

    def gave_up(self, slots: frozenset[int]) -> None:
        """Nothing more is sent for these slots (the caller has stopped owning them): their
        pending desires become debts, kept for whoever takes the slot over; a write already
        in flight ends on its own (its preconditions and term fence it: ADR 0011)."""
        for key, d in list(self._pending.items()):
            if d.slot is not None and d.slot in slots:
                del self._pending[key]
                self._owe(d)
        self._update_idle()

    def _take_over(self, which: Callable[[int | None], bool]) -> list[ObjectKey]:
        owed: list[ObjectKey] = []
        for key, debt in list(self._owed.items()):
            if not which(debt.slot):
                continue
            settled = debt.settled_by(self.held.get(key))
            if settled and not debt.events:
                continue
            owed.append(key)
            if debt.events:  # they go out with the desire the controller builds again
                self._pending[key] = Desired(*key, events=debt.events, priority=debt.priority,
                                             slot=debt.slot)  # fmt: skip
                self._enqueue(key, debt.priority)
        for key in [k for k, debt in self._owed.items() if which(debt.slot)]:
            del self._owed[key]  # owed again as a desire, or settled: nothing owed any more
        owed.sort(key=lambda k: self._pending[k].priority if k in self._pending else NORMAL)
        self._update_idle()
        return owed

    def writes(self, slot: int | None) -> bool:
        """Whether a verdict in `slot` would be sent by this replica now."""
        return self.leading and self.owns(slot)

    def stood_down(self) -> None:
        """No longer leading (its Leadership says so): nothing more is sent; what is wanted
        stays pending."""
        self._update_idle()

    def observed(self, plural: str, namespace: str, name: str,
                 status: Mapping[str, Any] | None, version: str,
                 labels: Mapping[str, str] | None = None) -> bool:  # fmt: skip
        """What a watch shows the API holds (None: deleted). Standing by, that is the
        leader's work: it becomes what is known and settles our debt for it. Leading, a
        status of our own term is our own write coming back (its version is already known);
        one of another term is not ours: counted, logged, taken as known, and True is
        returned so the controller says the object again (ADR 0011)."""
        key = (plural, namespace, name)
        if self.leading:
            if status is None or TERM not in status or status[TERM] == self.term:
                return False  # ours (a write, a delete), or a create before any status
            self.metrics.foreign_writes.labels(plural).inc()
            log.warning("a write that is not this leader's landed", resource=plural,
                        namespace=namespace, name=name, term=status[TERM], own_term=self.term,
                        resource_version=version)  # fmt: skip
            self.held[key] = Held(gist(status), version, label_gist(labels), says_dead(status))
            return True
        if status is None:
            self.held.pop(key, None)
        else:
            self.held[key] = Held(gist(status), version, label_gist(labels), says_dead(status))
        debt = self._owed.get(key)
        if debt is not None and debt.settled_by(self.held.get(key)):
            del self._owed[key]  # the leader wrote what we would have (its Events with it)
        return False

    def known(self, plural: str, namespace: str | None = None) -> list[ObjectKey]:
        """The objects of `plural` (in `namespace`; None: all) the API is known to hold."""
        return [
            key
            for key in self.held
            if key[0] == plural and (namespace is None or key[1] == namespace)
        ]

    @property
    def backlog(self) -> int:
        return len(self._pending) + len(self._inflight) + len(self._owed)

    async def idle(self) -> None:
        """Wait until everything wanted is written or given up (callers bound the wait)."""
        await self._idle.wait()

    # --- the workers ----------------------------------------------------------------------

    def _enqueue(self, key: ObjectKey, priority: int) -> None:
        self._idle.clear()
        if key in self._queued or key in self._inflight or key in self._backoff:
            return  # picked up when the current write or backoff ends
        if not self.leading:
            return  # kept pending; `take_over` queues it
        self._queued.add(key)
        self._queue.put_nowait((priority, next(self._seq), key))

    def _update_idle(self) -> None:
        if not self._inflight and not self._backoff and (not self._pending or not self.leading):
            self._idle.set()

    async def work(self) -> None:
        """One worker: takes objects off the queue and writes them, for ever (the operator
        runs several, supervised)."""
        while True:
            await self.leadership.wait()
            _, _, key = await self._queue.get()
            self._queued.discard(key)
            d = self._pending.pop(key, None)
            if d is None:
                self._update_idle()
                continue
            if not self.leading or not self.may_write():
                self._pending[key] = d  # fenced between want and now: kept for a later term
                # the elector's own timer says the same at this deadline
                self.leadership.standby("may no longer write: stopped writing")
                continue
            if not self.owns(d.slot):  # given up between want and now: owed, not sent
                self._owe(d)
                self._update_idle()
                continue
            if self._nothing_to_do(d):
                self._update_idle()  # written meanwhile
                continue
            self._inflight.add(key)
            try:
                await self._write(d)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(d, exc)
            finally:
                self._inflight.discard(key)
                if key in self._pending and key not in self._backoff:
                    self._enqueue(key, self._pending[key].priority)
                self._update_idle()

    def _failed(self, d: Desired, exc: Exception) -> None:
        code = label(exc)
        where = {"resource": d.plural, "namespace": d.namespace, "name": d.name}
        key = d.key
        newer = self._pending.get(key)
        if isinstance(exc, Fenced):
            self._pending[key] = d.merged_into(newer) if newer else d
            self.leadership.standby("write held back: no longer provably the leader")
            return
        if not retryable(exc):
            # the same status would be refused again: remember it, say so once; a bug of ours
            # (not the API's refusal) likewise, with its traceback: never retried for ever
            self.metrics.writes_refused.labels(d.plural, code).inc()
            if d.status is not None:
                self._refused[key] = d.gist
            if isinstance(exc, KubeError):
                log.error("write refused; not sent again until it changes", **where,
                          code=code, error=describe(exc)[:300])  # fmt: skip
            else:
                log.error("write failed on a bug; not sent again until it changes", **where,
                          code=code, exc_info=exc)  # fmt: skip
            return
        delay = backoff.delay(backoff.WRITE, d.attempt + 1)
        d.attempt += 1
        self.metrics.write_retries.labels(d.plural).inc()
        report = log.error if code == "403" else log.warning  # forbidden: usually RBAC
        report("write failed, will retry", **where, code=code, error=describe(exc)[:200],
               retry_in=delay)  # fmt: skip
        self._pending[key] = d.merged_into(newer) if newer else d
        self._backoff.add(key)

        def again() -> None:
            self._backoff.discard(key)
            if key in self._pending:
                self._enqueue(key, self._pending[key].priority)
            self._update_idle()

        schedule = self._schedule or asyncio.get_running_loop().call_later
        schedule(delay, again)

    # --- the writes -----------------------------------------------------------------------

    def _check(self, slot: int | None = None) -> None:
        """Right before anything is sent (the API client checks again in its own call)."""
        if not self.leading or not self.may_write():
            raise Fenced("not sent: no longer provably the leader")
        if not self.owns(slot):
            raise Fenced(f"not sent: slot {slot} is no longer this shard's")

    async def _call(self, operation: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            result = await fn(*args)
        except Exception as exc:
            self.metrics.api_errors.labels(operation, label(exc)).inc()
            raise
        self.metrics.api_writes.labels(operation).inc()
        return result

    async def _write(self, d: Desired) -> None:
        held = self.held.get(d.key)
        says = d.says and not d.held_by(held)
        if d.delete is not None:
            await self._post_all(d)
            await self._delete(d, d.delete)
        elif says and d.events and held is not None:
            # the verdict and its Events at once: saying "dead" costs one round trip
            results = await asyncio.gather(
                self._write_status(d), self._post_all(d), return_exceptions=True
            )
            for result in results:
                if isinstance(result, BaseException):
                    raise result
        else:
            await self._post_all(d)  # before a verdict that must still be created
            if says:
                await self._write_status(d)

    async def _post_all(self, d: Desired) -> None:
        failure: BaseException | None = None
        for event in list(d.events):
            try:
                self._check(d.slot)
                await self._call(
                    "create_event", self.api.create_event, event.namespace,
                    event.document(self.clock(), self.instance),
                )  # fmt: skip
            except Exception as exc:
                if not (isinstance(exc, ApiError) and exc.conflict):  # 409: posted before, once
                    failure = failure or exc
                    continue
            d.events.remove(event)  # posted: a retry of the rest must not repeat it
        if failure is not None:
            raise failure

    async def _read(self, d: Desired) -> tuple[Held, Mapping[str, Any]] | None:
        """What the API holds now (None: the object does not exist)."""
        current = await self._call(
            f"read_{NOUNS[d.plural]}_status", self.api.read_status, d.plural, d.namespace, d.name
        )
        if current is None:
            self.held.pop(d.key, None)
            return None
        status, version, labels = current
        held = self.held[d.key] = Held(gist(status), version, label_gist(labels), says_dead(status))
        return held, status

    async def _write_status(self, d: Desired) -> None:
        """The status, then the written labels (a verdict's origin): two writes, each with
        the version it was computed against; the status first, because it is the verdict."""
        assert d.status is not None  # noqa: S101 - called only for a status
        key, noun = d.key, NOUNS[d.plural]
        if d.apply_as is not None:
            self._check(d.slot)
            version = await self._call(f"apply_{noun}_status", self.api.apply_status, d.plural,
                                       d.namespace, d.name, d.status, d.apply_as)  # fmt: skip
            self.held[key] = Held(d.gist, version)
            return
        for attempt in range(4):  # created, conflicted or vanished meanwhile: try again, bounded
            held = self.held.get(key)
            if held is None and attempt == 0 and d.create is None:
                read = await self._read(d)  # never seen: its version first, never a blind write
                held = read[0] if read else None
            if held is None:
                if d.create is None:
                    return  # a DeathWatch that is gone: nothing to report on
                self._check(d.slot)
                try:
                    version = await self._call(
                        f"create_{noun}", self.api.create, d.plural, d.namespace, d.create
                    )
                except Exception as exc:
                    if not (isinstance(exc, ApiError) and exc.conflict):
                        raise
                    await self._read(d)  # exists after all: write on what it holds
                    continue
                created = label_gist(d.create.get("metadata", {}).get("labels"))
                held = self.held[key] = Held(EMPTY, version, created)
            if held.gist != d.gist:
                self._check(d.slot)
                sent = time.monotonic()
                try:
                    version = await self._call(
                        f"replace_{noun}_status", self.api.replace_status, d.plural,
                        d.namespace, d.name, {**d.status, TERM: self.term}, held.version,
                    )  # fmt: skip
                except Exception as exc:
                    if await self._conflicted(d, exc):
                        continue
                    raise
                was_dead = held.dead
                held = self.held[key] = Held(d.gist, version, held.labels, says_dead(d.status))
                self._written(d, was_dead, sent)
            if d.labels is not None and held.labels != d.label_gist:
                self._check(d.slot)
                try:
                    version = await self._call(
                        f"label_{noun}", self.api.patch_labels, d.plural, d.namespace, d.name,
                        d.labels, held.version,
                    )  # fmt: skip
                except Exception as exc:
                    if await self._conflicted(d, exc):
                        continue
                    raise
                wanted = d.label_gist if d.label_gist is not None else NO_LABELS
                self.held[key] = Held(held.gist, version, wanted, held.dead)
            return
        raise Contended(f"{d.plural} {d.namespace}/{d.name}: changed under every try")

    async def _conflicted(self, d: Desired, exc: Exception) -> bool:
        """A write refused because the object moved: True when it is worth another try."""
        if not isinstance(exc, ApiError):
            return False
        if exc.conflict:  # written meanwhile (another term): re-read, re-compare
            await self._read(d)
            return True
        if exc.not_found:  # deleted behind our back: create it again, or drop it
            self.held.pop(d.key, None)
            return True
        return False

    def _written(self, d: Desired, was_dead: bool, sent: float) -> None:
        """A status written: a verdict's latency observed the once the API first holds it
        Dead (not again when a Dead verdict is written again: its pod's deletion time, a
        takeover's rewrite), and said with its share of the path (the benches read it)."""
        if not was_dead and d.ready_drop_at is not None and says_dead(d.status):
            latency = (self.clock() - d.ready_drop_at).total_seconds()
            self.metrics.verdict_latency.observe(max(0.0, latency))
            if d.received is not None:
                now = time.monotonic()
                self.metrics.processing_latency.observe(now - d.received)
                log.info("dead verdict written", namespace=d.namespace, name=d.name,
                         received_ms=round((now - d.received) * 1e3, 1),
                         queued_ms=round((sent - d.received) * 1e3, 1),
                         write_ms=round((now - sent) * 1e3, 1))  # fmt: skip

    async def _delete(self, d: Desired, uid: str) -> None:
        """Delete the verdict while it still is `uid`'s (a newer pod of the same name keeps
        its own), with the version it is known at as the precondition."""
        for attempt in range(3):
            held = self.held.get(d.key) if attempt == 0 else None
            if held is None:
                read = await self._read(d)
                if read is None:
                    return  # gone already
                held, status = read
                if status.get("podUID") not in (None, uid):
                    return  # a newer pod's verdict: it stays
            self._check(d.slot)
            try:
                await self._call(
                    "delete_verdict", self.api.delete, d.plural, d.namespace, d.name, held.version
                )
            except ApiError as exc:
                if exc.conflict:
                    continue  # changed meanwhile: look again at whose it is
                if not exc.not_found:
                    raise
            self.held.pop(d.key, None)
            return
        raise Contended(f"{d.plural} {d.namespace}/{d.name}: changed under every delete")
