"""Every long-running task of the operator runs under supervision: a crash is logged with its
traceback and counted, and the task starts again after a capped backoff.

A crash here is our own code failing, never a dependency: the loops catch and count the
errors of the calls they make (API down, timeouts, 5xx), so an outage never crashes one.
A task that crashes again and again is a controller that cannot do its job; after
FAILING_AFTER crashes in a row (none of its runs lasting HEALTHY_RUN) it is reported
failing, and /healthz fails, so the kubelet restarts the process: a fresh process is the
one remedy left for a bug that a retry does not cure. See docs/adr/0009.

One-shot work started from a callback (a DeathWatch's pods adopted, a node's exit judged) is
`spawn`ed: held until it ends (asyncio keeps only a weak reference to a task), counted while
in flight, its failure a log line and `deathwatch_handler_errors_total{handler=name}`, and
cancelled with the rest on `stop`.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import structlog

from deathwatch._kube import backoff
from deathwatch._operator.instruments.metrics import Metrics

log = structlog.get_logger("deathwatch.supervisor")

FAILING_AFTER = 5  # crashes in a row
HEALTHY_RUN = 60.0  # seconds a run must last to reset the count

TaskFactory = Callable[[], Coroutine[Any, Any, None]]


@dataclass
class TaskState:
    restarts: int = 0  # since start, for people and tests
    crashes_in_a_row: int = 0
    last_error: str | None = None


@dataclass
class Supervisor:
    metrics: Metrics
    backoff: tuple[float, ...] = backoff.RESTART
    failing_after: int = FAILING_AFTER
    healthy_run: float = HEALTHY_RUN
    tasks: dict[str, TaskState] = field(default_factory=dict)
    _running: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _spawned: dict[str, set[asyncio.Task[None]]] = field(default_factory=dict)

    def start(self, name: str, factory: TaskFactory) -> None:
        """Run `factory()` as task `name`, again after each crash (and after a return, which a
        loop that should run forever must not do either)."""
        self.tasks[name] = TaskState()
        self.metrics.task_restarts.labels(name).inc(0)  # the series exists from the start
        self._running[name] = asyncio.create_task(self._supervise(name, factory), name=name)

    async def _supervise(self, name: str, factory: TaskFactory) -> None:
        state = self.tasks[name]
        while True:
            started = time.monotonic()
            try:
                await factory()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error: Exception = exc
            else:
                error = RuntimeError(f"task {name} returned; it must run until cancelled")
            if time.monotonic() - started >= self.healthy_run:
                state.crashes_in_a_row = 0
            state.crashes_in_a_row += 1
            state.restarts += 1
            state.last_error = f"{type(error).__name__}: {error}"[:300]
            delay = backoff.delay(self.backoff, state.crashes_in_a_row)
            self.metrics.task_restarts.labels(name).inc()
            log.error(
                "task crashed, restarting",
                task=name,
                crashes_in_a_row=state.crashes_in_a_row,
                restart_in=delay,
                exc_info=error,
            )
            await asyncio.sleep(delay)

    def spawn(self, name: str, work: Coroutine[Any, Any, None], failed: str) -> None:
        """Run `work` once, as one of the tasks `name`; if it raises, `failed` is logged
        with the traceback and counted as a handler error of `name`."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        held = self._spawned.setdefault(name, set())
        held.add(task)
        task.add_done_callback(functools.partial(self._spawned_done, name, failed))

    def _spawned_done(self, name: str, failed: str, task: asyncio.Task[None]) -> None:
        self._spawned[name].discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.metrics.handler_errors.labels(name).inc()
            log.error(failed, task=name, exc_info=task.exception())

    def in_flight(self, name: str) -> int:
        """How many tasks `name` are running."""
        return len(self._spawned.get(name, ()))

    async def finished(self, name: str) -> None:
        """Return once every task `name` spawned so far has ended (each failure said)."""
        await asyncio.gather(*self._spawned.get(name, ()), return_exceptions=True)

    def failing(self) -> dict[str, str]:
        """Tasks that kept crashing, with their last error: what /healthz reports."""
        return {
            name: state.last_error or ""
            for name, state in self.tasks.items()
            if state.crashes_in_a_row >= self.failing_after
        }

    async def cancel(self, *names: str) -> None:
        """Stop these tasks for good (not restarted), and wait until each has ended: shutdown
        ends the leader election before the Lease is released, so no renewal of its own can
        land after the release."""
        for name in names:
            task = self._running.pop(name, None)
            if task is not None:
                task.cancel()
                await _ended(name, task)

    async def stop(self) -> None:
        """Cancel every task and wait for each; an error on the way out is logged, not lost."""
        spawned = [t for held in self._spawned.values() for t in held]
        for task in [*self._running.values(), *spawned]:
            task.cancel()
        if spawned:  # one-shot work: cancelled is its end, a failure was said by its callback
            await asyncio.gather(*spawned, return_exceptions=True)
        for name, task in self._running.items():
            await _ended(name, task)
        self._running.clear()


async def _ended(name: str, task: asyncio.Task[None]) -> None:
    """Wait for a cancelled task: cancelled is its end; an error on the way out is logged."""
    try:
        await task
    except asyncio.CancelledError:
        pass
    except Exception:
        log.exception("task failed while stopping", task=name)
