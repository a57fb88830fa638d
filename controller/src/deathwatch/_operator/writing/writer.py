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

In parts: what is wanted (desired.py), the leader's queue of it (queue.py), the standby's
debts (debts.py), and the write of one object (object_writes.py); this module decides which
goes where, and runs the workers.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

import structlog

from deathwatch._api.resources import NOUNS, SV_PLURAL
from deathwatch._engine.timeutil import UTC
from deathwatch._kube import backoff
from deathwatch._kube.errors import KubeError, describe, label, retryable
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.leadership.group import Leadership
from deathwatch._operator.reporting.pod_events import KubeEvent
from deathwatch._operator.writing.debts import Debts
from deathwatch._operator.writing.desired import LOW, NORMAL, Desired, ObjectKey
from deathwatch._operator.writing.kube import Fenced
from deathwatch._operator.writing.object_writes import ObjectWrites, WriteApi
from deathwatch._operator.writing.queue import Schedule, WriteQueue
from deathwatch._operator.writing.status_writes import TERM, Held, gist, label_gist, says_dead

log = structlog.get_logger("deathwatch.writer")


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
    ) -> None:
        """`leadership`: whether this replica writes, and which slots (`writes(slot)`: a
        slot this shard does not hold is owed, as a standby owes), the process's one
        (process/app.py)."""
        self.metrics = metrics
        self.leadership = leadership
        self.term = term  # stamped on every status this writer sends (leader.py)
        self.held: dict[ObjectKey, Held] = {}  # what the API holds, as last written or seen
        self.queue = WriteQueue(lambda: self.leading, schedule)
        self.debts = Debts()  # the standby's, until the leader writes it
        self._refused: dict[ObjectKey, int] = {}  # the gist the API refused (4xx): not sent again
        self.objects = ObjectWrites(
            api, metrics, self.held, check=self._check, term=lambda: self.term, clock=clock,
            instance=os.environ.get("HOSTNAME", "deathwatch"),
        )  # fmt: skip
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
        self.debts.drop(key)
        self._refused.pop(key, None)

    def want(self, d: Desired) -> None:
        key = d.key
        if key not in self.queue.pending and self._nothing_to_do(d):
            self.debts.drop(key)
            return
        if self._refused.get(key) == d.gist and not d.events and d.delete is None:
            return  # the API refused exactly this already: counted and logged once
        if not self.leadership.writes(d.slot):
            self.debts.owe(d)  # a standby's desire, or one for a slot this shard does not own
            return
        self.queue.want(d)

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
        return self._take_over(self.leadership.writes)

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
        for d in self.queue.give_up(lambda slot: slot in slots):
            self.debts.owe(d)

    def _take_over(self, which: Callable[[int | None], bool]) -> list[ObjectKey]:
        owed: list[ObjectKey] = []
        for key, debt in self.debts.take(which, self.held):
            owed.append(key)
            if debt.events:  # they go out with the desire the controller builds again
                self.queue.put(Desired(*key, events=debt.events, priority=debt.priority,
                                       slot=debt.slot))  # fmt: skip
        pending = self.queue.pending
        owed.sort(key=lambda k: pending[k].priority if k in pending else NORMAL)
        self.queue.update_idle()
        return owed

    def stood_down(self) -> None:
        """No longer leading (its Leadership says so): nothing more is sent; what is wanted
        stays pending."""
        self.queue.update_idle()

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
        self.debts.settle(key, self.held.get(key))
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
        return len(self.queue) + len(self.debts)

    async def idle(self) -> None:
        """Wait until everything wanted is written or given up (callers bound the wait)."""
        await self.queue.idle()

    # --- the workers ----------------------------------------------------------------------

    async def work(self) -> None:
        """One worker: takes objects off the queue and writes them, for ever (the operator
        runs several, supervised)."""
        while True:
            await self.leadership.wait()
            d = await self.queue.take()
            if d is None:
                continue
            if not self.leading or not self.may_write():
                self.queue.keep(d)  # fenced between want and now: kept for a later term
                # the elector's own timer says the same at this deadline
                self.leadership.standby("may no longer write: stopped writing")
                continue
            if not self.leadership.writes(d.slot):  # given up meanwhile: owed, not sent
                self.debts.owe(d)
                self.queue.update_idle()
                continue
            if self._nothing_to_do(d):
                self.queue.update_idle()  # written meanwhile
                continue
            self.queue.inflight.add(d.key)
            try:
                await self.objects.write(d)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(d, exc)
            finally:
                self.queue.done(d.key)

    def _check(self, slot: int | None = None) -> None:
        """Right before anything is sent (the API client checks again in its own call)."""
        if not self.leading or not self.may_write():
            raise Fenced("not sent: no longer provably the leader")
        if not self.leadership.writes(slot):
            raise Fenced(f"not sent: slot {slot} is no longer this shard's")

    def _failed(self, d: Desired, exc: Exception) -> None:
        code = label(exc)
        where = {"resource": d.plural, "namespace": d.namespace, "name": d.name}
        if isinstance(exc, Fenced):
            self.queue.keep(d)
            self.leadership.standby("write held back: no longer provably the leader")
            return
        if not retryable(exc):
            # the same status would be refused again: remember it, say so once; a bug of ours
            # (not the API's refusal) likewise, with its traceback: never retried for ever
            self.metrics.writes_refused.labels(d.plural, code).inc()
            if d.status is not None:
                self._refused[d.key] = d.gist
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
        self.queue.retry(d, delay)
