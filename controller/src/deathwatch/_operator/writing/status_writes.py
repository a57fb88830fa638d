"""Write reduction: what the API holds for each object, and whether a desired status changes
it. Pure data and one hash; the writer (writer.py) decides when to send.

A status is compared by its **gist**: one hash of its canonical JSON (sorted keys), without
the writer's term stamp (`term`, writer.py) and with the *values* of the times each replica
notes on its own masked (two replicas judging the same events agree on all but these, so a
new leader does not rewrite a verdict only to put its own times on it; a time that appears
or disappears still counts). It is computed once per desired status, when the desire is
made, and once per status a watch shows: nothing else hashes or dumps a status.

What the API holds is kept as `Held(gist, version, labels)`: no status document per object
(10,000 sandboxes must not cost 10,000 status dicts), just enough to tell "already written"
and to send the next write with its precondition. The few labels the writer keeps up to date
after an object is created (`WRITTEN_LABELS`: a verdict's slot, which a verdict from before
sharding gains) are compared the same way, by one hash of their values. A verdict's origin
is no label: the CRD declares `status.origin`, `status.state` and `status.cause` selectable
fields, so selecting by them costs no write of its own after each death (#43).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

TERM: Final = "term"  # the status field the writer stamps: which term wrote it (ADR 0011)
# the labels the writer maintains on an object it created (sandbox_verdicts.verdict_labels)
WRITTEN_LABELS: Final = ("deathwatch.dev/slot",)
# When each replica noticed something: masked by value, kept by presence.
VOLATILE: Final = frozenset({"declaredAt", "podDeletedAt", "lastTransitionTime", "observedAt"})
_encode = msgspec.json.Encoder(order="sorted").encode


def _masked(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: (True if k in VOLATILE else _masked(v)) for k, v in value.items() if k != TERM}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return value


def gist(status: Mapping[str, Any] | None) -> int:
    """The one hash of a status that decides whether writing it would change anything."""
    return hash(_encode(_masked(status or {})))


EMPTY: Final = gist({})  # a SandboxVerdict just created: its status is yet to be written


def label_gist(labels: Mapping[str, str] | None) -> int:
    """The one hash of the written labels' values (absent ones included, as absent)."""
    labels = labels or {}
    return hash(tuple(labels.get(k) for k in WRITTEN_LABELS))


NO_LABELS: Final = label_gist(None)


class Held:
    """What the API holds for one object, as last written or seen: the gist of its status,
    its resourceVersion (the precondition of the next write), the gist of its written
    labels, and whether its status says Dead (a verdict's latency is measured once, when the
    API first holds it Dead, whichever replica wrote it)."""

    __slots__ = ("dead", "gist", "labels", "version")

    def __init__(self, gist: int, version: str, labels: int = NO_LABELS,
                 dead: bool = False) -> None:  # fmt: skip
        self.gist = gist
        self.version = version
        self.labels = labels
        self.dead = dead

    def __repr__(self) -> str:
        return f"Held({self.gist}, {self.version!r}, {self.labels}, dead={self.dead})"


def says_dead(status: Mapping[str, Any] | None) -> bool:
    return status is not None and status.get("state") == "Dead"
