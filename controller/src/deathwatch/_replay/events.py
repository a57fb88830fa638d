"""Watch events from recorded JSON values: `{"type", "object"}` events, bare Pods, Lists.

Values arrive either typed (`raw.WatchValue`, the fast path) or as plain Python data (a value
whose shape the typed decoder rejected, or one decoded by the fallback parser); both are
interpreted the same way, and odd pods are left for `podview` to name.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import msgspec

from deathwatch._engine import raw
from deathwatch._engine.nodeexit import NodeExit
from deathwatch._engine.podview import MalformedPod, PodView, read_pod, view_of
from deathwatch._replay.stream import RawValue

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
_POD_EVENTS = ("ADDED", "MODIFIED", "DELETED")
DECODER = msgspec.json.Decoder(raw.WatchValue)


@dataclass(frozen=True, slots=True)
class PodEvent:
    index: int
    type: EventType
    object: raw.Pod | Mapping[str, object]  # a typed Pod, or plain data still to be validated


@dataclass(frozen=True, slots=True)
class Skipped:
    index: int
    reason: str


def _typed(index: int, value: raw.WatchValue) -> Iterator[PodEvent | Skipped]:
    if value.type is not None:
        if value.type in _POD_EVENTS and value.object is not None:
            yield PodEvent(index, value.type, value.object)  # type: ignore[arg-type]
        elif value.type == "BOOKMARK":
            return
        else:
            yield Skipped(index, f"watch event of type {value.type!r} without a Pod")
        return
    if value.kind == "Pod":
        yield PodEvent(
            index, "MODIFIED", raw.Pod(value.kind, value.metadata, value.spec, value.status)
        )
    elif value.kind in ("List", "PodList") and value.items is not None:
        for item in value.items:
            yield PodEvent(index, "MODIFIED", item)
    else:
        yield Skipped(index, f"neither a watch event nor a Pod (kind {value.kind!r})")


def _plain(index: int, value: object) -> Iterator[PodEvent | Skipped]:
    if not isinstance(value, Mapping):
        yield Skipped(index, f"not an object but {type(value).__name__}")
        return
    event_type = value.get("type")
    if event_type is not None and "object" in value:
        obj = value["object"]
        if event_type in _POD_EVENTS:
            if isinstance(obj, Mapping):
                yield PodEvent(index, event_type, obj)
            else:
                yield Skipped(index, f"object: expected a Pod object, got {type(obj).__name__}")
        elif event_type == "BOOKMARK":
            return
        elif event_type == "ERROR":
            message = obj.get("message") if isinstance(obj, Mapping) else obj
            yield Skipped(index, f"watch ERROR event: {message!r}"[:200])
        else:
            yield Skipped(index, f"unknown event type {event_type!r}"[:200])
        return
    kind = value.get("kind")
    if kind == "Pod":
        yield PodEvent(index, "MODIFIED", value)
    elif kind in ("List", "PodList") and isinstance(value.get("items"), list):
        for item in value["items"]:
            if isinstance(item, Mapping):
                yield PodEvent(index, "MODIFIED", item)
            else:
                yield Skipped(index, f"items: expected Pod objects, got {type(item).__name__}")
    else:
        yield Skipped(index, f"neither a watch event nor a Pod (kind {kind!r})"[:200])


def interpret(index: int, value: object) -> Iterator[PodEvent | Skipped]:
    """One recorded value as zero or more pod events (a List holds several)."""
    if isinstance(value, raw.WatchValue):
        if value.type == "ERROR":  # its object is a Status, not a Pod
            message = value.object.message if value.object is not None else None
            yield Skipped(index, f"watch ERROR event: {message!r}"[:200])
            return
        yield from _typed(index, value)
    else:
        yield from _plain(index, value)


class ViewEvent(msgspec.Struct, frozen=True, array_like=True, gc=False, tag=1, tag_field="kind"):
    """A pod event read and validated: what the replay engine consumes."""

    index: int
    type: str  # ADDED, MODIFIED, DELETED, or NODE_EXIT (`exit`, `pod` as read at it)
    pod: PodView
    exit: NodeExit | None = None


class SkippedEvent(msgspec.Struct, frozen=True, array_like=True, gc=False, tag=2, tag_field="kind"):
    index: int
    reason: str


NODE_EXIT = "NODE_EXIT"


def _exit(index: int, value: object) -> ViewEvent | SkippedEvent:
    """A recorded node exit: its exit and the pod as read at it."""
    try:
        typed = (
            value if isinstance(value, raw.WatchValue) else msgspec.convert(value, raw.WatchValue)
        )
    except msgspec.ValidationError as exc:
        return SkippedEvent(index, f"NODE_EXIT: {exc}"[:200])
    if typed.exit is None or typed.object is None:
        return SkippedEvent(index, "NODE_EXIT: needs `exit` and `object` (the pod as read)")
    try:
        pod = view_of(typed.object)
    except MalformedPod as exc:
        return SkippedEvent(index, str(exc))
    e = typed.exit
    return ViewEvent(index, NODE_EXIT, pod, NodeExit(e.id, e.code, e.oom, e.at, e.node))


def _type_of(value: object) -> object:
    if type(value) is raw.WatchValue:
        return value.type
    return value.get("type") if isinstance(value, Mapping) else None


def view_events(values: Iterable[RawValue]) -> Iterator[ViewEvent | SkippedEvent]:
    """Recorded values to validated pod views; everything odd becomes a SkippedEvent."""
    for value in values:
        typed = value.value
        if _type_of(typed) == NODE_EXIT:
            yield _exit(value.index, typed)
            continue
        if type(typed) is raw.WatchValue and typed.object is not None and typed.type in _POD_EVENTS:
            # the common case, straight through (a watch event of a Pod, typed)
            try:
                pod = view_of(typed.object)
            except MalformedPod as exc:
                yield SkippedEvent(value.index, str(exc))
            else:
                yield ViewEvent(value.index, typed.type, pod)
            continue
        for item in interpret(value.index, value.value):
            if isinstance(item, Skipped):
                yield SkippedEvent(item.index, item.reason)
                continue
            obj = item.object
            try:
                pod = view_of(obj) if isinstance(obj, raw.Pod) else read_pod(obj)
            except MalformedPod as exc:
                yield SkippedEvent(item.index, str(exc))
            else:
                yield ViewEvent(item.index, item.type, pod)
