"""Leader election on a coordination.k8s.io/v1 Lease: asyncio-native, every call with a
deadline, released on shutdown. client-go's algorithm with controller-runtime's defaults:

- `lease_duration` (15 s): a candidate takes over a lease whose record has not changed for
  this long, measured on its own monotonic clock from when it last saw the record change
  (no trust in anyone's wall clock);
- `renew_deadline` (10 s): a leader that has not renewed for this long, on its own monotonic
  clock, stops writing (`may_write()` is False from that instant, whatever its loop is doing)
  and stands by: it has stopped before anyone else can take over (15 s);
- `retry_period` (2 s): how often a candidate tries, and a leader renews;
- on shutdown the leader clears the holder and sets a 1 s duration: a standby takes over on its
  next try (within `retry_period`).

The kubernetes client's `leaderelection` package is synchronous (threads and sleeps), has no
per-call deadline of its own and does not release on cancel; see docs/adr/0011.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import structlog

from deathwatch._engine.timeutil import UTC, format_time
from deathwatch._kube.errors import ApiError, describe, label
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.leadership import lease_record
from deathwatch._operator.leadership.group import Leadership
from deathwatch._operator.leadership.lease_record import SeenLease
from deathwatch._operator.leadership.owner import LeaseOwner

log = structlog.get_logger("deathwatch.leader")

MIN_PAUSE = 0.05  # seconds between two tries, at the least


@dataclass(frozen=True)
class LeaseTimings:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "lease timings: need 0 < retry period < renew deadline < lease duration, got "
                f"{self.retry_period}s, {self.renew_deadline}s, {self.lease_duration}s"
            )


class LeaseApi(Protocol):
    """The three calls on the one Lease; `replace` must fail (409) if the resourceVersion in
    the body is no longer current. Each raises errors.ApiError on refusal, NoAnswer when no
    answer came."""

    async def get(self) -> dict[str, Any] | None: ...

    async def create(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def replace(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def watch(self, seen: Callable[[str, dict[str, Any] | None], None]) -> None:
        """Follow the Lease for a while (a minute): `seen(event type, lease)` on the event
        loop for its current state, then for every change; returns when the watch ends."""


class Elector:
    def __init__(
        self,
        api: LeaseApi,
        identity: str,
        name: str,
        namespace: str,
        metrics: Metrics,
        timings: LeaseTimings | None = None,
        *,
        leadership: Leadership,
        term_of: Callable[[int], int] = lambda term: term,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        claim: Callable[[], tuple[dict[str, str], dict[str, str]]] | None = None,
        owner: LeaseOwner | None = None,
        refusal: Callable[[], str | None] = lambda: None,
    ) -> None:
        """`claim()`: the labels and annotations written on the Lease with each acquisition
        and renewal (a shard's slots: slot_claims.py). `refusal()`: why this replica must not
        lead now (another release's controller serves its DeathWatches: rivals.py), asked
        before every acquisition and renewal. `leadership`: told of every transition,
        and fenced by `may_write`; `term_of(term)`: the term it is told (a shard's, unique
        across the shards' Leases)."""
        self.api = api
        self.claim = claim
        self.owner = owner  # the Deployment the Lease is deleted with (owner.py)
        self.refusal = refusal
        self._refused: str | None = None  # the refusal as last said
        self.identity = identity
        self.name, self.namespace = name, namespace
        self.metrics = metrics
        self.timings = timings or LeaseTimings()
        self.leadership = leadership
        self.leadership.fenced_by(self.may_write)
        self.term_of = term_of
        self.clock, self.wall = clock, wall
        self.is_leader = False
        self.transitions = 0
        # This replica's term: the Lease's leaseTransitions when it last took the lease. Every
        # acquisition by this process (not a renewal) starts a new term, so no two spells of
        # writing share one; the writer stamps each status with it (writer.py, ADR 0011).
        self.term = 0
        self._renewed_at = float("-inf")  # monotonic: the last successful acquire or renew
        self.seen_lease = SeenLease(clock, self.timings.lease_duration)
        self._wake = asyncio.Event()  # the watch saw the lease change
        self._orphaned = False  # the Lease is gone, and so is its owner: never made again
        metrics.leader.labels(identity).set(0)

    @property
    def leader(self) -> str | None:
        """The holder as last observed."""
        return self.seen_lease.holder

    def may_write(self) -> bool:
        """Leader, and provably so: renewed within the renew deadline, on our own clock."""
        return self.is_leader and self.clock() < self._renewed_at + self.timings.renew_deadline

    # --- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        """Try to acquire or renew every retry period, forever (supervised)."""
        while True:
            # the renewal counts from when it was sent: the API server may have applied it
            # at any moment after that, and others time the lease from when they saw it
            sent = self.clock()
            failed = False
            try:
                holds = await asyncio.wait_for(self._try(), self.timings.renew_deadline / 2)
            except Exception as exc:  # the API: counted, logged, and just not renewed
                self.metrics.api_errors.labels("lease", label(exc)).inc()
                log.warning("lease not renewed", error=describe(exc)[:200], leader=self.is_leader)
                holds, failed = False, True
            now = self.clock()
            if holds:
                self._renewed_at = sent
                if not self.is_leader:
                    self._set(True, "acquired the lease")
                # stop at the deadline itself, even if this loop is stuck in a call by then
                deadline = sent + self.timings.renew_deadline - now
                asyncio.get_running_loop().call_later(deadline, self._fence_if_overdue)
            elif self.is_leader and self.leader not in (None, self.identity):
                self._set(False, f"the lease is held by {self.leader}: stopped writing")
            elif self.is_leader and now >= self._renewed_at + self.timings.renew_deadline:
                self._set(False, "renew deadline passed: stopped writing")
            await self._pause(failed)

    async def _pause(self, failed: bool) -> None:
        """Until the next try. A leader renews every retry period. A standby tries again
        after a retry period, or sooner, the moment the lease can be taken: released or
        deleted (seen on the watch), or expired on its own clock (timed from when the watch
        showed the holder's last renewal, not from our next poll)."""
        if self.is_leader or failed or self._orphaned or self._refused is not None:
            await asyncio.sleep(self.timings.retry_period)
            return
        until = self.clock() + self.timings.retry_period
        waited = False
        while True:
            self._wake.clear()
            wait = min(until, self.seen_lease.takeable_at(self.identity)) - self.clock()
            if wait <= 0:
                break
            waited = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)
        if not waited:  # takeable already, yet the last try did not take it: never a busy loop
            await asyncio.sleep(MIN_PAUSE)

    async def watch(self) -> None:
        """Follow the Lease as it changes (supervised, alongside `run`): a standby sees a
        release at once, and times the holder from its actual renewals. Without the watch
        (it fails, or RBAC lacks it) the elector still works, polling every retry period."""
        while True:
            try:
                await self.api.watch(self.seen)
            except Exception as exc:
                self.metrics.api_errors.labels("lease_watch", label(exc)).inc()
                log.warning("lease watch failed; polling every retry period until it is back",
                            error=describe(exc)[:200])  # fmt: skip
                await asyncio.sleep(self.timings.retry_period)

    def seen(self, event_type: str, lease: Mapping[str, Any] | None) -> None:
        """A watch event: what the Lease is now."""
        self.seen_lease.observe(None if event_type == "DELETED" else lease)
        if self.is_leader and self.leader not in (None, self.identity):
            self._set(False, f"the lease is held by {self.leader}: stopped writing")
        elif self.is_leader and event_type == "DELETED":
            # its Deployment's deletion (owner.py) or a person's: it stops at once, not at its
            # renew deadline, since nothing claims its slots any more
            self._set(False, "the lease was deleted: stopped writing")
        self._wake.set()

    def _fence_if_overdue(self) -> None:
        if self.is_leader and not self.may_write():
            self._set(False, "renew deadline passed: stopped writing")

    def _set(self, leading: bool, why: str) -> None:
        self.is_leader = leading
        if leading:
            self.transitions += 1
            self.leadership.lead(self.term_of(self.term), f"{why} {self.namespace}/{self.name}")
        else:
            self.leadership.standby(f"{why} ({self.namespace}/{self.name})")

    async def _try(self) -> bool:
        """One attempt: True if we hold the lease afterwards (acquired or renewed)."""
        refused = self.refusal()
        if refused != self._refused:
            self._refused = refused
            if refused is not None:
                log.error("not leading", why=refused)
            else:
                log.info("no longer refused: taking part in the election again")
        if refused is not None:
            if self.is_leader:  # it stops at once: never two writers of one verdict
                self._set(False, f"refused: {refused}")
            return False
        lease = await self.api.get()
        now = format_time(self.wall())
        self.seen_lease.observe(lease)
        if lease is None:
            if self.is_leader:  # deleted under us: whatever comes next is a new term
                self._set(False, "the lease was deleted: stopped writing")
            if self.owner is not None and not await self.owner.present():
                if not self._orphaned:
                    log.warning("the lease's owner is gone: not creating the lease again",
                                owner=self.owner.status())  # fmt: skip
                self._orphaned = True  # tried again every retry period, said once
                return False
            self._orphaned = False
            first = lease_record.first(self.identity, self.timings.lease_duration, now)
            return await self._write(None, first)
        if self.seen_lease.held_by_another(self.identity):
            return False
        renewing = self.seen_lease.holder == self.identity and self.is_leader
        spec = lease.get("spec") or {}
        return await self._write(lease, lease_record.holding(
            spec, self.identity, self.timings.lease_duration, now, renewing=renewing))  # fmt: skip

    async def _write(self, lease: Mapping[str, Any] | None, spec: dict[str, Any]) -> bool:
        """Create the lease (`lease` None) or replace the one read; False if someone else
        wrote it first. The term is the record's leaseTransitions from then on."""
        try:
            if lease is None:
                written = await self.api.create(self._body(None, spec))
            else:
                written = await self.api.replace(self._body(lease, spec))
        except Exception as exc:
            if isinstance(exc, ApiError) and exc.conflict:
                return False
            raise
        self.seen_lease.observe(written)
        self.term = int(spec["leaseTransitions"])
        return True

    def _body(self, lease: Mapping[str, Any] | None, spec: dict[str, Any]) -> dict[str, Any]:
        claim = None if self.claim is None else self.claim()
        reference = None if self.owner is None else self.owner.reference
        return lease_record.body(self.name, self.namespace, spec, lease=lease, claim=claim,
                                 owner=reference)  # fmt: skip

    async def release(self, tries: int = 3) -> None:
        """Give the lease up (shutdown, once the election loop has ended): holder cleared,
        duration 1 s, so a standby takes over on its next try. Only while still ours; a
        conflict (a renewal of ours that landed late) is read again and retried; other errors
        are logged, never raised."""
        if not self.is_leader:
            return
        self._set(False, "releasing the lease")
        bound = self.timings.renew_deadline / 2
        for attempt in range(1, tries + 1):
            try:
                lease = await asyncio.wait_for(self.api.get(), bound)
                holder = None if lease is None else (lease.get("spec") or {}).get("holderIdentity")
                if lease is None or holder != self.identity:
                    return
                spec = lease_record.released(lease["spec"], format_time(self.wall()))
                await asyncio.wait_for(self.api.replace(self._body(lease, spec)), bound)
            except Exception as exc:
                if isinstance(exc, ApiError) and exc.conflict and attempt < tries:
                    continue  # written meanwhile: read it again
                self.metrics.api_errors.labels("lease_release", label(exc)).inc()
                log.warning("lease not released; a standby takes over when it expires",
                            error=describe(exc)[:200], attempt=attempt)  # fmt: skip
                return
            else:
                log.info("lease released", lease=f"{self.namespace}/{self.name}")
                return

    def status(self) -> dict[str, Any]:
        return {
            "identity": self.identity,
            "leader": self.leader,
            "is_leader": self.is_leader,
            "may_write": self.may_write(),
            "term": self.term,
            "lease": f"{self.namespace}/{self.name}",
            **({"owner": self.owner.status()} if self.owner is not None else {}),
            "seconds_since_renew": None
            if self._renewed_at == float("-inf")
            else round(self.clock() - self._renewed_at, 1),
        }
