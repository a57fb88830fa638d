"""The metrics page (deathwatch._kube.scrape): rendered off the event loop, shared by the
scrapes of one second, one render at a time with a bounded queue, and refused at once past
the scraper's own timeout."""

from __future__ import annotations

import asyncio
import threading

from deathwatch._kube.scrape import MARGIN, Scrapes, deadline_of


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def test_scrapes_within_a_second_share_one_render_made_off_the_loop() -> None:
    threads: list[str] = []
    clock = Clock()

    def render() -> bytes:
        threads.append(threading.current_thread().name)
        return b"# metrics\n"

    scrapes = Scrapes(render, reuse=1.0, waiting=200, clock=clock)
    pages = await asyncio.gather(*(scrapes.page(5) for _ in range(100)))
    assert set(pages) == {b"# metrics\n"} and scrapes.renders == 1
    assert threads and threading.main_thread().name not in threads
    clock.t += 0.5
    await scrapes.page(5)
    assert scrapes.renders == 1
    clock.t += 0.6
    await scrapes.page(5)
    assert scrapes.renders == 2


async def test_past_the_queue_and_past_the_deadline_a_scrape_is_refused() -> None:
    go = threading.Event()

    def slow() -> bytes:
        go.wait(10)
        return b"late\n"

    scrapes = Scrapes(slow, waiting=2)
    first = asyncio.create_task(scrapes.page(5))
    second = asyncio.create_task(scrapes.page(5))
    async with asyncio.timeout(5):
        while scrapes._waiters < 2:  # noqa: ASYNC110 - both queued, polled with a deadline
            await asyncio.sleep(0)
    assert await scrapes.page(5) is None  # a third: refused at once
    go.set()
    assert await first == b"late\n" and await second == b"late\n"
    assert scrapes.refused == 1


async def test_a_scrape_waits_no_longer_than_its_deadline() -> None:
    go = threading.Event()

    def slow() -> bytes:
        go.wait(10)
        return b"x\n"

    scrapes = Scrapes(slow, waiting=5)
    assert await scrapes.page(0.05) is None
    go.set()
    assert await scrapes.page(5) == b"x\n"  # the render went on: the next scrape has it


def test_the_scrapers_timeout_header_bounds_the_wait() -> None:
    assert deadline_of("2", 20.0) == 2 - MARGIN
    assert deadline_of(None, 20.0) == 20 - MARGIN
    assert deadline_of("300", 20.0) == 20 - MARGIN  # never longer than ours
    for bad in ("nan", "-1", "0", "soon"):
        assert deadline_of(bad, 20.0) == 20 - MARGIN
    assert deadline_of("0.1", 20.0) == 0.05
