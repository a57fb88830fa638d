"""Is each watch stream alive? Anything it delivers counts: events, and the BOOKMARKs the API
server sends on a quiet stream about once a minute (kopf asks for them).

kopf consumes bookmarks itself and has no public signal of a stream's liveness, so this
module wraps its private `watching.watch_objs` and notes the time of everything that comes
through. tests/test_streams.py fails if kopf moves that function; `install` then reports
False, /readyz says the stream state is unknown, and nothing else changes.

"Fresh" is "delivered something within `stale_after`" (default 90 s: longer than the API
server's bookmark interval, and than kopf's 70 s inactivity timeout after which it
reconnects a silent stream), not "a pod changed recently": a healthy controller serving an
idle namespace is fresh.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from deathwatch._operator.metrics import Metrics

log = structlog.get_logger("deathwatch.streams")

STALE_AFTER = 90.0


@dataclass
class StreamActivity:
    metrics: Metrics | None = None
    started: float = field(default_factory=time.monotonic)
    last: dict[str, float] = field(default_factory=dict)  # resource plural -> monotonic
    installed: bool = False

    def seen(self, resource: str) -> None:
        self.last[resource] = time.monotonic()
        if self.metrics is not None:
            self.metrics.watch_activity.labels(resource).set(time.time())

    def connecting(self, resource: str) -> None:
        """A watch request is being made: the first, one every server timeout (240 s), or a
        reconnection after a broken or silent stream (more of them than that is a fault)."""
        if self.metrics is not None:
            self.metrics.watch_connections.labels(resource).inc()

    def expired(self, resource: str) -> None:
        """The stream could not resume (410 Gone: its version was compacted away); kopf lists
        everything again. What was deleted meanwhile is found by the tracker's `vanished`."""
        log.warning("a watch could not resume (410 Gone): listing again", resource=resource)
        if self.metrics is not None:
            self.metrics.relists.labels(resource).inc()

    def age(self, resource: str) -> float:
        """Seconds since the stream last delivered anything (since start, if never)."""
        return time.monotonic() - self.last.get(resource, self.started)

    def fresh(self, resources: Iterable[str], stale_after: float = STALE_AFTER) -> bool | None:
        """None when the hook could not be installed: the state is unknown, not bad."""
        if not self.installed:
            return None
        return all(self.age(r) < stale_after for r in resources)


_HOOKED: list[StreamActivity] = []


def _expired(raw: Any) -> bool:
    if not isinstance(raw, dict) or raw.get("type") != "ERROR":
        return False
    status = raw.get("object")
    return isinstance(status, dict) and status.get("code") == 410


def install(activity: StreamActivity) -> bool:
    """Route kopf's watch streams past `activity` (once per process). True when in place."""
    try:
        from kopf._cogs.clients import watching
    except ImportError:
        log.warning("kopf's watching module moved: watch stream liveness is unknown")
        return False
    original = getattr(watching, "watch_objs", None)
    if original is None:
        log.warning("kopf has no watch_objs: watch stream liveness is unknown")
        return False
    _HOOKED[:] = [activity]
    if getattr(original, "_deathwatch_hook", False):
        activity.installed = True
        return True

    async def watch_objs(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        resource = kwargs.get("resource")
        plural = getattr(resource, "plural", "unknown")
        for hooked in _HOOKED:
            hooked.connecting(plural)
        async for raw in original(*args, **kwargs):
            for hooked in _HOOKED:
                hooked.seen(plural)
                if _expired(raw):
                    hooked.expired(plural)
            yield raw

    watch_objs._deathwatch_hook = True  # type: ignore[attr-defined]
    watching.watch_objs = watch_objs
    activity.installed = True
    return True
