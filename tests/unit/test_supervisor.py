"""The supervisor's one-shot work: held while it runs, a failure said and counted, cancelled
on stop."""

from __future__ import annotations

import asyncio

import pytest
import structlog

from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.instruments.supervisor import Supervisor


def errors(metrics: Metrics, name: str) -> float:
    value = metrics.registry.get_sample_value("deathwatch_handler_errors_total", {"handler": name})
    return value or 0.0


async def test_spawned_work_is_counted_while_it_runs_and_a_failure_is_said_and_counted() -> None:
    metrics = Metrics()
    supervisor = Supervisor(metrics)
    release = asyncio.Event()

    async def waits() -> None:
        await release.wait()

    async def fails() -> None:
        await release.wait()
        raise ValueError("the pod's namespace is gone")

    with structlog.testing.capture_logs() as logs:
        supervisor.spawn("adopt", waits(), "not adopted")
        supervisor.spawn("adopt", fails(), "not adopted")
        assert supervisor.in_flight("adopt") == 2
        assert supervisor.in_flight("node_exit") == 0
        release.set()
        async with asyncio.timeout(5):
            await supervisor.finished("adopt")
        assert supervisor.in_flight("adopt") == 0
    assert errors(metrics, "adopt") == 1
    [said] = [e for e in logs if e["event"] == "not adopted"]
    assert said["task"] == "adopt" and said["log_level"] == "error"
    assert isinstance(said["exc_info"], ValueError)


async def test_stop_cancels_spawned_work_without_counting_it_failed() -> None:
    metrics = Metrics()
    supervisor = Supervisor(metrics)
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    supervisor.spawn("node_exit", forever(), "not judged")
    await asyncio.sleep(0)  # it starts
    async with asyncio.timeout(5):
        await supervisor.stop()
    assert cancelled.is_set()
    assert supervisor.in_flight("node_exit") == 0
    assert errors(metrics, "node_exit") == 0


def test_spawn_needs_a_running_loop() -> None:
    async def nothing() -> None:
        return None

    work = nothing()
    with pytest.raises(RuntimeError):
        Supervisor(Metrics()).spawn("adopt", work, "never")
    work.close()
