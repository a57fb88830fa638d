"""The controller's work on the clock (each a supervised task): Suspects judged when their
window closes, not when the next event happens to come; and once a second the DeathWatch
statuses published, with the verdicts past their retention retired, the shields of nodes
whose firewall coverage went stale judged again, and the garbage collector's frozen set
renewed; and the API clients' connections a death uses kept warm (ADR 0034)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from datetime import datetime

import structlog

from deathwatch._api.rest import WARM_EVERY, Rest
from deathwatch._engine.timeutil import UTC
from deathwatch._kube.errors import describe, label
from deathwatch._operator.instruments import gcpauses
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.passes.pods import PodPass
from deathwatch._operator.passes.publishing import Liveness, StatusPass
from deathwatch._operator.passes.retention import RetentionPass
from deathwatch._operator.passes.shielding import ShieldPass

log = structlog.get_logger("deathwatch.controller")
REFREEZE_INTERVAL = 600.0  # seconds: sandboxes that arrived since the last freeze join it


async def suspects(pods: PodPass, wake: asyncio.Event) -> None:
    """Judge each Suspect when its window closes; sleep until the next one, or until a new
    deadline wakes the loop."""
    while True:
        wake.clear()
        pods.expire()
        deadline = pods.next_deadline()
        timeout = (
            None if deadline is None else max(0.0, (deadline - datetime.now(UTC)).total_seconds())
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout)


async def publishing(status: StatusPass, retention: RetentionPass, shielding: ShieldPass,
                     liveness: Liveness, interval: float,
                     retire_interval: float) -> None:  # fmt: skip
    last_retire = 0.0
    frozen_at = time.monotonic()
    while True:
        await asyncio.sleep(interval)
        if time.monotonic() - frozen_at > REFREEZE_INTERVAL:
            gcpauses.freeze("periodic")  # sandboxes that arrived since join the frozen
            frozen_at = time.monotonic()
        if time.monotonic() - last_retire > retire_interval:
            last_retire = time.monotonic()
            retention.retire()
        shielding.reshield()  # claims go stale with no event: judged on the clock
        status.publish(liveness)


async def warm(pools: Sequence[tuple[Rest, int]], metrics: Metrics,
               every: float = WARM_EVERY) -> None:  # fmt: skip
    """Each pool's connections a death uses at once, opened at start and kept open (rest.py):
    its pod read on the node exits' pool, its verdict and Event together on the writes'
    pool. A failure is counted and said once until a warm-up succeeds again (the API's
    reachability is /readyz's, not this)."""
    failing = False
    while True:
        results = await asyncio.gather(*(rest.warm(n) for rest, n in pools),
                                       return_exceptions=True)  # fmt: skip
        errors = [r for r in results if isinstance(r, Exception)]
        for error in errors:
            metrics.api_errors.labels("warm", label(error)).inc()
        if errors and not failing:
            log.warning("cannot keep the API connections warm: the next death may wait for a "
                        "handshake", error=describe(errors[0])[:300])  # fmt: skip
        elif failing and not errors:
            log.info("API connections warm again")
        failing = bool(errors)
        await asyncio.sleep(every)
