"""The watch-stream liveness hook sits where kopf's streams actually pass: if kopf moves or
renames what it wraps, these fail (and /readyz would say the state is unknown, not lie)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kopf._cogs.clients import watching

from deathwatch._operator import streams
from deathwatch._operator.metrics import Metrics


def test_kopf_calls_the_function_we_wrap_through_its_module() -> None:
    # continuous_watch looks watch_objs up in its module at each (re)connection, so replacing
    # the module attribute puts us on every stream, bookmarks included
    assert "watch_objs(" in inspect.getsource(watching.continuous_watch)
    params = inspect.signature(watching.watch_objs).parameters
    assert {"resource", "namespace", "since", "settings"} <= set(params)


@pytest.fixture
def fake_kopf_stream(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    delivered: list[dict[str, Any]] = []

    async def watch_objs(**kwargs: Any) -> AsyncIterator[dict[str, Any]]:
        for item in delivered:
            yield item

    monkeypatch.setattr(watching, "watch_objs", watch_objs)
    return delivered


class Pods:
    plural = "pods"


async def test_events_and_bookmarks_both_count_as_life(fake_kopf_stream: list[Any]) -> None:
    activity = streams.StreamActivity(Metrics(), started=time.monotonic() - 1000)
    assert activity.fresh(["pods"]) is None  # not installed: unknown, not stale
    assert streams.install(activity)
    assert activity.fresh(["pods"]) is False  # installed, nothing delivered for 1000 s
    fake_kopf_stream.extend([{"type": "BOOKMARK", "object": {}}, {"type": "ADDED"}])
    wrapped: Any = watching.watch_objs  # our wrapper; kopf passes the real arguments
    got = [raw async for raw in wrapped(resource=Pods())]
    assert [g["type"] for g in got] == ["BOOKMARK", "ADDED"]  # passed through untouched
    metrics = activity.metrics
    assert metrics is not None
    assert metrics.relists.labels("pods")._value.get() == 0
    fake_kopf_stream[:] = [{"type": "ERROR", "object": {"kind": "Status", "code": 410}}]
    assert len([raw async for raw in wrapped(resource=Pods())]) == 1
    assert metrics.relists.labels("pods")._value.get() == 1  # counted, passed on to kopf
    assert activity.fresh(["pods"]) is True
    assert activity.age("pods") < 1
    assert activity.fresh(["pods", "deathwatches"]) is False  # one stale stream is enough
    assert activity.metrics is not None
    assert activity.metrics.watch_activity.labels("pods")._value.get() > 0
    assert activity.metrics.watch_connections.labels("pods")._value.get() == 2
    # installing again (a second App in one process) does not wrap twice
    assert streams.install(activity)
    assert getattr(watching.watch_objs, "_deathwatch_hook", False)
    await asyncio.sleep(0)


def test_staleness_is_measured_from_start_until_the_first_delivery() -> None:
    activity = streams.StreamActivity(installed=True)
    assert activity.fresh(["pods"], stale_after=90) is True
    activity.started -= 100
    assert activity.fresh(["pods"], stale_after=90) is False
    activity.seen("pods")
    assert activity.fresh(["pods"], stale_after=90) is True
