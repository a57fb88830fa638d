"""This shard's slots, acted on (slot_claims.py decides): what the leader of a shard owns, the
claim its elector writes on the shard's Lease at every renewal, and the loop that reads every
shard's Lease and gains or gives up slots (ADR 0025).

Giving a slot up fences first (the writer stops sending anything of it at once, its pending
writes become debts) and is said at the next renewal; a slot is gained only once no live Lease
claims it, and what this shard owes there is then said again (`republish`), as a new leader
does. One shard (the default) owns every slot while it leads, and the loop never runs.

Liveness of another shard's Lease is timed on our clock from when we saw its record change,
as the elector times its own (no trust in anyone's wall clock); a Lease first seen counts as
just renewed, which can only make us wait longer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog

from deathwatch._api.resources import LEASES
from deathwatch._api.rest import Rest
from deathwatch._kube.errors import describe, label
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.leadership.group import Leadership
from deathwatch._operator.shards.slot_claims import (
    ALL,
    LEASE_LABEL,
    Handover,
    SlotClaim,
    Spec,
    claim_annotations,
    handover,
    read_claim,
)
from deathwatch._operator.shards.slots import describe as slots_text

log = structlog.get_logger("deathwatch.shards")


@dataclass
class _Seen:
    version: str
    at: float  # monotonic: when this version was first seen
    duration: float


class Ownership:
    def __init__(
        self, spec: Spec, lease: str, namespace: str, metrics: Metrics, retry_period: float,
        leadership: Leadership, clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.spec, self.lease, self.namespace = spec, lease, namespace
        self.metrics, self.retry_period, self.clock = metrics, retry_period, clock
        self.owned: frozenset[int] = frozenset()
        self.leadership = leadership
        self.last: Handover | None = None
        self.claims: list[SlotClaim] = []
        self._seen: dict[str, _Seen] = {}
        # what the controller does with what changes (set by the app: the writer, republish)
        self.on_gain: Callable[[frozenset[int]], None] = lambda slots: None
        self.on_give_up: Callable[[frozenset[int]], None] = lambda slots: None
        metrics.shard_owned_slots.labels(str(spec.index)).set(0)

    def owns(self, slot: int | None) -> bool:
        """Whether this replica writes that slot's objects now (None: not a sandbox's)."""
        if slot is None:
            return self.leading
        return slot in self.owned

    def claim(self) -> tuple[dict[str, str], dict[str, str]]:
        """The labels and annotations of this shard's Lease, with each renewal."""
        return {LEASE_LABEL: "true"}, claim_annotations(self.spec, self.owned)

    @property
    def leading(self) -> bool:
        return self.leadership.leading

    def lead(self, term: int | None = None) -> None:
        """This replica took its shard's Lease (its Leadership says so): one shard owns
        everything at once; a shard of several gains what the next read of the Leases
        allows."""
        if not self.spec.sharded:
            self._set(ALL)

    def standby(self) -> None:
        self._set(frozenset())

    def _set(self, owned: frozenset[int]) -> None:
        self.owned = owned
        self.metrics.shard_owned_slots.labels(str(self.spec.index)).set(len(owned))

    # --- the loop (sharded only) ----------------------------------------------------------

    async def run(self, rest: Rest) -> None:
        """Every retry period: read the shards' Leases; while leading, gain and give up. A
        standby reads them too, so that it has timed every other Lease's renewals when it takes
        over: a Lease first seen counts as just renewed, and a new leader that first read them
        then would wait a whole lease duration for a slot a dead holder still names."""
        path = f"{LEASES}/namespaces/{self.namespace}/leases"
        while True:
            try:
                ours = {"labelSelector": f"{LEASE_LABEL}=true"}
                data = await rest.request("GET", path, params=ours)
            except Exception as exc:  # the API's: nothing gained or given up meanwhile
                self.metrics.api_errors.labels("shard_leases", label(exc)).inc()
                log.warning("shard Leases not read", error=describe(exc)[:200])
            else:
                self.step(msgspec.json.decode(data).get("items") or [])
            await asyncio.sleep(self.retry_period)

    def step(self, leases: Iterable[dict[str, Any]]) -> Handover | None:
        """One read of the Leases, acted on."""
        now = self.clock()
        claims = []
        for lease in leases:
            meta, spec = lease.get("metadata") or {}, lease.get("spec") or {}
            name, version = str(meta.get("name", "")), str(meta.get("resourceVersion", ""))
            seen = self._seen.get(name)
            if seen is None or seen.version != version:
                duration = float(spec.get("leaseDurationSeconds") or 15)
                seen = self._seen[name] = _Seen(version, now, duration)
            claim = read_claim(lease, now < seen.at + seen.duration)
            if claim is not None:
                claims.append(claim)
        self.claims = claims
        if not self.leading:
            return None
        decision = handover(self.spec, self.owned, claims, self.lease)
        previous, self.last = self.last, decision
        if decision.conflict and (previous is None or previous.conflict != decision.conflict):
            log.error("another shard count at the same epoch: a reshard needs a new epoch "
                      "(its contested slots are left alone)",
                      conflict=decision.conflict)  # fmt: skip
        if decision.give_up:
            self._set(self.owned - decision.give_up)  # fenced from this instant
            self.on_give_up(decision.give_up)
            log.info("slots given up to a newer shard", slots=slots_text(decision.give_up),
                     owned=slots_text(self.owned))  # fmt: skip
        if decision.gain:
            self._set(self.owned | decision.gain)
            self.on_gain(decision.gain)
            log.info("slots gained", slots=slots_text(decision.gain), owned=slots_text(self.owned))
        return decision

    def status(self) -> dict[str, Any]:
        d = self.last
        return {
            "shard": self.spec.index, "shards": self.spec.count, "epoch": self.spec.epoch,
            "assigned": slots_text(self.spec.slots), "owned": slots_text(self.owned),
            "waiting_for": {str(s): who for s, who in (d.waiting.items() if d else ())},
            "conflict": d.conflict if d else None,
        }  # fmt: skip
