"""Taking over the writing: the pass for the input "this replica leads now" (its Leadership
tells it, a follower as the writer's and delivery's loops are) and "this shard owns these
slots now" (its Ownership tells it). What a crash or the old leader may have left unsaid is
said again: every SandboxDead Event of the last 50 minutes, and each verdict the API holds
otherwise than this replica judges it. No I/O: the writer sends.
"""

from __future__ import annotations

import structlog

from deathwatch._operator.delivery.outbox import Deliveries
from deathwatch._operator.passes.publishing import StatusPass
from deathwatch._operator.passes.verdict_watch import VerdictPass
from deathwatch._operator.writing.writer import Writer

log = structlog.get_logger("deathwatch.controller")


class Takeover:
    """The writer's follower of its Leadership (leadership/group.py)."""

    def __init__(self, writer: Writer, deliveries: Deliveries, status: StatusPass,
                 verdicts: VerdictPass) -> None:  # fmt: skip
        self.writer, self.deliveries = writer, deliveries
        self.status, self.verdicts = status, verdicts

    def lead(self, term: int | None) -> None:
        """The Events first (a 409 says one was posted), then what this replica owes."""
        events = self.status.unannounced_deaths()
        if events:
            log.info("reconciling sandboxdead events", count=len(events))
            self.writer.reconcile(events)
        self.verdicts.republish(self.writer.take_over(term))

    def standby(self) -> None:
        self.writer.stood_down()

    def gained(self, slots: frozenset[int]) -> None:
        """Sharded: these slots are this shard's to write from now on: what it owes there is
        said again, and their deliveries may go."""
        self.verdicts.republish(self.writer.gained(slots))
        self.deliveries.wake.set()
