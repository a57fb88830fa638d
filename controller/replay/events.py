"""Watch events from recorded JSON values: `{"type", "object"}` events, bare Pods, Lists."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
_POD_EVENTS = ("ADDED", "MODIFIED", "DELETED")


@dataclass(frozen=True, slots=True)
class PodEvent:
    index: int
    type: EventType
    object: object  # the Pod dict, still unvalidated


@dataclass(frozen=True, slots=True)
class Skipped:
    index: int
    reason: str


def interpret(index: int, value: object) -> Iterator[PodEvent | Skipped]:
    """One recorded value as zero or more pod events (a List holds several)."""
    if not isinstance(value, Mapping):
        yield Skipped(index, f"not an object but {type(value).__name__}")
        return
    event_type = value.get("type")
    if event_type is not None and "object" in value:
        if event_type in _POD_EVENTS:
            yield PodEvent(index, event_type, value["object"])
        elif event_type == "BOOKMARK":
            return  # progress marker only: nothing about any pod
        elif event_type == "ERROR":
            obj = value["object"]
            message = obj.get("message") if isinstance(obj, Mapping) else None
            yield Skipped(index, f"watch ERROR event: {message or obj!r}"[:200])
        else:
            yield Skipped(index, f"unknown event type {event_type!r}"[:200])
        return
    kind = value.get("kind")
    if kind == "Pod":
        yield PodEvent(index, "MODIFIED", value)
    elif kind in ("List", "PodList") and isinstance(value.get("items"), list):
        for item in value["items"]:
            yield PodEvent(index, "MODIFIED", item)
    else:
        yield Skipped(index, f"neither a watch event nor a Pod (kind {kind!r})"[:200])
