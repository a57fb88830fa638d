"""Garbage-collector pauses: kept off the verdict path, and made visible.

CPython's cyclic collector stops the event loop while it scans; a full (oldest-generation)
collection scans every tracked container object, and with 10,000 tracked sandboxes that took
~500 ms, long enough to be the slowest verdicts of a run (issue #13's measurements). Two
things keep it away:

- `freeze()` after each pod listing: everything alive then (kopf's and our per-pod state, the
  imported modules) moves to the permanent generation, which no collection scans. Objects
  made later are collected as usual; a frozen object that dies is still freed by reference
  counting. A collection runs just before each freeze so no garbage cycle is frozen with it.
- a larger youngest-generation threshold: fewer, still short, young collections.

`install()` times every collection (gc.callbacks): deathwatch_gc_pause_seconds{generation}
and, for a pause longer than PAUSE_LOG, one log line, so a latency spike can be matched
against the collector instead of guessed at.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import structlog

from deathwatch._operator.instruments.metrics import Metrics

log = structlog.get_logger("deathwatch.gc")

PAUSE_LOG = 0.05  # seconds: a pause this long is logged
THRESHOLDS = (10_000, 20, 20)  # CPython's default is (700, 10, 10)


class PauseLog:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.started = 0.0
        self.longest = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        pause = time.perf_counter() - self.started
        generation = str(info.get("generation"))
        self.metrics.gc_pauses.labels(generation).observe(pause)
        self.longest = max(self.longest, pause)
        if pause >= PAUSE_LOG:
            log.warning(
                "gc pause",
                generation=info.get("generation"),
                seconds=round(pause, 4),
                collected=info.get("collected"),
                frozen=gc.get_freeze_count(),
            )


def install(metrics: Metrics) -> PauseLog:
    gc.set_threshold(*THRESHOLDS)
    pauses = PauseLog(metrics)
    gc.callbacks.append(pauses)
    return pauses


def uninstall(pauses: PauseLog) -> None:
    if pauses in gc.callbacks:
        gc.callbacks.remove(pauses)


def freeze(reason: str) -> None:
    """Collect once, then move every surviving object out of the collector's reach."""
    started = time.perf_counter()
    collected = gc.collect()
    gc.freeze()
    log.info(
        "gc frozen",
        reason=reason,
        frozen=gc.get_freeze_count(),
        collected=collected,
        seconds=round(time.perf_counter() - started, 3),
    )
