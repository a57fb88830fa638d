"""Write reduction: what the API holds for each object, and whether a desired status changes
it. Pure data and one hash; the writer (writer.py) decides when to send.

A status is compared by its **gist**: one hash of its canonical JSON (sorted keys), without
the writer's term stamp (`term`, writer.py) and with the *values* of the times each replica
notes on its own masked (two replicas judging the same events agree on all but these, so a
new leader does not rewrite a verdict only to put its own times on it; a time that appears
or disappears still counts). It is computed once per desired status, when the desire is
made, and once per status a watch shows: nothing else hashes or dumps a status.

What the API holds is kept as `Held(gist, version)`: no status document per object (10,000
sandboxes must not cost 10,000 status dicts), just enough to tell "already written" and to
send the next write with its precondition.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

TERM: Final = "term"  # the status field the writer stamps: which term wrote it (ADR 0011)
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


class Held:
    """What the API holds for one object, as last written or seen: the gist of its status
    and its resourceVersion, the precondition of the next write."""

    __slots__ = ("gist", "version")

    def __init__(self, gist: int, version: str) -> None:
        self.gist = gist
        self.version = version

    def __repr__(self) -> str:
        return f"Held({self.gist}, {self.version!r})"
