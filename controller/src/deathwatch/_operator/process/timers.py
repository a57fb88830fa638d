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
from deathwatch._operator.memory.core import Core
from deathwatch._operator.passes import pods, retention, shielding
from deathwatch._operator.passes.publishing import Liveness, publish

REFREEZE_INTERVAL = 600.0  # seconds: sandboxes that arrived since the last freeze join it


async def suspects(core: Core) -> None:
    """Judge each Suspect when its window closes; sleep until the next one, or until a new
    deadline wakes the loop."""
    while True:
        core.wake.clear()
        pods.expire(core)
        deadline = pods.next_deadline(core)
        timeout = (
            None if deadline is None else max(0.0, (deadline - datetime.now(UTC)).total_seconds())
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(core.wake.wait(), timeout)


async def publishing(core: Core, liveness: Liveness, interval: float,
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
            retention.retire(core)
        shielding.reshield(core)  # claims go stale with no event: judged on the clock
        publish(core, liveness)
