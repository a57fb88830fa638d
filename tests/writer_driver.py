"""The writer driven in process, for its tests and the controller's core: its workers as
tasks against the fake API (fakeapi.FakeApi) and a test-driven retry timer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from deathwatch._api.resources import EventReason
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.leadership.group import Leadership
from deathwatch._operator.reporting.pod_events import KubeEvent
from deathwatch._operator.writing.desired import ObjectKey
from deathwatch._operator.writing.writer import Writer
from tests.fakeapi import FakeApi, FakeTimers

NS = "sandboxes"


def dead_event(name: str) -> KubeEvent:
    return KubeEvent(NS, name, f"uid-{name}", EventReason.SANDBOX_DEAD, "Sandbox dead")


def the_only_writer(metrics: Metrics) -> Leadership:
    """The Leadership of a replica without election: it leads from the start."""
    return Leadership(metrics, "test", elected=False)


def standing_by(metrics: Metrics, fence: Callable[[], bool] | None = None) -> Leadership:
    """A replica's Leadership that waits to be elected (`fence`: the elector's may_write)."""
    leadership = Leadership(metrics, "test", elected=True)
    if fence is not None:
        leadership.fenced_by(fence)
    return leadership


def lead(writer: Writer, term: int | None = None) -> list[ObjectKey]:
    """What the elector does when it takes the Lease, for the writer alone: it leads, and
    returns what it owes (passes/takeover.py says each again)."""
    writer.leadership.lead(term, "test: took the lease")
    return writer.take_over(term)


def fence(writer: Writer) -> None:
    """The elector's renew deadline passed."""
    writer.leadership.standby("test: fenced")


@asynccontextmanager
async def workers(writer: Writer, n: int = 4) -> AsyncIterator[Writer]:
    """The writer's workers as tasks, for as long as the test needs them."""
    tasks = [asyncio.create_task(writer.work()) for _ in range(n)]
    try:
        yield writer
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@asynccontextmanager
async def running(n: int = 4) -> AsyncIterator[tuple[Writer, FakeApi, FakeTimers]]:
    api, timers = FakeApi(), FakeTimers()
    writer = Writer(
        api, (metrics := Metrics()), schedule=timers, leadership=the_only_writer(metrics)
    )
    async with workers(writer, n):
        yield writer, api, timers


async def settle(writer: Writer) -> None:
    await asyncio.wait_for(writer.idle(), 5)


async def until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not check():  # noqa: ASYNC110 - state other tasks change, waited on with a deadline
            await asyncio.sleep(0)
