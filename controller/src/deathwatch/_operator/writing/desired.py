"""What the controller wants of one object, as the writer takes it: a finished status (and
the object to create), or a deletion, with the Events to post; its priority in the queue.
Later desires for the same object merge into it (`merged_into`): the latest wins."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from deathwatch._operator.reporting.pod_events import KubeEvent
from deathwatch._operator.writing.status_writes import Held, gist, label_gist

URGENT, NORMAL, LOW = 0, 1, 2  # a desire's priority: Dead verdicts first
ObjectKey = tuple[str, str, str]  # (plural, namespace, name)


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
