"""The Lease's record: as this replica last saw it, timed on its own clock, and as it writes it.
The elector (leader.py) decides when; this holds what the record says and what it will say."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


class SeenLease:
    """The Lease as last read, written or watched, and when its record last changed on our
    monotonic clock: a holder is timed from its renewals as we saw them, never from anyone's
    wall clock."""

    def __init__(self, clock: Callable[[], float], default_duration: float) -> None:
        self.clock = clock
        self.default_duration = default_duration
        self.spec: Mapping[str, Any] | None = None  # the lease spec as last seen
        self.version: str | None = None  # ... and its resourceVersion
        self.at = float("-inf")  # when we saw it change, on our clock
        self.holder: str | None = None

    def observe(self, lease: Mapping[str, Any] | None) -> None:
        """Its record changed if its resourceVersion did (every write changes it; no comparing
        timestamps that two sources format differently); `at` is when we first saw this
        version."""
        version = None if lease is None else (lease.get("metadata") or {}).get("resourceVersion")
        if lease is None or version != self.version:
            self.spec = None if lease is None else dict(lease.get("spec") or {})
            self.version = version
            self.at = self.clock()
        self.holder = (self.spec or {}).get("holderIdentity") or None

    def duration(self) -> float:
        return float((self.spec or {}).get("leaseDurationSeconds") or self.default_duration)

    def held_by_another(self, identity: str) -> bool:
        """Someone else's, and alive as far as we can tell."""
        return self.holder not in (None, identity) and self.clock() < self.at + self.duration()

    def takeable_at(self, identity: str) -> float:
        """When, on our clock, the lease as last seen may be taken by `identity`."""
        if self.spec is None or self.holder in (None, identity):
            return float("-inf")
        return self.at + self.duration()


def first(identity: str, duration: float, now: str | None) -> dict[str, Any]:
    """The spec of a lease created: the first term, 0."""
    return {"holderIdentity": identity, "leaseDurationSeconds": int(duration),
            "acquireTime": now, "renewTime": now, "leaseTransitions": 0}  # fmt: skip


def holding(spec: Mapping[str, Any], identity: str, duration: float, now: str | None,
            *, renewing: bool) -> dict[str, Any]:  # fmt: skip
    """The spec that takes or renews the lease. A renewal continues the term; anything else
    (taking it over, or taking back a lease still in our name after we stopped writing, or
    after a restart) starts one: leaseTransitions is the term."""
    transitions = int(spec.get("leaseTransitions") or 0) + (0 if renewing else 1)
    return {
        "holderIdentity": identity,
        "leaseDurationSeconds": int(duration),
        "acquireTime": spec.get("acquireTime") if renewing else now,
        "renewTime": now,
        "leaseTransitions": transitions,
    }


def released(spec: Mapping[str, Any], now: str | None) -> dict[str, Any]:
    """Holder cleared, duration 1 s: a standby takes over on its next try."""
    return {**spec, "holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": now}


def body(name: str, namespace: str, spec: dict[str, Any], *, lease: Mapping[str, Any] | None,
         claim: tuple[dict[str, str], dict[str, str]] | None,
         owner: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """The Lease written: its labels and annotations from `claim` (a shard's slots), owned by
    `owner` (the Deployment it is deleted with), preconditioned on the version read."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if claim is not None:
        meta["labels"], meta["annotations"] = claim
    if owner is not None:
        meta["ownerReferences"] = [owner]
    if lease is not None:
        meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": spec}  # fmt: skip
