"""What a replica that does not write owes (a standby, or a shard for the slots it does not
own): per object, only a compact debt, the gist of what it would write and the Events it
would post. The leader's writes, as the watch shows them, settle debts (`settle`); taking
over, the debts still owed are taken out (`take`) and the controller builds each again."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from deathwatch._operator.reporting.pod_events import KubeEvent
from deathwatch._operator.writing.desired import Desired, ObjectKey
from deathwatch._operator.writing.status_writes import Held


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


class Debts:
    def __init__(self) -> None:
        self._owed: dict[ObjectKey, Debt] = {}

    def __len__(self) -> int:
        return len(self._owed)

    def owe(self, d: Desired) -> None:
        """`d` owed: merged with what was owed for its object (its Events added, none twice;
        the higher priority kept), the newest status's gist."""
        key = d.key
        debt = self._owed.get(key)
        events = d.events if debt is None else debt.events + [
            e for e in d.events if e not in debt.events
        ]  # fmt: skip
        priority = d.priority if debt is None else min(debt.priority, d.priority)
        self._owed[key] = Debt(d.gist, d.label_gist, d.delete, priority, events, d.slot)

    def drop(self, key: ObjectKey) -> None:
        """Nothing owed for it any more (the API holds it already, or it went)."""
        self._owed.pop(key, None)

    def settle(self, key: ObjectKey, held: Held | None) -> None:
        """The API holds `held` now: a debt it answers is paid (the leader wrote what this
        replica would have, its Events with it)."""
        debt = self._owed.get(key)
        if debt is not None and debt.settled_by(held):
            del self._owed[key]

    def take(
        self, which: Callable[[int | None], bool], held: Mapping[ObjectKey, Held]
    ) -> list[tuple[ObjectKey, Debt]]:
        """The debts of the slots `which` names, taken out: those the API does not hold yet,
        or with Events still to post (the rest were settled: nothing is owed for them)."""
        taken = [(key, debt) for key, debt in self._owed.items() if which(debt.slot)]
        for key, _ in taken:
            del self._owed[key]
        return [(k, debt) for k, debt in taken if debt.events or not debt.settled_by(held.get(k))]
