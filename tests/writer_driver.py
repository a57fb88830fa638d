"""The writer driven in process, for its tests and the controller's core: its workers as
tasks against the fake API (fakeapi.FakeApi) and a test-driven retry timer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from deathwatch._api.resources import EventReason
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.judging.documents import PodEvent
from deathwatch._operator.writing.writer import Writer
from tests.fakeapi import FakeApi, FakeTimers

NS = "sandboxes"


def dead_event(name: str) -> PodEvent:
    return PodEvent(NS, name, f"uid-{name}", EventReason.SANDBOX_DEAD, "Sandbox dead")


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
    writer = Writer(api, Metrics(), schedule=timers)
    async with workers(writer, n):
        yield writer, api, timers


async def settle(writer: Writer) -> None:
    await asyncio.wait_for(writer.idle(), 5)


async def until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not check():  # noqa: ASYNC110 - state other tasks change, waited on with a deadline
            await asyncio.sleep(0)
