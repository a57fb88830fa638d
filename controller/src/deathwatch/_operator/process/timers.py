"""The controller's work on the clock (each a supervised task): Suspects judged when their
window closes, not when the next event happens to come; and once a second the DeathWatch
statuses published, with the verdicts past their retention retired, the shields of nodes
whose firewall coverage went stale judged again, and the garbage collector's frozen set
renewed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import datetime

from deathwatch._engine.timeutil import UTC
from deathwatch._operator.instruments import gcpauses
from deathwatch._operator.passes.pods import PodPass
from deathwatch._operator.passes.publishing import Liveness, StatusPass
from deathwatch._operator.passes.retention import RetentionPass
from deathwatch._operator.passes.shielding import ShieldPass

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
